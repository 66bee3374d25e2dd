"""Statistics: what an index holds, and class distributions before and after balancing.

``describe`` (:func:`dataset_stats`: objects and images per class, image classes, attributes,
landmark visibility, box-size quantiles, imbalance ratios) ; ``report`` (:func:`balance_report`:
raw per epoch beside the expectation under a balancing strategy and one real draw, and a
warning when one image would repeat many times per epoch; :func:`plot_balance`: raw vs
balanced bars, on a log axis when a group is rare; matplotlib optional).
"""

from detloader.stats.describe import QUANTILES, dataset_stats, imbalance_ratio
from detloader.stats.report import (
    LOG_AUTO_RATIO,
    REPEAT_WARNING,
    BalanceReport,
    EmptyIndexError,
    Unit,
    balance_report,
    default_unit,
    group_totals,
    plot_balance,
    summary_rows,
    use_log_scale,
)

__all__ = [
    "LOG_AUTO_RATIO", "QUANTILES", "REPEAT_WARNING", "BalanceReport",
    "EmptyIndexError", "Unit", "balance_report",
    "dataset_stats", "default_unit", "group_totals", "imbalance_ratio", "plot_balance",
    "summary_rows", "use_log_scale",
]
