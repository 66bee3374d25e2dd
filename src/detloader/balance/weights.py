"""Sampling weights from an index (pure functions), and the strategy strings that name them.

A weight is set per group (:mod:`detloader.balance.groups`) by :func:`strategy_weights`, then
per image by :func:`image_weights`; :func:`sample_weights` does both in one call and
:func:`make_balanced_sampler` turns a strategy into its sampler (torch loads then).
See docs/balancing.md, "Weights".
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Literal

import numpy as np

from detloader.annotations.index import MISSING, AnnotationIndex
from detloader.annotations.problems import did_you_mean
from detloader.balance.groups import PRODUCT_SEPARATOR, ByKey, Count, Groups, balance_groups, group_counts
from detloader.errors import DetloaderValueError

Strategy = Literal["inverse", "sqrt", "power", "effective", "repeat_factor", "explicit"]
STRATEGIES: tuple[str, ...] = ("inverse", "sqrt", "power", "effective", "repeat_factor", "explicit")
Aggregate = Literal["max", "mean", "sum"]
AGGREGATES: tuple[str, ...] = ("max", "mean", "sum")

#: Default LVIS repeat-factor threshold t (a group in fewer than 0.1 % of images is repeated).
DEFAULT_THRESHOLD = 0.001
#: Default beta of the effective-number strategy (Cui et al. 2019 use 0.9 ... 0.9999).
DEFAULT_BETA = 0.999
#: Names make_balanced_sampler understands (the strategies plus class_aware): the one list that
#: ``make_loader``, ``detloader stats`` / ``train``, TrainConfig, Lightning and Ultralytics check against.
BALANCE_CHOICES: tuple[str, ...] = (*STRATEGIES, "class_aware")
#: ``balance`` that means no balancing, as ``None`` does (``make_loader``, the trainer, Lightning).
NO_BALANCE = "none"


def strategy_weights(
    counts: np.ndarray,
    strategy: Strategy,
    *,
    power: float | None = None,
    beta: float = DEFAULT_BETA,
    class_weights: Mapping[str | int | tuple[str, ...], float] | None = None,
    names: Sequence[str] = (),
    image_fraction: np.ndarray | None = None,
    threshold: float = DEFAULT_THRESHOLD,
) -> np.ndarray:
    """float64 ``[G]``: the weight of each group from its count ``counts`` (int ``[G]``).

    Groups with count 0 get weight 0 (no unit to draw), except under ``explicit``.
    ``repeat_factor`` needs ``image_fraction`` (``f_c``, float ``[G]``); ``explicit`` needs
    ``class_weights`` keyed by group name, id or name tuple (groups not listed weigh 1.0) and
    ``names``. The scale of the result is arbitrary except for ``repeat_factor``.
    """
    counts = np.asarray(counts, dtype=np.float64)
    present = counts > 0
    out = np.zeros(len(counts), dtype=np.float64)
    if strategy in ("inverse", "sqrt", "power"):
        p = {"inverse": 1.0, "sqrt": 0.5}.get(strategy, power)
        if p is None:
            raise DetloaderValueError("strategy='power' needs power=EXPONENT (e.g. power=0.5 for sqrt)")
        if not math.isfinite(p):
            raise DetloaderValueError(f"power={p!r} must be a finite number")
        out[present] = counts[present] ** -float(p)
    elif strategy == "effective":
        if not 0.0 <= beta < 1.0:
            raise DetloaderValueError(f"beta={beta!r} must be in [0, 1)")
        if beta == 0.0:
            out[present] = 1.0
        else:
            # (1 - beta) / (1 - beta**n), with 1 - beta**n = -expm1(n log beta) for precision
            out[present] = (1.0 - beta) / -np.expm1(counts[present] * math.log(beta))
    elif strategy == "repeat_factor":
        if image_fraction is None:
            raise DetloaderValueError("strategy='repeat_factor' needs image_fraction (f_c per group)")
        _check_threshold(threshold)
        f = np.asarray(image_fraction, dtype=np.float64)
        has = f > 0
        out[has] = np.maximum(1.0, np.sqrt(threshold / f[has]))
    elif strategy == "explicit":
        out[:] = _explicit(class_weights, names, len(counts))
    else:
        raise DetloaderValueError(f"strategy={strategy!r} is not one of {STRATEGIES}")
    return out


def _check_threshold(threshold: float) -> None:
    if not (isinstance(threshold, (int, float)) and 0.0 < threshold <= 1.0):
        raise DetloaderValueError(f"threshold={threshold!r} must be in (0, 1] (a fraction of images)")


def _explicit(
    class_weights: Mapping[str | int | tuple[str, ...], float] | None, names: Sequence[str], g: int
) -> np.ndarray:
    if class_weights is None:
        raise DetloaderValueError("strategy='explicit' needs class_weights={group: weight}, e.g. {'masked': 2.0}")
    out = np.ones(g, dtype=np.float64)
    lookup = {name: i for i, name in enumerate(names)}
    for key, weight in class_weights.items():
        if isinstance(key, tuple):
            key = PRODUCT_SEPARATOR.join(key)
        if isinstance(key, (int, np.integer)) and not isinstance(key, bool):
            if not 0 <= int(key) < g:
                raise DetloaderValueError(f"class_weights: id {key} out of range 0..{g - 1}")
            i = int(key)
        elif key in lookup:
            i = lookup[key]
        else:
            raise DetloaderValueError(f"class_weights: {key!r} is not a group; groups: {list(names)}")
        w = float(weight)
        if not (math.isfinite(w) and w >= 0):
            raise DetloaderValueError(f"class_weights[{key!r}]={weight!r} must be finite and >= 0")
        out[i] = w
    return out


def image_weights(
    groups: Groups, group_weights: np.ndarray, *, aggregate: Aggregate = "max", background: float | None = None
) -> np.ndarray:
    """float64 ``[n]``: per image, the ``max``, ``mean`` or ``sum`` of its units' group weights.
    Images with no grouped unit get ``background``; ``None``: the smallest positive weight of
    the groups that occur (1.0 if none occurs)."""
    if aggregate not in AGGREGATES:
        raise DetloaderValueError(f"aggregate={aggregate!r} is not one of {AGGREGATES}")
    gw = np.asarray(group_weights, dtype=np.float64)
    if gw.shape != (len(groups.names),):
        raise DetloaderValueError(f"group_weights has shape {gw.shape}, expected ({len(groups.names)},)")
    n = groups.num_images
    valid = groups.ids != MISSING
    ids, img = groups.ids[valid], groups.image_of[valid]
    out = np.zeros(n, dtype=np.float64)
    has = np.zeros(n, dtype=bool)
    if len(ids):
        unit_w = gw[ids]
        # image_of is non-decreasing (objects are stored image by image), so runs are contiguous
        starts = np.flatnonzero(np.r_[True, img[1:] != img[:-1]])
        run_images = img[starts]
        if aggregate == "max":
            out[run_images] = np.maximum.reduceat(unit_w, starts)
        else:
            total = np.add.reduceat(unit_w, starts)
            if aggregate == "mean":
                total = total / np.diff(np.r_[starts, len(img)])
            out[run_images] = total
        has[run_images] = True
    if background is None:
        occurring = gw[np.bincount(ids, minlength=len(gw)) > 0]
        occurring = occurring[occurring > 0]
        background = float(occurring.min()) if len(occurring) else 1.0
    elif not (math.isfinite(background) and background >= 0):
        raise DetloaderValueError(f"background={background!r} must be finite and >= 0")
    out[~has] = background
    return out


def repeat_factors(
    index: AnnotationIndex,
    threshold: float = DEFAULT_THRESHOLD,
    *,
    by: ByKey = "class",
    aggregate: Aggregate = "max",
    background: float = 1.0,
) -> np.ndarray:
    """float64 ``[n]``: LVIS repeat factor of each image, ``>= 1`` (expected copies per epoch):
    ``r_c = max(1, sqrt(threshold / f_c))``, ``f_c`` the fraction of images containing group
    ``c``, aggregated over an image's groups; images with no group get ``background``."""
    _check_threshold(threshold)
    groups = balance_groups(index, by)
    f = group_counts(groups, "images") / max(len(index), 1)
    r = strategy_weights(f, "repeat_factor", image_fraction=f, threshold=threshold)
    return image_weights(groups, r, aggregate=aggregate, background=background)


