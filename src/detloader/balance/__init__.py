"""Balance: which images an epoch draws, so that rare classes are seen enough.

A detection image holds objects of several classes, so a weight goes first to each group
(``groups``: an object class, an image class, an attribute value or a product of those) and
then to each image (``weights``: :func:`sample_weights`, strategy strings). The samplers, all
seeded per epoch, distributed (rank ``r`` of ``W`` takes positions ``r::W`` of one global
draw) and resumable (``state_dict`` / ``load_state_dict``; the contract is in ``base``):

* :class:`WeightedSampler` (``weighted``): indices with probability ``w_i / sum(w)``, exact
  beyond torch's 2**24 categories; the default of every weight strategy (``inverse``,
  ``sqrt``, ``power:P``, ``effective``, explicit ``{group: weight}``).
* :class:`RepeatFactorSampler` (``weighted``): LVIS repeat factors, each image ``floor`` or
  ``ceil`` of its factor times per epoch: when every image should still be seen once.
* :class:`ClassAwareSampler` (``class_aware``): classes round-robin, then an image of the
  class: the flattest class distribution, for very many classes.
* :class:`BalancedBatchSampler` (``class_aware``): P classes x K images per batch, for metric
  learning and batch-level balance (a ``batch_sampler``).
* :class:`DistributedSamplerWrapper` (``wrapper``): any other sampler (torch's own) made
  distributed.
* :class:`PartnerSampler` (``wrapper``): ``[i, p1, ..., pk]`` groups from one sampler, for
  mosaic and mixup whose partners follow the same balance.
* :class:`AspectRatioBatchSampler` (``wrapper``): batches of similar aspect ratio from any
  sampler's order, so that wide and tall images are not padded to one square.

:func:`make_balanced_sampler` (``weights``) turns a strategy string into its sampler (what
``make_loader(balance=...)`` uses); ``alias`` is the exact alias table behind WeightedSampler.

The weights and strategies load at once; the samplers (torch) load on first use, as in
:mod:`detloader`, so that the CLI's statistics stay quick: name -> module.
"""

from detloader.balance.groups import Groups, balance_groups, class_members, group_counts
from detloader.balance.weights import (
    BALANCE_CHOICES,
    DEFAULT_BETA,
    DEFAULT_THRESHOLD,
    STRATEGIES,
    image_weights,
    make_balanced_sampler,
    parse_strategy,
    repeat_factors,
    sample_weights,
    strategy_weights,
)

_LAZY = {
    "AspectRatioBatchSampler": "detloader.balance.wrapper",
    "BalancedBatchSampler": "detloader.balance.class_aware",
    "ClassAwareSampler": "detloader.balance.class_aware",
    "DistributedSamplerWrapper": "detloader.balance.wrapper",
    "PartnerSampler": "detloader.balance.wrapper",
    "RepeatFactorSampler": "detloader.balance.weighted",
    "WeightedSampler": "detloader.balance.weighted",
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
