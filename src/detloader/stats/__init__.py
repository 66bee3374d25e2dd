"""Statistics: what an index holds (``describe``), and class distributions before and after
balancing (``report``). See docs/balancing.md, "Statistics". Pictures of a dataset and of
predictions (``show``, ``detloader show``) are imported by their module path.
"""

from detloader.stats.describe import (
    COMMON_MAX_IMAGES,
    FREQUENCIES,
    QUANTILES,
    RARE_MAX_IMAGES,
    class_frequency,
    dataset_stats,
    frequency_groups,
    frequency_summary,
    imbalance_ratio,
    training_frequency,
)
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
    "COMMON_MAX_IMAGES", "FREQUENCIES", "LOG_AUTO_RATIO", "QUANTILES", "RARE_MAX_IMAGES", "REPEAT_WARNING",
    "BalanceReport", "EmptyIndexError", "Unit", "balance_report", "class_frequency", "dataset_stats",
    "default_unit", "frequency_groups", "frequency_summary", "group_totals", "imbalance_ratio", "plot_balance",
    "summary_rows", "training_frequency", "use_log_scale",
]
