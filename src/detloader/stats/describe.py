"""Dataset statistics: what an index holds, per class, image class, attribute and landmark."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np

from detloader._system import usable_cpus
from detloader.annotations.distinct import group_order, pair_starts
from detloader.annotations.index import MISSING, AnnotationIndex
from detloader.balance.groups import Groups, balance_groups, group_counts
from detloader.errors import DetloaderValueError

#: Quantiles reported for box sizes.
QUANTILES: tuple[float, ...] = (0.0, 0.05, 0.25, 0.5, 0.75, 0.95, 1.0)


def imbalance_ratio(counts: Sequence[float] | np.ndarray) -> float | None:
    """Largest / smallest of the positive counts (``None`` with fewer than one positive)."""
    c = np.asarray(counts, dtype=np.float64)
    c = c[c > 0]
    return float(c.max() / c.min()) if len(c) else None


def _quantiles(values: np.ndarray, digits: int = 2) -> list[float]:
    return [round(float(v), digits) for v in np.quantile(values, QUANTILES)] if len(values) else []


def _box_quantiles(columns: dict[str, tuple[np.ndarray, int]]) -> dict[str, Any]:
    """``{"quantiles": QUANTILES, name: _quantiles(values, digits), ...}``. Each is a partition
    of a per-object array, which numpy runs without the GIL: on up to one thread per usable
    CPU, so that at millions of objects they take one partition's time where the cores are
    free (the same figures either way)."""
    threads = min(len(columns), usable_cpus())
    if threads < 2 or sum(len(v) for v, _ in columns.values()) < 1 << 20:
        return {"quantiles": list(QUANTILES)} | {k: _quantiles(v, d) for k, (v, d) in columns.items()}
    with ThreadPoolExecutor(threads, thread_name_prefix="detloader-stats") as pool:
        futures = {k: pool.submit(_quantiles, v, d) for k, (v, d) in columns.items()}
        return {"quantiles": list(QUANTILES)} | {k: f.result() for k, f in futures.items()}


def class_figures(labels: np.ndarray, object_image: np.ndarray, values: np.ndarray,
                  num_classes: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per class ``c < num_classes``: int64 objects (``labels == c``), int64 distinct images
    among them, and float64 ``np.median(values[labels == c])`` (NaN for a class without
    objects). ``object_image`` must be non-decreasing (an index's is). One stable sort by
    class serves all three; each value is looked at by its own class only."""
    labels = np.asarray(labels)
    values = np.asarray(values, dtype=np.float64)
    sizes = np.bincount(labels, minlength=num_classes)[:num_classes].astype(np.int64)
    medians = np.full(num_classes, np.nan)
    if len(labels) == 0:
        return sizes, np.zeros(num_classes, dtype=np.int64), medians
    order = group_order(labels, num_classes)
    starts = np.cumsum(sizes) - sizes
    first = pair_starts(np.asarray(object_image)[order], sizes)  # the first object of its (class, image) pair
    by_class = np.repeat(np.arange(num_classes, dtype=np.int64), sizes)  # labels[order], without a gather
    images = np.bincount(by_class[first], minlength=num_classes)[:num_classes].astype(np.int64)
    grouped = values[order]
    small = (sizes > 0) & (sizes <= SMALL_CLASS)
    if small.any():  # the small classes together: one sort by (class, value), no call per class
        in_small = np.repeat(small, sizes)
        sub_sizes = sizes[small]
        ordered = grouped[in_small][np.lexsort((grouped[in_small], by_class[in_small]))]
        sub_starts = np.cumsum(sub_sizes) - sub_sizes
        medians[small] = (ordered[sub_starts + (sub_sizes - 1) // 2] + ordered[sub_starts + sub_sizes // 2]) / 2
    for c in np.flatnonzero(sizes > SMALL_CLASS).tolist():
        medians[c] = _median(grouped[starts[c] : starts[c] + sizes[c]])
    return sizes, images, medians


#: :func:`class_figures` takes the median of classes with at most this many objects together,
#: by one sort, and of each larger class by a partition of its own.
SMALL_CLASS = 256


def _median(values: np.ndarray) -> float:
    """``np.median(values)`` of a non-empty float64 array without NaN (one partition, none of
    np.median's per-call overhead: it is called once per class)."""
    n = len(values)
    if n == 1:
        return float(values[0])
    half = n // 2
    if n % 2:
        return float(np.partition(values, half)[half])
    part = np.partition(values, (half - 1, half))
    return float((part[half - 1] + part[half]) / 2)


# -- frequency groups (LVIS: rare / common / frequent) ----------------------------------------
#: LVIS's frequency groups, by the letter its ``frequency`` field uses, in order.
FREQUENCIES: dict[str, str] = {"r": "rare", "c": "common", "f": "frequent"}
#: A class in at most this many training images is rare (LVIS: 1-10 images).
RARE_MAX_IMAGES = 10
#: A class in more than :data:`RARE_MAX_IMAGES` and at most this many training images is common
#: (LVIS: 11-100); in more, frequent.
COMMON_MAX_IMAGES = 100
#: Where the groups come from when the dataset gives each class's frequency (LVIS).
FREQUENCY_FIELD = "the dataset's frequency field"


def class_frequency(
    classes: Sequence[str], image_counts: Sequence[int] | np.ndarray, frequency: Mapping[str, str] | None = None
) -> dict[str, str | None]:
    """Class name -> ``"r"`` (rare), ``"c"`` (common) or ``"f"`` (frequent), as LVIS defines the
    groups: by ``image_counts[k]``, the number of TRAINING images holding class ``classes[k]``
    (1-10 rare, 11-100 common, over 100 frequent); ``None`` for a class in no training image
    (in no group). ``frequency``: the dataset's own per-class field (LVIS ``frequency``), which
    then decides for every class, whatever its count; it must name each class, with ``"r"``,
    ``"c"``, ``"f"`` or None (in no group); a :class:`DetloaderValueError` names the class and
    value otherwise."""
    counts = np.asarray(image_counts, dtype=np.int64).reshape(-1)
    if len(counts) != len(classes):
        raise DetloaderValueError(f"image_counts has {len(counts)} entries for {len(classes)} classes")
    if frequency is not None:
        missing = [c for c in classes if c not in frequency]
        if missing:
            raise DetloaderValueError(f"frequency: class {missing[0]!r} has no frequency ({len(missing)} classes "
                                      f"lack one); each class needs one of {tuple(FREQUENCIES)}")
        bad = next(((c, frequency[c]) for c in classes if frequency[c] is not None and frequency[c] not in FREQUENCIES),
                   None)
        if bad is not None:
            raise DetloaderValueError(f"frequency: class {bad[0]!r}: frequency={bad[1]!r} is not one of "
                                      f"{(*FREQUENCIES, None)}")
        return {c: frequency[c] for c in classes}
    letters = np.where(counts <= RARE_MAX_IMAGES, "r", np.where(counts <= COMMON_MAX_IMAGES, "c", "f"))
    return {c: (str(g) if n > 0 else None) for c, n, g in zip(classes, counts.tolist(), letters.tolist())}


def training_frequency(
    index: AnnotationIndex, frequency: Mapping[str, str] | None = None
) -> tuple[dict[str, str | None], str]:
    """:func:`class_frequency` of ``index``'s classes, counted on its ``train`` split (on every
    image when it has no non-empty one), and where the groups come from, in words. ``frequency``
    (default: the dataset's own, ``index.meta["frequency"]``, as LVIS files give it) decides
    instead of the counts when there is one."""
    frequency = index.meta.get("frequency") if frequency is None else frequency
    if frequency is not None:
        return class_frequency(index.classes, np.zeros(len(index.classes)), frequency), FREQUENCY_FIELD
    train = index.splits.get("train")
    part, source = index, f"all {len(index):,} images (no train split)"
    if train is not None and len(train):
        part, source = index.subset(train), f"the train split ({len(train):,} images)"
    return class_frequency(index.classes, group_counts(balance_groups(part, "class"), "images")), source


def frequency_groups(index: AnnotationIndex, frequency: Mapping[str, str | None]) -> Groups:
    """Object-level :class:`~detloader.balance.groups.Groups` named ``("rare", "common",
    "frequent")``: each object in its class's group of ``frequency`` (class name -> letter or
    None, e.g. :func:`training_frequency`'s); objects of a class in no group are MISSING. For
    :func:`~detloader.stats.report.group_totals`."""
    letters = list(FREQUENCIES)
    lut = np.array([letters.index(g) if (g := frequency.get(c)) is not None else MISSING for c in index.classes],
                   dtype=np.int64)
    ids = lut[index.labels.astype(np.int64)] if len(lut) else np.zeros(0, dtype=np.int64)
    return Groups(("frequency",), tuple(FREQUENCIES.values()), "object", ids, index.object_image, len(index))


def frequency_summary(
    index: AnnotationIndex, frequency: Mapping[str, str | None], source: str
) -> dict[str, Any]:
    """Per group (``rare``, ``common``, ``frequent``): ``classes`` (count), ``names``, and the
    ``images`` and ``objects`` of ``index`` holding them; ``without_training_images``: the
    classes in no group (no training image), by name; ``source``: where the groups come from."""
    groups = frequency_groups(index, frequency)
    valid = groups.ids != MISSING
    objects = np.bincount(groups.ids[valid], minlength=len(FREQUENCIES))
    images = np.bincount(groups.pairs()[1], minlength=len(FREQUENCIES))
    out: dict[str, Any] = {}
    for k, (letter, name) in enumerate(FREQUENCIES.items()):
        names = [c for c in index.classes if frequency.get(c) == letter]
        out[name] = {"classes": len(names), "images": int(images[k]), "objects": int(objects[k]), "names": names}
    return out | {"without_training_images": [c for c in index.classes if frequency.get(c) is None],
                  "source": source}


def dataset_stats(
    index: AnnotationIndex, frequency: tuple[Mapping[str, str | None], str] | None = None
) -> dict[str, Any]:
    """Plain-data statistics of ``index`` (JSON-ready; docs/balancing.md, "Statistics"). Box
    sizes are in pixels at :data:`QUANTILES`, ``relative_sqrt_area`` = sqrt(box area / image
    area); imbalance ratios leave empty classes out. ``frequency_groups``: :func:`frequency_summary`
    of ``frequency`` (class -> group and its source, as :func:`training_frequency` gives them;
    default: ``training_frequency(index)``)."""
    image_classes = index.image_class_counts()
    per_image = index.objects_per_image
    boxes = index.boxes
    w = boxes[:, 2].astype(np.float64) - boxes[:, 0]  # float64, as if the boxes were cast first
    h = boxes[:, 3].astype(np.float64) - boxes[:, 1]
    box_area = np.clip(w * h, 0, None)
    area = np.sqrt(box_area)
    n = len(index)
    img = np.repeat(np.arange(n, dtype=np.int32 if n < 2**31 else np.int64), per_image)  # object -> image
    per_image_area = index.width.astype(np.float64) * index.height.astype(np.float64)
    image_area = np.repeat(np.where(per_image_area > 0, per_image_area, np.nan), per_image)
    relative = np.sqrt(box_area / image_area)
    relative = relative[np.isfinite(relative)]
    object_counts, image_counts, medians = class_figures(index.labels, img, area, len(index.classes))
    objects = dict(zip(index.classes, object_counts.tolist()))
    images = dict(zip(index.classes, image_counts.tolist()))
    vis = index.visibility
    landmarks = {name: {"visible": int((vis[:, k] == 2).sum()), "hidden": int((vis[:, k] == 1).sum()),
                        "absent": int((vis[:, k] == 0).sum())} for k, name in enumerate(index.landmark_schema.names)}
    per_class_median = {
        name: (None if np.isnan(m) else round(float(m), 2)) for name, m in zip(index.classes, medians.tolist())
    }
    return {
        "images": len(index),
        "objects": index.num_objects,
        "empty_images": int((per_image == 0).sum()),
        "objects_per_image": {
            "mean": round(float(per_image.mean()), 3) if len(index) else 0.0,
            "max": int(per_image.max()) if len(index) else 0,
        },
        "classes": {n: {"objects": objects[n], "images": images[n]} for n in index.classes},
        "imbalance_ratio": {
            "objects": imbalance_ratio(list(objects.values())),
            "images": imbalance_ratio(list(images.values())),
        },
        "empty_classes": [n for n, c in objects.items() if c == 0],
        "image_classes": image_classes,
        "image_class_imbalance_ratio": imbalance_ratio(list(image_classes.values())),
        "images_without_image_class": int((index.image_labels == MISSING).sum()),
        "object_attributes": {n: index.attribute_counts(n, "object") for n, _ in index.vocab.object_attributes},
        "image_attributes": {n: index.attribute_counts(n, "image") for n, _ in index.vocab.image_attributes},
        "landmarks": landmarks,
        "box_size": _box_quantiles(
            {"width": (w, 2), "height": (h, 2), "sqrt_area": (area, 2), "relative_sqrt_area": (relative, 4)}
        ),
        "box_sqrt_area_median": per_class_median,
        "frequency_groups": frequency_summary(index, *(frequency or training_frequency(index))),
    }
