"""Balance: which images an epoch draws, so that rare classes are seen enough.

``groups`` gives each object or image a group, ``weights`` turns groups into image weights (pure
functions of counts); the samplers live in ``weighted`` (with ``make_balanced_sampler``, a
strategy string as its sampler), ``class_aware`` and ``wrappers``, their shared contract (seed,
epoch, ranks, resume) in ``base``, the alias table in ``alias``; ``label_lists`` balances from
one class list per image (Ultralytics). The samplers (torch) load on first use, so that the
CLI's statistics stay quick. See docs/balancing.md.
"""

from detloader.balance.groups import Groups, balance_groups, class_members, group_counts
from detloader.balance.weights import (
    BALANCE_CHOICES,
    DEFAULT_BETA,
    DEFAULT_THRESHOLD,
    STRATEGIES,
    image_weights,
    parse_strategy,
    repeat_factors,
    sample_weights,
    strategy_weights,
)

_LAZY = {
    "AspectRatioBatchSampler": "detloader.balance.wrappers",
    "AutoEpochSampler": "detloader.balance.label_lists",
    "BalancedBatchSampler": "detloader.balance.class_aware",
    "ClassAwareSampler": "detloader.balance.class_aware",
    "DistributedSamplerWrapper": "detloader.balance.wrappers",
    "PartnerSampler": "detloader.balance.wrappers",
    "RepeatFactorSampler": "detloader.balance.weighted",
    "WeightedSampler": "detloader.balance.weighted",
    "labels_index": "detloader.balance.label_lists",
    "labels_sampler": "detloader.balance.label_lists",
    "make_balanced_sampler": "detloader.balance.weighted",
    "members_from_labels": "detloader.balance.class_aware",
}


def __getattr__(name: str) -> object:
    if name in _LAZY:
        import importlib  # lazy: torch loads with the samplers

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'detloader.balance' has no attribute {name!r}")


__all__ = [
    "AspectRatioBatchSampler", "AutoEpochSampler", "BALANCE_CHOICES", "DEFAULT_BETA", "DEFAULT_THRESHOLD", "STRATEGIES",
    "BalancedBatchSampler", "ClassAwareSampler", "DistributedSamplerWrapper", "Groups",
    "PartnerSampler", "RepeatFactorSampler",
    "WeightedSampler", "balance_groups", "class_members", "group_counts", "image_weights",
    "labels_index", "labels_sampler", "make_balanced_sampler", "members_from_labels", "parse_strategy",
    "repeat_factors", "sample_weights", "strategy_weights",
]
