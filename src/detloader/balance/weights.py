"""Sampling weights from an index: pure functions, no state, no randomness.

Balancing happens at the DataLoader level: a sampler draws *images* with probabilities given
here. A detection image holds several objects of different classes, so a weight is first set
per **group** (an object class, an image class, an attribute value, or a product of those),
then turned into one weight per image:

1. :func:`balance_groups` maps every unit (object or image) to its group id.
2. :func:`group_counts` counts each group: objects, or images containing the group.
3. :func:`strategy_weights` turns counts into one weight per group (``inverse`` 1/n, ``sqrt``
   1/sqrt(n), ``power`` n**-p, ``effective`` (1 - beta) / (1 - beta**n) after Cui et al. 2019,
   ``explicit`` {group: weight}).
4. :func:`image_weights` aggregates the weights of an image's objects (``max``, ``mean`` or
   ``sum``); an image with no grouped unit gets the ``background`` weight.

:func:`repeat_factors` is the LVIS rule (Gupta et al. 2019): ``r_c = max(1, sqrt(t / f_c))``
with ``f_c`` the fraction of images that contain group ``c``, and an image's factor is the max
over its groups. Its values are expected copies per epoch, not relative weights.

:func:`sample_weights` does all of it in one call and is the public entry.

Keys for ``by``:

``"class"``                object class (one unit per object)
``"image_class"``          image-level class (one unit per image)
``"attribute:NAME"``       object attribute NAME (one unit per object)
``"image_attribute:NAME"`` image attribute NAME (one unit per image)
a tuple of keys            their product, e.g. ``("class", "image_class")`` groups objects by
                           (class, class of their image); any object key makes it per object.
                           A comma-separated string means the same.

Units whose value is :data:`~detloader.annotations.index.MISSING` (no image class, attribute not set)
belong to no group.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal, Mapping, Sequence

import numpy as np

from detloader.annotations.index import MISSING, AnnotationIndex

__all__ = [
    "AGGREGATES",
    "COUNTS",
    "DEFAULT_BETA",
    "DEFAULT_THRESHOLD",
    "PRODUCT_SEPARATOR",
    "STRATEGIES",
    "Aggregate",
    "ByKey",
    "Count",
    "Groups",
    "Strategy",
    "balance_groups",
    "class_members",
    "group_counts",
    "image_weights",
    "normalize_by",
    "parse_strategy",
    "positions_by_group",
    "repeat_factors",
    "sample_weights",
    "strategy_weights",
]

Strategy = Literal["inverse", "sqrt", "power", "effective", "repeat_factor", "explicit"]
STRATEGIES: tuple[str, ...] = ("inverse", "sqrt", "power", "effective", "repeat_factor", "explicit")
Aggregate = Literal["max", "mean", "sum"]
AGGREGATES: tuple[str, ...] = ("max", "mean", "sum")
Count = Literal["objects", "images"]
COUNTS: tuple[str, ...] = ("objects", "images")

#: Default LVIS repeat-factor threshold t (a group in fewer than 0.1 % of images is repeated).
DEFAULT_THRESHOLD = 0.001
#: Default beta of the effective-number strategy (Cui et al. 2019 use 0.9 ... 0.9999).
DEFAULT_BETA = 0.999

#: Separator of the parts of a product group's name (``"face/indoor"``).
PRODUCT_SEPARATOR = "/"

ByKey = str | Sequence[str]


@dataclass(frozen=True)
class Groups:
    """The group of every unit of an index under a balancing key.

    Attributes:
        by: the normalised key, one entry per factor (``("class", "image_class")``).
        names: group names in id order (product names joined by ``"/"``).
        level: ``"object"`` (one unit per object) or ``"image"`` (one unit per image).
        ids: int64 ``[units]``: group id of each unit, or MISSING.
        image_of: int64 ``[units]``: the image of each unit (``arange(n)`` per image).
        num_images: images in the index.
    """

    by: tuple[str, ...]
    names: tuple[str, ...]
    level: Literal["object", "image"]
    ids: np.ndarray
    image_of: np.ndarray
    num_images: int

    def __len__(self) -> int:
        return len(self.names)

    def pairs(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Distinct (image, group) pairs: int64 ``images``, ``groups`` and ``multiplicity``
        (units of that group in that image), sorted by image then group."""
        valid = self.ids != MISSING
        g = max(len(self.names), 1)
        key = self.image_of[valid] * g + self.ids[valid]
        uniq, mult = np.unique(key, return_counts=True)
        return uniq // g, uniq % g, mult.astype(np.int64)


