"""Balancing groups: which group every object (or image) of an index belongs to under a key ``by``
(``"class"``, ``"image_class"``, ``"attribute:NAME"``, ``"image_attribute:NAME"`` or a product of
those). Units whose value is :data:`~detloader.annotations.index.MISSING` belong to no group.
See docs/balancing.md, "Weights".
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np

from detloader.annotations.distinct import distinct_pairs_by_group, unique_counts
from detloader.annotations.index import MISSING, AnnotationIndex
from detloader.errors import DetloaderValueError

Count = Literal["objects", "images"]
COUNTS: tuple[str, ...] = ("objects", "images")

#: Separator of the parts of a product group's name (``"face/indoor"``).
PRODUCT_SEPARATOR = "/"

ByKey = str | Sequence[str]


@dataclass(frozen=True)
class Groups:
    """The group of every unit of an index under a balancing key: ``by`` normalised
    (``("class", "image_class")``), group ``names`` in id order (product names joined by ``"/"``),
    ``level`` (``"object"`` or ``"image"``: one unit per object or per image), int64 ``ids``
    ``[units]`` (a group id or MISSING) and ``image_of`` ``[units]`` (each unit's image)."""

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
        uniq, mult = unique_counts(key)
        return uniq // g, uniq % g, mult.astype(np.int64)

    def pairs_by_group(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The same pairs sorted by group then image: int64 ``groups``, ``images`` and
        ``multiplicity`` (one stable sort by group: the images are already in order)."""
        valid = self.ids != MISSING
        return distinct_pairs_by_group(self.image_of[valid], self.ids[valid], len(self.names))


def normalize_by(by: ByKey) -> tuple[str, ...]:
    """``"class,image_class"`` / ``("class", "image_class")`` -> ``("class", "image_class")``."""
    parts = [p.strip() for p in by.split(",")] if isinstance(by, str) else [str(p).strip() for p in by]
    if not parts or any(not p for p in parts):
        raise DetloaderValueError(f"by={by!r}: {_BY_HELP}")
    if len(set(parts)) != len(parts):
        raise DetloaderValueError(f"by={by!r} repeats a key")
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
                raise DetloaderValueError(f"by={key!r}: no {level} attribute {name!r}; {level} attributes: "
                                          f"{names or 'none'}")
            column = (index.object_attributes if level == "object" else index.image_attributes)[:, names.index(name)]
            return level, column.astype(np.int64), tuple(dict(table)[name])
    raise DetloaderValueError(f"by={key!r}: {_BY_HELP}")


def balance_groups(index: AnnotationIndex, by: ByKey = "class") -> Groups:
    """Group id of every object (or image) of ``index`` under key ``by``."""
    keys = normalize_by(by)
    factors = [_factor(index, k) for k in keys]
    level: Literal["object", "image"] = "object" if any(f[0] == "object" for f in factors) else "image"
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
        names = [f"{a}{PRODUCT_SEPARATOR}{b}" if a else b for a in names for b in value_names]
    ids[missing] = MISSING
    return Groups(keys, tuple(names), level, ids, image_of, n)


def group_counts(groups: Groups, count: Count = "objects") -> np.ndarray:
    """int64 ``[G]``: units of each group (``count="objects"``) or images that contain the
    group at least once (``count="images"``). For image-level keys both are image counts."""
    if count not in COUNTS:
        raise DetloaderValueError(f"count={count!r} is not one of {COUNTS}")
    g = len(groups.names)
    if count == "objects" or groups.level == "image":
        valid = groups.ids[groups.ids != MISSING]
        return np.bincount(valid, minlength=g).astype(np.int64)
    group, _, _ = groups.pairs_by_group()
    return np.bincount(group, minlength=g).astype(np.int64)


def class_members(index: AnnotationIndex, by: ByKey = "class") -> tuple[tuple[str, ...], list[np.ndarray]]:
    """Group names and, per group, the sorted int64 ids of the images that contain it
    (empty for groups that never occur). For class-aware and P x K batch samplers."""
    groups = balance_groups(index, by)
    num = len(groups.names)
    group, images, _ = groups.pairs_by_group()
    bounds = np.searchsorted(group, np.arange(num + 1))  # sorted by group, then image
    return groups.names, [images[bounds[g] : bounds[g + 1]] for g in range(num)]


def positions_by_group(keys: np.ndarray, num_groups: int) -> list[np.ndarray]:
    """Per group ``g < num_groups``, the int64 positions ``i`` with ``keys[i] == g``, ascending
    (int ``keys``; negative keys, e.g. MISSING, belong to no group)."""
    order = np.argsort(keys, kind="stable")
    bounds = np.searchsorted(keys[order], np.arange(num_groups + 1))
    return [order[bounds[g] : bounds[g + 1]] for g in range(num_groups)]
