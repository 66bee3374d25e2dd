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
