"""Tiny hand-made indexes for the balancing tests (weights, samplers, stats)."""

from __future__ import annotations

from collections.abc import Sequence

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