def normalize_by(by: ByKey) -> tuple[str, ...]:
    """``"class,image_class"`` / ``("class", "image_class")`` -> ``("class", "image_class")``."""
    parts = [p.strip() for p in by.split(",")] if isinstance(by, str) else [str(p).strip() for p in by]
    if not parts or any(not p for p in parts):
        raise ValueError(f"by={by!r}: {_BY_HELP}")
    if len(set(parts)) != len(parts):
        raise ValueError(f"by={by!r} repeats a key")
    return tuple(parts)


_BY_HELP = (
    "expected 'class', 'image_class', 'attribute:NAME', 'image_attribute:NAME' or a tuple "
    "(comma-separated string) of those"
)


def _factor(index: AnnotationIndex, key: str) -> tuple[str, np.ndarray, tuple[str, ...]]:
    """(level, int64 values per unit of that level, value names) of one key."""
    if key == "class":
        return "object", index.labels.astype(np.int64), tuple(index.classes)
    if key == "image_class":
        return "image", index.image_labels.astype(np.int64), tuple(index.image_classes)
    for prefix, level in (("attribute:", "object"), ("image_attribute:", "image")):
        if key.startswith(prefix):
            name = key[len(prefix) :]
            table = index.vocab.object_attributes if level == "object" else index.vocab.image_attributes
            names = [n for n, _ in table]
            if name not in names:
                raise ValueError(
                    f"by={key!r}: no {level} attribute {name!r}; {level} attributes: {names or 'none'}"
                )
            column = (index.object_attributes if level == "object" else index.image_attributes)[
                :, names.index(name)
            ]
            return level, column.astype(np.int64), tuple(dict(table)[name])
    raise ValueError(f"by={key!r}: {_BY_HELP}")


def balance_groups(index: AnnotationIndex, by: ByKey = "class") -> Groups:
    """Group id of every object (or image) of ``index`` under key ``by`` (see module doc)."""
    keys = normalize_by(by)
    factors = [_factor(index, k) for k in keys]
    level: Literal["object", "image"] = (
        "object" if any(f[0] == "object" for f in factors) else "image"
    )
    n = len(index)
    object_image = index.object_image
    image_of = object_image if level == "object" else np.arange(n, dtype=np.int64)
    ids = np.zeros(len(image_of), dtype=np.int64)
    missing = np.zeros(len(image_of), dtype=bool)
    names: list[str] = [""]
    for f_level, values, value_names in factors:
        per_unit = values[object_image] if (level == "object" and f_level == "image") else values
        missing |= per_unit == MISSING
        ids = ids * max(len(value_names), 1) + np.where(per_unit == MISSING, 0, per_unit)
        names = [
            f"{a}{PRODUCT_SEPARATOR}{b}" if a else b for a in names for b in value_names
        ]
    ids[missing] = MISSING
    return Groups(keys, tuple(names), level, ids, image_of, n)