def sample_weights(
    index: AnnotationIndex,
    by: ByKey = "class",
    strategy: Strategy = "inverse",
    *,
    count: Count = "objects",
    power: float | None = None,
    beta: float = DEFAULT_BETA,
    threshold: float = DEFAULT_THRESHOLD,
    class_weights: Mapping[str | int | tuple[str, ...], float] | None = None,
    aggregate: Aggregate = "max",
    background: float | None = None,
) -> np.ndarray:
    """float64 ``[len(index)]``: the sampling weight of every image, relative (a sampler
    normalises them) except for ``repeat_factor`` (expected copies per epoch). ``by`` is a
    balancing key (:mod:`detloader.balance.groups`); ``count``: what a group's count n counts
    for per-object keys, its ``"objects"`` or the ``"images"`` containing it; ``background``:
    the weight of images with no grouped unit (None: the smallest positive group weight
    that occurs, 1.0 for ``repeat_factor``). The strategies: docs/balancing.md, "Weights".
    """
    if strategy not in STRATEGIES:
        raise DetloaderValueError(f"strategy={strategy!r} is not one of {STRATEGIES}")
    if strategy == "repeat_factor":
        background = 1.0 if background is None else background
        return repeat_factors(index, threshold, by=by, aggregate=aggregate, background=background)
    groups = balance_groups(index, by)
    counts = group_counts(groups, count)
    gw = strategy_weights(counts, strategy, power=power, beta=beta, class_weights=class_weights, names=groups.names)
    return image_weights(groups, gw, aggregate=aggregate, background=background)


