"""Statistics: what an index holds (``describe``), and class distributions before and after
balancing (``report``). See docs/balancing.md, "Statistics". Pictures of a dataset and of
predictions (``show``, ``detloader show``) are imported by their module path.
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
