"""Balance: which images an epoch draws, so that rare classes are seen enough.

``groups`` (which group each object or image is in) -> ``weights`` (pure functions: per-group
weights, per-image weights, repeat factors, strategy strings) -> the samplers, one per module:
``weighted`` (alias method, exact beyond 2**24),
``repeat_factor`` (LVIS), ``class_aware`` (round-robin over classes), ``batch`` (P x K),
``wrapper`` (any sampler, distributed), ``partners`` (index groups for mosaic and mixup from one
sampler), ``aspect`` (batches of similar aspect ratio from any sampler's order) -> ``factory``
(``make_balanced_sampler``: a strategy string -> its sampler). ``base`` holds their shared
contract (seed, epoch, rank, resume),
``distributed`` the rank arithmetic, ``alias`` the exact alias table, ``checks`` the argument
checks.

The weights load at once; the samplers (torch) load on first use, as in :mod:`detloader`, so
that the CLI's statistics stay quick: name -> module.
"""

from detloader.balance.groups import Groups, balance_groups, class_members, group_counts
from detloader.balance.weights import (
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
    "AspectRatioBatchSampler": "detloader.balance.aspect",
    "BALANCE_CHOICES": "detloader.balance.factory",
    "BalancedBatchSampler": "detloader.balance.batch",
    "ClassAwareSampler": "detloader.balance.class_aware",
    "DistributedSamplerWrapper": "detloader.balance.wrapper",
    "PartnerSampler": "detloader.balance.partners",
    "RepeatFactorSampler": "detloader.balance.repeat_factor",
    "WeightedSampler": "detloader.balance.weighted",
    "make_balanced_sampler": "detloader.balance.factory",
    "members_from_labels": "detloader.balance.class_aware",
}


def __getattr__(name: str) -> object:
    if name in _LAZY:
        import importlib  # lazy: torch loads with the samplers

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'detloader.balance' has no attribute {name!r}")


__all__ = [
    "AspectRatioBatchSampler", "BALANCE_CHOICES", "DEFAULT_BETA", "DEFAULT_THRESHOLD", "STRATEGIES",
    "BalancedBatchSampler", "ClassAwareSampler", "DistributedSamplerWrapper", "Groups",
    "PartnerSampler", "RepeatFactorSampler",
    "WeightedSampler", "balance_groups", "class_members", "group_counts", "image_weights",
    "make_balanced_sampler", "members_from_labels", "parse_strategy", "repeat_factors",
    "sample_weights", "strategy_weights",
]
