"""Random splits by ratio, as pure functions on an index's arrays (the index applies them:
:meth:`~detloader.annotations.index.AnnotationIndex.random_split`)."""

from __future__ import annotations

import math
from typing import Mapping

import numpy as np

from detloader.annotations.fields import MISSING

__all__ = ["check_fractions", "rarest_class_per_image", "stratified_split"]


def check_fractions(fractions: Mapping[str, float]) -> None:
    """ValueError unless ``fractions`` is non-empty, every value finite and >= 0, sum > 0."""
    if not fractions:
        raise ValueError("random_split: fractions={} is empty")
    if any(f < 0 or not math.isfinite(f) for f in fractions.values()) or sum(
        fractions.values()
    ) <= 0:
        raise ValueError(f"random_split: fractions={dict(fractions)} must be >= 0, sum > 0")


def stratified_split(
    groups: np.ndarray, fractions: Mapping[str, float], rng: np.random.Generator
) -> dict[str, np.ndarray]:
    """Image ids (sorted int64) per part: each group (``groups[i]`` is image i's) is shuffled
    and cut by the normalised fractions, rounded down, the remainder going to the parts with
    the largest fractional shares (ties: the first parts)."""
    names = list(fractions)
    weights = np.array([fractions[k] for k in names], dtype=np.float64)
    weights /= weights.sum()
    parts: dict[str, list[np.ndarray]] = {k: [] for k in names}
    for g in np.unique(groups):
        members = np.flatnonzero(groups == g)
        members = members[rng.permutation(len(members))]
        sizes = np.floor(weights * len(members)).astype(np.int64)
        remainder = len(members) - int(sizes.sum())
        order = np.argsort(-(weights * len(members) - sizes), kind="stable")
        sizes[order[:remainder]] += 1
        start = 0
        for k, size in zip(names, sizes):
            parts[k].append(members[start : start + size])
            start += size
    return {k: np.sort(np.concatenate(v)) for k, v in parts.items()}


def rarest_class_per_image(
    labels: np.ndarray, object_image: np.ndarray, n_images: int, n_classes: int
) -> np.ndarray:
    """int64 ``[n_images]``: per image, its object class with the fewest objects in the whole
    dataset (MISSING for images without objects)."""
    counts = np.bincount(labels, minlength=n_classes) if len(labels) else []
    out = np.full(n_images, MISSING, dtype=np.int64)
    if len(labels) == 0:
        return out
    freq = np.asarray(counts)[labels]
    img = object_image
    # for each image, the label with the smallest global frequency
    order = np.lexsort((freq, img))
    first = np.ones(len(order), dtype=bool)
    first[1:] = img[order][1:] != img[order][:-1]
    out[img[order][first]] = labels[order][first]
    return out
