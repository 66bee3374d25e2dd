"""make_balanced_sampler: a strategy string (or weights, or a sampler) -> the sampler.

Strategy strings are parsed once, by :func:`detloader.balance.weights.parse_strategy`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from torch.utils.data import Sampler

from detloader.annotations.index import AnnotationIndex
from detloader.balance.class_aware import ClassAwareSampler
from detloader.balance.groups import ByKey
from detloader.balance.repeat_factor import RepeatFactorSampler
from detloader.balance.weighted import WeightedSampler
from detloader.balance.weights import DEFAULT_THRESHOLD, STRATEGIES, parse_strategy, sample_weights
from detloader.errors import DetloaderValueError

#: Names make_balanced_sampler understands (the strategies of weights.py plus class_aware).
BALANCE_CHOICES: tuple[str, ...] = (*STRATEGIES, "class_aware")


def make_balanced_sampler(
    index: AnnotationIndex,
    balance: str | Mapping[Any, float] | Sampler[Any],
    *,
    by: ByKey = "class",
    seed: int = 0,
    num_samples: int | None = None,
    rank: int | None = None,
    world_size: int | None = None,
) -> Sampler[Any]:
    """The sampler behind ``make_loader(balance=...)``.

    ``balance`` is a ready sampler (returned unchanged), a ``{group: weight}`` mapping
    (explicit weights), or a strategy name, optionally with its parameter after a colon:
    ``"inverse"``, ``"sqrt"``, ``"power:0.3"``, ``"effective"`` / ``"effective:0.99"`` (beta),
    ``"repeat_factor"`` / ``"repeat_factor:0.1"`` (threshold), ``"class_aware"``.

    Weight strategies give a :class:`WeightedSampler` with replacement of ``num_samples``
    draws per epoch (default ``len(index)``); ``repeat_factor`` a :class:`RepeatFactorSampler`
    (``num_samples`` must be None: the factors set the length); ``class_aware`` a
    :class:`ClassAwareSampler`.
    """
    if isinstance(balance, Sampler):
        return balance
    common = {"seed": seed, "rank": rank, "world_size": world_size}
    if isinstance(balance, Mapping):
        weights = sample_weights(index, by, "explicit", class_weights=balance)
        return WeightedSampler(weights, num_samples or len(index), **common)
    if not isinstance(balance, str):
        raise DetloaderValueError(
            f"balance={balance!r} must be a strategy name, a {{group: weight}} mapping or a Sampler"
        )
    name, params = parse_strategy(balance)
    if name not in BALANCE_CHOICES:
        raise DetloaderValueError(f"balance={balance!r} is not one of {BALANCE_CHOICES}")
    if name == "explicit":
        raise DetloaderValueError("balance='explicit' needs the weights: pass balance={group: weight}")
    if name == "repeat_factor":
        if num_samples is not None:
            raise DetloaderValueError(
                f"num_samples={num_samples} with balance='repeat_factor': the repeat factors "
                "set the epoch length"
            )
        return RepeatFactorSampler.from_index(
            index, params.get("threshold", DEFAULT_THRESHOLD), by=by, **common
        )
    if name == "class_aware":
        return ClassAwareSampler.from_index(index, by, num_samples=num_samples, **common)
    weights = sample_weights(index, by, name, **params)  # type: ignore[arg-type]
    return WeightedSampler(weights, num_samples or len(index), **common)