def group_counts(groups: Groups, count: Count = "objects") -> np.ndarray:
    """int64 ``[G]``: units of each group (``count="objects"``) or images that contain the
    group at least once (``count="images"``). For image-level keys both are image counts."""
    if count not in COUNTS:
        raise ValueError(f"count={count!r} is not one of {COUNTS}")
    g = len(groups.names)
    if count == "objects" or groups.level == "image":
        valid = groups.ids[groups.ids != MISSING]
        return np.bincount(valid, minlength=g).astype(np.int64)
    _, group, _ = groups.pairs()
    return np.bincount(group, minlength=g).astype(np.int64)


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
            raise ValueError("strategy='power' needs power=EXPONENT (e.g. power=0.5 for sqrt)")
        if not math.isfinite(p):
            raise ValueError(f"power={p!r} must be a finite number")
        out[present] = counts[present] ** -float(p)
    elif strategy == "effective":
        if not 0.0 <= beta < 1.0:
            raise ValueError(f"beta={beta!r} must be in [0, 1)")
        if beta == 0.0:
            out[present] = 1.0
        else:
            # (1 - beta) / (1 - beta**n), with 1 - beta**n = -expm1(n log beta) for precision
            out[present] = (1.0 - beta) / -np.expm1(counts[present] * math.log(beta))
    elif strategy == "repeat_factor":
        if image_fraction is None:
            raise ValueError("strategy='repeat_factor' needs image_fraction (f_c per group)")
        _check_threshold(threshold)
        f = np.asarray(image_fraction, dtype=np.float64)
        has = f > 0
        out[has] = np.maximum(1.0, np.sqrt(threshold / f[has]))
    elif strategy == "explicit":
        out[:] = _explicit(class_weights, names, len(counts))
    else:
        raise ValueError(f"strategy={strategy!r} is not one of {STRATEGIES}")
    return out


def _check_threshold(threshold: float) -> None:
    if not (isinstance(threshold, (int, float)) and 0.0 < threshold <= 1.0):
        raise ValueError(f"threshold={threshold!r} must be in (0, 1] (a fraction of images)")


def _explicit(
    class_weights: Mapping[str | int | tuple[str, ...], float] | None,
    names: Sequence[str],
    g: int,
) -> np.ndarray:
    if class_weights is None:
        raise ValueError(
            "strategy='explicit' needs class_weights={group: weight}, e.g. {'masked': 2.0}"
        )
    out = np.ones(g, dtype=np.float64)
    lookup = {name: i for i, name in enumerate(names)}
    for key, weight in class_weights.items():
        if isinstance(key, tuple):
            key = PRODUCT_SEPARATOR.join(key)
        if isinstance(key, (int, np.integer)) and not isinstance(key, bool):
            if not 0 <= int(key) < g:
                raise ValueError(f"class_weights: id {key} out of range 0..{g - 1}")
            i = int(key)
        elif key in lookup:
            i = lookup[key]
        else:
            raise ValueError(f"class_weights: {key!r} is not a group; groups: {list(names)}")
        w = float(weight)
        if not (math.isfinite(w) and w >= 0):
            raise ValueError(f"class_weights[{key!r}]={weight!r} must be finite and >= 0")
        out[i] = w
    return out


