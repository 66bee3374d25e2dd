"""plot_balance: raw vs balanced bars as a PNG."""

from __future__ import annotations

from balance_helpers import LABELS, tiny_index

from detloader.stats import balance_report, plot_balance


def test_plot_writes_a_png(tmp_path):
    idx = tiny_index(LABELS)
    out = tmp_path / "bars.png"
    plot_balance(balance_report(idx, "sqrt"), out)
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
