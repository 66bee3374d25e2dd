"""Tiny hand-made indexes for the balancing tests (weights, samplers, stats), and Pearson's
chi-square test that checks the samplers' frequencies against their expectation."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from detloader.annotations.fields import pack_strings
from detloader.annotations.index import MISSING, AnnotationIndex, Vocabulary
from detloader.annotations.landmarks import LandmarkSchema

#: Significance threshold of every frequency test: a correct sampler fails one of them
#: with probability 1e-3 for a random seed; the seeds are fixed, so the outcome is too.
P_MIN = 1e-3


def tiny_index(
    labels: Sequence[Sequence[int]],
    classes: Sequence[str] = ("a", "b", "c"),
    *,
    image_labels: Sequence[int] | None = None,
    image_classes: Sequence[str] = ("day", "night"),
    ages: Sequence[Sequence[int]] | None = None,
    visibility: Sequence[Sequence[Sequence[int]]] | None = None,
) -> AnnotationIndex:
    """An index of ``len(labels)`` 100x80 images; image ``i`` holds one object per entry of
    ``labels[i]`` (class ids). Box ``j`` of an image is ``[j, j, j + 10 + j, j + 20]``.
    ``ages``: per object attribute ``age`` (adult 0 / child 1 / MISSING). ``visibility``:
    per object two landmark visibilities (schema ``left_eye``, ``right_eye``)."""
    n = len(labels)
    counts = np.array([len(x) for x in labels], dtype=np.int64)
    offsets = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(counts, out=offsets[1:])
    m = int(offsets[-1])
    boxes = np.array(
        [[j, j, j + 10 + j, j + 20] for x in labels for j in range(len(x))], dtype=np.float32
    ).reshape(m, 4)
    flat = np.array([c for x in labels for c in x], dtype=np.int32)
    schema = LandmarkSchema(("left_eye", "right_eye"), ((0, 1),)) if visibility is not None else LandmarkSchema()
    k = len(schema)
    vis = (
        np.array([v for x in visibility for v in x], dtype=np.uint8).reshape(m, k)
        if visibility is not None
        else np.zeros((m, 0), dtype=np.uint8)
    )
    attrs = (
        np.array([a for x in ages for a in x], dtype=np.int32).reshape(m, 1)
        if ages is not None
        else np.zeros((m, 0), dtype=np.int32)
    )
    img_labels = np.array(image_labels if image_labels is not None else [MISSING] * n, dtype=np.int32)
    paths = [f"img{i}.jpg" for i in range(n)]
    blob, poffs = pack_strings(paths)
    ablob, aoffs = pack_strings([f"ann{i}.xml" for i in range(n)])
    arrays = {
        "width": np.full(n, 100, dtype=np.int32),
        "height": np.full(n, 80, dtype=np.int32),
        "image_labels": img_labels,
        "image_attributes": np.zeros((n, 0), dtype=np.int32),
        "verified": np.zeros(n, dtype=bool),
        "object_offsets": offsets,
        "boxes": boxes,
        "labels": flat,
        "difficult": np.zeros(m, dtype=bool),
        "truncated": np.zeros(m, dtype=bool),
        "occluded": np.zeros(m, dtype=bool),
        "object_attributes": attrs,
        "landmarks": np.zeros((m, k, 2), dtype=np.float32),
        "visibility": vis,
        "image_paths_blob": blob,
        "image_paths_offsets": poffs,
        "annotation_paths_blob": ablob,
        "annotation_paths_offsets": aoffs,
    }
    vocab = Vocabulary(
        classes=tuple(classes),
        image_classes=tuple(image_classes) if image_labels is not None else (),
        object_attributes=(("age", ("adult", "child")),) if ages is not None else (),
        landmarks=schema,
    )
    return AnnotationIndex(root="/nonexistent", arrays=arrays, vocab=vocab)


# 6 images: objects by class id (a=0, b=1, c=2); image 4 is empty
LABELS = [[0, 0, 0], [0, 1], [0], [1, 1], [], [2, 0]]
IMAGE_LABELS = [0, 0, 1, 0, MISSING, 1]
AGES = [[0, 0, 1], [0, MISSING], [1], [0, 0], [], [1, 0]]


def six_image_index() -> AnnotationIndex:
    """The index of LABELS, IMAGE_LABELS (day, night) and AGES (adult, child)."""
    return tiny_index(LABELS, image_labels=IMAGE_LABELS, ages=AGES)


def chi_square_sf(statistic: float, dof: int) -> float:
    """``P(X >= statistic)`` for X chi-square with ``dof`` degrees of freedom: the regularised
    upper incomplete gamma ``Q(dof / 2, statistic / 2)`` (series below ``a + 1``, Lentz's
    continued fraction above; relative accuracy about 1e-12)."""
    if dof < 1:
        raise ValueError(f"dof={dof!r} must be >= 1")
    if statistic <= 0:
        return 1.0
    if not math.isfinite(statistic):
        return 0.0
    a, x = dof / 2.0, statistic / 2.0
    log_prefix = a * math.log(x) - x - math.lgamma(a)
    if x < a + 1.0:  # series for the lower P(a, x)
        term = total = 1.0 / a
        ap = a
        for _ in range(10_000):
            ap += 1.0
            term *= x / ap
            total += term
            if abs(term) < abs(total) * 1e-15:
                break
        return max(0.0, 1.0 - total * math.exp(log_prefix))
    tiny = 1e-300  # continued fraction for the upper Q(a, x)
    b = x + 1.0 - a
    c = 1.0 / tiny
    d = 1.0 / b
    h = d
    for i in range(1, 10_000):
        an = -i * (i - a)
        b += 2.0
        d = an * d + b
        d = tiny if abs(d) < tiny else d
        c = b + an / c
        c = tiny if abs(c) < tiny else c
        d = 1.0 / d
        delta = d * c
        h *= delta
        if abs(delta - 1.0) < 1e-15:
            break
    return min(1.0, math.exp(log_prefix) * h)


@dataclass(frozen=True)
class ChiSquare:
    """Result of :func:`chi_square_test`."""

    statistic: float
    dof: int
    p_value: float
    cells: int


def chi_square_test(observed: Any, expected: Any, *, min_expected: float = 5.0) -> ChiSquare:
    """Pearson's goodness-of-fit test of counts ``observed`` against ``expected`` (same total).

    Cells expected below ``min_expected`` are pooled into one cell (the usual validity rule);
    a cell expected 0 but observed is an impossible outcome (p = 0). ``dof = cells - 1``.
    """
    obs = np.asarray(observed, dtype=np.float64).reshape(-1)
    exp = np.asarray(expected, dtype=np.float64).reshape(-1)
    if obs.shape != exp.shape:
        raise ValueError(f"observed has {obs.shape[0]} cells, expected {exp.shape[0]}")
    if (exp < 0).any() or (obs < 0).any():
        raise ValueError("chi_square_test: counts must be >= 0")
    if ((exp == 0) & (obs > 0)).any():
        return ChiSquare(math.inf, max(len(obs) - 1, 1), 0.0, len(obs))
    big = exp >= min_expected
    o = list(obs[big])
    e = list(exp[big])
    if (~big).any() and exp[~big].sum() > 0:
        o.append(float(obs[~big].sum()))
        e.append(float(exp[~big].sum()))
    if len(e) < 2:
        raise ValueError("chi_square_test: fewer than 2 cells with enough expectation")
    o_arr, e_arr = np.array(o), np.array(e)
    stat = float(((o_arr - e_arr) ** 2 / e_arr).sum())
    dof = len(e_arr) - 1
    return ChiSquare(stat, dof, chi_square_sf(stat, dof), len(e_arr))


def long_tail_index(num_images: int, num_classes: int = 1200, *, seed: int = 0) -> AnnotationIndex:
    """An index of ``num_images`` 100x80 images with about 5 objects each, their classes drawn
    from a long tail over ``num_classes`` classes (class ``c`` ~ 1 / (c + 1)^1.2: a few large
    classes, many with a handful of objects, some with none); boxes vary per object."""
    rng = np.random.default_rng(seed)
    per_image = rng.poisson(5.0, num_images)
    p = 1.0 / np.arange(1, num_classes + 1) ** 1.2
    flat = rng.choice(num_classes, size=int(per_image.sum()), p=p / p.sum())
    bounds = np.cumsum(per_image)[:-1]
    index = tiny_index([x.tolist() for x in np.split(flat, bounds)], tuple(f"c{c:04d}" for c in range(num_classes)))
    wh = rng.uniform(1, 60, (index.num_objects, 2)).astype(np.float32)
    index.boxes[:, 2:] = index.boxes[:, :2] + wh
    return index
