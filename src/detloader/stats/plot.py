"""Raw vs balanced bars of a :class:`~detloader.stats.report.BalanceReport` (matplotlib,
the ``plot`` extra)."""

from __future__ import annotations

import os
from typing import Literal

import numpy as np

from detloader._plotting import new_figure
from detloader.errors import DetloaderValueError
from detloader.stats.describe import imbalance_ratio
from detloader.stats.report import BalanceReport

#: ``log="auto"`` draws a log axis when the largest bar is more than this many times the
#: smallest non-zero one: on a linear axis such a rare group is a bar of a pixel or two.
LOG_AUTO_RATIO = 20.0

LogScale = bool | Literal["auto"]


def use_log_scale(report: BalanceReport, log: LogScale = "auto") -> bool:
    """Whether :func:`plot_balance` draws ``report`` on a log axis: ``True`` / ``False`` as
    given; ``"auto"``: when the largest / smallest non-zero bar (raw or balanced) is over
    :data:`LOG_AUTO_RATIO`."""
    if log == "auto":
        ratio = imbalance_ratio(np.concatenate([report.raw, report.expected]))
        return ratio is not None and ratio > LOG_AUTO_RATIO
    if isinstance(log, bool):
        return log
    raise DetloaderValueError(f"log={log!r} is not one of True, False, 'auto'")


def plot_balance(report: BalanceReport, path: str | os.PathLike[str], log: LogScale = "auto") -> None:
    """Raw vs balanced (expected) bars per group, and the real draw as markers; a PNG at
    ``path``. ``log``: a log y axis, ``True``, ``False`` or ``"auto"`` (see
    :func:`use_log_scale`). Needs matplotlib (the ``plot`` extra); no pyplot state is touched."""
    logarithmic = use_log_scale(report, log)
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
    ax.set_ylabel(f"{report.unit} per epoch" + (" (log scale)" if logarithmic else ""))
    if logarithmic:
        ax.set_yscale("log", nonpositive="clip")
        heights = np.concatenate([report.raw, report.expected])
        heights = heights[heights > 0]
        if len(heights):
            ax.set_ylim(bottom=heights.min() / 2)
    ax.set_title(f"by {', '.join(report.by)}")
    ax.legend()
    fig.tight_layout()
    fig.savefig(os.fspath(path), format="png")
