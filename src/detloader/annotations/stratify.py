"""Stratified splitting, pure: image ids per part from each image's group (its rarest object
class), so that a rare class reaches every part. ``AnnotationIndex.random_split`` and
:func:`~detloader.annotations.splits.make_splits` cut with it (docs/index.md, "Splits: found or
made").
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import numpy as np

from detloader.annotations.fields import MISSING
from detloader.errors import DetloaderValueError


def check_fractions(fractions: Mapping[str, float]) -> None:
    """ValueError unless ``fractions`` is non-empty, every value finite and >= 0, sum > 0."""
    if not fractions:
        raise DetloaderValueError("random_split: fractions={} is empty")
    values = list(fractions.values())
    if any(f < 0 or not math.isfinite(f) for f in values) or sum(values) <= 0:
        raise DetloaderValueError(f"random_split: fractions={dict(fractions)} must be >= 0, sum > 0")


def stratified_split(
    groups: np.ndarray, fractions: Mapping[str, float], rng: np.random.Generator
) -> dict[str, np.ndarray]:
    """Image ids (sorted int64) per part: each group (``groups[i]`` is image i's) is shuffled
    and cut by the normalised fractions, rounded down, the remainder going to the parts with
    the largest fractional shares (ties: the first parts). A group with at least as many
    images as there are parts with a fraction > 0 puts at least one in each of them (taken
    from the largest part), so that a rare class reaches every split."""
    names = list(fractions)
    weights = np.array([fractions[k] for k in names], dtype=np.float64)
    weights /= weights.sum()
    parts: dict[str, list[np.ndarray]] = {k: [np.zeros(0, dtype=np.int64)] for k in names}
    for g in np.unique(groups):
        members = np.flatnonzero(groups == g)
        n = len(members)
        members = members[rng.permutation(n)]
        sizes = np.floor(weights * n).astype(np.int64)
        order = np.argsort(-(weights * n - sizes), kind="stable")
        sizes[order[: n - int(sizes.sum())]] += 1
        if n >= int((weights > 0).sum()):
            for k in np.flatnonzero((weights > 0) & (sizes == 0)):
                sizes[np.argmax(sizes)] -= 1
                sizes[k] += 1
        for k, start, size in zip(names, np.cumsum(sizes) - sizes, sizes):
            parts[k].append(members[start : start + size])
    return {k: np.sort(np.concatenate(v)) for k, v in parts.items()}


def rarest_class_per_image(labels: np.ndarray, object_image: np.ndarray, n_images: int, n_classes: int) -> np.ndarray:
    """int64 ``[n_images]``: per image, its object class with the fewest objects in the whole
    dataset (MISSING for images without objects)."""
    out = np.full(n_images, MISSING, dtype=np.int64)
    if len(labels) == 0:
        return out
    freq = np.bincount(labels, minlength=n_classes)[labels]
    img = object_image
    # for each image, the label with the smallest global frequency
    order = np.lexsort((freq, img))
    first = np.ones(len(order), dtype=bool)
    first[1:] = img[order][1:] != img[order][:-1]
    out[img[order][first]] = labels[order][first]
    return out


def class_groups(labels: np.ndarray, object_image: np.ndarray, image_labels: np.ndarray, n_classes: int) -> np.ndarray:
    """int64 ``[n]`` (``n = len(image_labels)``): the stratification group of each image of an
    index's arrays: its rarest object class, or for an image without objects its image class
    (numbered after the object classes)."""
    groups = rarest_class_per_image(labels, object_image, len(image_labels), n_classes)
    empty = groups == MISSING
    groups[empty] = n_classes + 1 + image_labels[empty]
    return groups