def image_weights(
    groups: Groups,
    group_weights: np.ndarray,
    *,
    aggregate: Aggregate = "max",
    background: float | None = None,
) -> np.ndarray:
    """float64 ``[n]``: one weight per image from the weights of its units' groups.

    Per-object keys: the image weight is the ``max`` (default), ``mean`` or ``sum`` over its
    objects that belong to a group. Images with no such object (and, for image keys, images
    whose value is MISSING) get ``background``; ``None`` means the smallest positive weight
    of the groups that occur, so an empty image is drawn as often as one of the commonest
    group (1.0 if no group occurs).
    """
    if aggregate not in AGGREGATES:
        raise ValueError(f"aggregate={aggregate!r} is not one of {AGGREGATES}")
    gw = np.asarray(group_weights, dtype=np.float64)
    if gw.shape != (len(groups.names),):
        raise ValueError(f"group_weights has shape {gw.shape}, expected ({len(groups.names)},)")
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
        occurring = gw[np.unique(ids)] if len(ids) else np.zeros(0)
        occurring = occurring[occurring > 0]
        background = float(occurring.min()) if len(occurring) else 1.0
    elif not (math.isfinite(background) and background >= 0):
        raise ValueError(f"background={background!r} must be finite and >= 0")
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
    """float64 ``[n]``: LVIS repeat factor of each image, ``>= 1`` (expected copies per epoch).

    ``r_c = max(1, sqrt(threshold / f_c))``, ``f_c`` = fraction of images containing group
    ``c``; an image's factor is the ``max`` over its groups; images with no group get
    ``background`` (1.0: drawn once).
    """
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
    """float64 ``[len(index)]``: the sampling weight of every image.

    Args:
        index: the dataset.
        by: balancing key (module doc): ``"class"``, ``"image_class"``, ``"attribute:NAME"``,
            ``"image_attribute:NAME"`` or a tuple of them (their product).
        strategy: ``inverse`` (1/n), ``sqrt`` (1/sqrt n), ``power`` (n**-power, any real),
            ``effective`` ((1 - beta)/(1 - beta**n)), ``repeat_factor`` (LVIS, threshold t;
            the result is expected copies per epoch), ``explicit`` (``class_weights``).
        count: what n counts for per-object keys: ``"objects"`` of the group or ``"images"``
            containing it (repeat_factor always uses the image fraction).
        aggregate: ``max`` | ``mean`` | ``sum`` over an image's objects.
        background: weight of images with no grouped unit; ``None``: the smallest positive
            weight of the groups that occur (1.0 for repeat_factor).

    The weights are relative (a sampler normalises them), except for ``repeat_factor``.
    """
    if strategy not in STRATEGIES:
        raise ValueError(f"strategy={strategy!r} is not one of {STRATEGIES}")
    if strategy == "repeat_factor":
        return repeat_factors(
            index,
            threshold,
            by=by,
            aggregate=aggregate,
            background=1.0 if background is None else background,
        )
    groups = balance_groups(index, by)
    counts = group_counts(groups, count)
    gw = strategy_weights(
        counts, strategy, power=power, beta=beta, class_weights=class_weights, names=groups.names
    )
    return image_weights(groups, gw, aggregate=aggregate, background=background)


def class_members(index: AnnotationIndex, by: ByKey = "class") -> tuple[tuple[str, ...], list[np.ndarray]]:
    """Group names and, per group, the sorted int64 ids of the images that contain it
    (empty for groups that never occur). For class-aware and P x K batch samplers."""
    groups = balance_groups(index, by)
    images, group, _ = groups.pairs()  # sorted by image: images stay sorted within a group
    return groups.names, [images[p] for p in positions_by_group(group, len(groups.names))]


def positions_by_group(keys: np.ndarray, num_groups: int) -> list[np.ndarray]:
    """Per group ``g < num_groups``, the int64 positions ``i`` with ``keys[i] == g``, ascending
    (int ``keys``; negative keys, e.g. MISSING, belong to no group)."""
    order = np.argsort(keys, kind="stable")
    bounds = np.searchsorted(keys[order], np.arange(num_groups + 1))
    return [order[bounds[g] : bounds[g + 1]] for g in range(num_groups)]


def parse_strategy(spec: str) -> tuple[str, dict[str, float]]:
    """``"power:0.3"`` -> ``("power", {"power": 0.3})``; ``"effective:0.99"`` sets beta,
    ``"repeat_factor:0.1"`` the threshold; a bare name has no parameters."""
    name, _, param = spec.partition(":")
    name = name.strip()
    key = {"power": "power", "effective": "beta", "repeat_factor": "threshold"}.get(name)
    if not param:
        return name, {}
    if key is None:
        raise ValueError(f"strategy={spec!r}: only power:P, effective:BETA and repeat_factor:T take a parameter")
    try:
        value = float(param)
    except ValueError:
        raise ValueError(f"strategy={spec!r}: {param!r} is not a number") from None
    return name, {key: value}
