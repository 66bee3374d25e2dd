"""Raw vs balanced bars of a :class:`~detloader.stats.report.BalanceReport` (matplotlib,
the ``plot`` extra)."""

from __future__ import annotations

import os

import numpy as np

from detloader._plotting import new_figure
from detloader.stats.report import BalanceReport

__all__ = ["plot_balance"]


def plot_balance(report: BalanceReport, path: str | os.PathLike[str]) -> None:
    """Raw vs balanced (expected) bars per group, and the real draw as markers; a PNG at
    ``path``. Needs matplotlib (the ``plot`` extra); no pyplot state is touched."""
    names = list(report.names)
    x = np.arange(len(names))
    fig = new_figure(figsize=(max(6.0, 0.6 * len(names) + 2), 4.0), dpi=100)
    ax = fig.add_subplot(1, 1, 1)
    ax.bar(x - 0.2, report.raw, width=0.4, label="raw (each image once)")
    ax.bar(x + 0.2, report.expected, width=0.4, label=f"balanced: {report.strategy} (expected)")
    if report.drawn is not None:
        ax.plot(x + 0.2, report.drawn, "k_", markersize=14, label=f"one draw (seed {report.seed})")
    ax.set_xticks(x)
    ax.set_xticklabels(names, rotation=30 if len(names) > 6 else 0, ha="right" if len(names) > 6 else "center")
    ax.set_ylabel(f"{report.unit} per epoch")
    ax.set_title(f"by {', '.join(report.by)}")
    ax.legend()
    fig.tight_layout()
    fig.savefig(os.fspath(path), format="png")