def parse_strategy(spec: str) -> tuple[str, dict[str, float]]:
    """``"power:0.3"`` -> ``("power", {"power": 0.3})``; ``"effective:0.99"`` sets beta,
    ``"repeat_factor:0.1"`` the threshold; a bare name has no parameters."""
    name, _, param = spec.partition(":")
    name = name.strip()
    key = {"power": "power", "effective": "beta", "repeat_factor": "threshold"}.get(name)
    if not param:
        return name, {}
    if key is None:
        raise DetloaderValueError(f"strategy={spec!r}: only power:P, effective:BETA and repeat_factor:T take "
                                  "a parameter")
    try:
        value = float(param)
    except ValueError:
        raise DetloaderValueError(f"strategy={spec!r}: {param!r} is not a number") from None
    return name, {key: value}


def check_strategy(
    balance: str, weights_as: str = "{group: weight}", *, setting: str = "balance"
) -> tuple[str, dict[str, float]]:
    """``(name, params)`` of a strategy string that :func:`~detloader.balance.weighted.make_balanced_sampler`
    draws by; DetloaderValueError naming ``setting=balance`` for an unknown name (with
    :data:`BALANCE_CHOICES` and the closest of them, or an example: the one message of every
    caller, ``setting`` being ``"--balance"`` in the CLI), a bad parameter, or ``"explicit"``, whose weights come as a
    mapping (``weights_as`` says which)."""
    name = balance.partition(":")[0].strip()
    if name not in BALANCE_CHOICES:
        hint = did_you_mean(name, BALANCE_CHOICES) or "; e.g. 'sqrt', or 'power:0.5' for a strategy's parameter"
        raise DetloaderValueError(f"{setting}={balance!r} is not one of {', '.join(BALANCE_CHOICES)}{hint}")
    name, params = parse_strategy(balance)
    if name == "explicit":
        raise DetloaderValueError(f"{setting}='explicit' needs the weights: pass balance={weights_as}")
    return name, params
