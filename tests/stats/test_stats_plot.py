"""plot_balance: raw vs balanced bars as a PNG."""

from __future__ import annotations

import pytest
from balance_helpers import LABELS, tiny_index

from detloader.stats import LOG_AUTO_RATIO, balance_report, plot_balance, use_log_scale


def test_plot_writes_a_png(tmp_path):
    idx = tiny_index(LABELS)
    out = tmp_path / "bars.png"
    plot_balance(balance_report(idx, "sqrt"), out)
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_log_scale_auto_follows_the_imbalance(tmp_path):
    mild = balance_report(tiny_index(LABELS), "sqrt")  # bars 1 to 6: linear
    rare = balance_report(tiny_index([[0]] * 60 + [[1]]), "sqrt")  # raw 60 : 1
    assert not use_log_scale(mild) and use_log_scale(rare)
    assert use_log_scale(mild, True) and not use_log_scale(rare, False)
    assert LOG_AUTO_RATIO == 20
    with pytest.raises(ValueError, match="log='yes'"):
        use_log_scale(mild, "yes")
    plot_balance(rare, tmp_path / "log.png", log=True)
    assert (tmp_path / "log.png").read_bytes()[:4] == b"\x89PNG"


def test_many_groups_draw_the_largest_and_one_bar_for_the_rest(tmp_path, monkeypatch):
    """1,200 classes: 20 bars by raw count and a "1,180 more" bar summing the rest (1,200 bars
    side by side made a PNG 72,200 pixels wide)."""
    import numpy as np
    from balance_helpers import long_tail_index
    from PIL import Image

    from detloader.stats import report as report_module

    figures = []
    made = report_module.new_figure
    monkeypatch.setattr(report_module, "new_figure", lambda **kw: figures.append(made(**kw)) or figures[-1])
    report = balance_report(long_tail_index(3000, 1200, seed=4), "sqrt")
    plot_balance(report, tmp_path / "many.png")
    raw_bars, expected_bars = figures[0].axes[0].containers
    order = np.argsort(-report.raw, kind="stable")
    assert [b.get_height() for b in raw_bars] == [*report.raw[order[:20]], report.raw[order[20:]].sum()]
    assert np.isclose(sum(b.get_height() for b in expected_bars), report.expected.sum())
    labels = [t.get_text() for t in figures[0].axes[0].get_xticklabels()]
    assert labels[:2] == [report.names[order[0]], report.names[order[1]]] and labels[-1] == "1,180 more"
    assert Image.open(tmp_path / "many.png").size[0] < 2000
