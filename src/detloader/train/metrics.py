"""Metrics of predictions on an annotated split: box mAP by the COCO, LVIS (:mod:`.coco_eval`:
pycocotools or faster-coco-eval) or Open Images protocol (:mod:`.openimages_eval`), per-class
TP / FP / FN at an operating point, landmark NME (normaliser as mmpose's
``keypoint_2d_metrics``), image-class accuracy; what each is: docs/training.md, "Evaluation".

Ground truth comes from the index (annotation coordinates); crowd regions and difficult objects
are ignored ground truth. Every image of the index counts: one without predictions is all misses.
Predictions must already be in annotation coordinates. Undefined figures are ``None``.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any, Literal

import numpy as np

from detloader._system.files import write_file
from detloader.errors import DetloaderValueError, PredictionError
from detloader.train.coco_eval import (
    AREAS,
    Backend,
    Protocol,
    coco_detections,
    coco_evaluate,
    coco_ground_truth,
    evaluation_image_ids,
    evaluation_protocol,
    operating_point,
    per_class,
    rates,
)
from detloader.train.openimages_eval import with_openimages_ap
from detloader.train.predictions import ImagePredictions, as_predictions, check_predictions

#: ``frequency_groups`` of the metrics names at most this many classes per group.
GROUP_NAMES_SHOWN = 20

#: How prediction image ids are read: ``"row"`` a row of the evaluated index, ``"dataset"`` the
#: dataset's own image id (``index.image_ids``: COCO ``id``).
ImageIds = Literal["row", "dataset"]
#: How prediction labels are read: ``"index"`` a class index (``index.classes``), ``"category"``
#: the dataset's category id (``index.category_ids``: COCO ``category_id``).
LabelIds = Literal["index", "category"]


# -- landmarks --------------------------------------------------------------------------------
def landmark_normaliser(names: Sequence[str]) -> tuple[str, tuple[int, int] | None]:
    """(``"inter_ocular"``, (left eye, right eye)) when the schema names both eyes, else
    (``"box_diagonal"``, None)."""
    def find(side: str) -> int | None:
        pattern = re.compile(rf"(^|[^a-z]){side}[_\- ]?eye($|[^a-z])")
        hits = [i for i, n in enumerate(names) if pattern.search(n.lower())]
        return hits[0] if len(hits) == 1 else None

    left, right = find("left"), find("right")
    if left is not None and right is not None:
        return "inter_ocular", (left, right)
    return "box_diagonal", None


def _iou(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """IoU of xyxy boxes ``[N, 4]`` x ``[M, 4]`` -> ``[N, M]``."""
    lt = np.maximum(a[:, None, :2], b[None, :, :2])
    rb = np.minimum(a[:, None, 2:], b[None, :, 2:])
    inter = np.clip(rb - lt, 0, None).prod(axis=2)
    area_a = np.clip(a[:, 2:] - a[:, :2], 0, None).prod(axis=1)
    area_b = np.clip(b[:, 2:] - b[:, :2], 0, None).prod(axis=1)
    return inter / np.maximum(area_a[:, None] + area_b[None] - inter, 1e-9)


def _nme(
    index: Any, predictions: Sequence[ImagePredictions], iou_threshold: float = 0.5
) -> tuple[float | None, str | None, int]:
    names = index.landmark_schema.names
    if not names:
        return None, None, 0
    normaliser, eyes = landmark_normaliser(names)
    errors: list[float] = []
    offsets = index.object_offsets
    for p in predictions:
        lo, hi = int(offsets[p.image_id]), int(offsets[p.image_id + 1])
        if hi == lo or len(p.boxes) == 0 or p.landmarks.shape[1] != len(names):
            continue
        gt_boxes, gt_labels = index.boxes[lo:hi], index.labels[lo:hi]
        gt_lm, gt_vis = index.landmarks[lo:hi], index.visibility[lo:hi]
        ious = _iou(p.boxes, gt_boxes)
        taken = np.zeros(hi - lo, dtype=bool)
        for d in np.argsort(-p.scores, kind="stable"):
            cand = np.where((~taken) & (gt_labels == p.labels[d]), ious[d], -1.0)
            g = int(np.argmax(cand))
            if cand[g] < iou_threshold:
                continue
            taken[g] = True
            labelled = gt_vis[g] > 0
            if not labelled.any():
                continue
            if eyes is not None:
                if not (gt_vis[g, eyes[0]] > 0 and gt_vis[g, eyes[1]] > 0):
                    continue
                norm = float(np.linalg.norm(gt_lm[g, eyes[0]] - gt_lm[g, eyes[1]]))
            else:
                x1, y1, x2, y2 = gt_boxes[g]
                norm = float(np.hypot(x2 - x1, y2 - y1))
            if norm <= 0:
                continue
            dist = np.linalg.norm(p.landmarks[d][labelled] - gt_lm[g][labelled], axis=1)
            errors.append(float(dist.mean()) / norm)
    return (float(np.mean(errors)) if errors else None), normaliser, len(errors)


# -- image class ------------------------------------------------------------------------------
def _image_class(index: Any, predictions: Sequence[ImagePredictions]) -> tuple[float | None, dict[str, float | None]]:
    """Accuracy and per-class recall over every labelled image of ``index``; when the model has
    an image-class head (some prediction has ``image_probs``), an image without one is wrong."""
    classes = index.image_classes
    if not classes or not any(p.image_probs.size for p in predictions):
        return None, {name: None for name in classes}
    guess = np.full(len(index), -1, dtype=np.int64)
    for p in predictions:
        if p.image_probs.size:
            guess[p.image_id] = int(np.argmax(p.image_probs))
    labels = np.asarray(index.image_labels, dtype=np.int64)
    labelled = labels >= 0
    if not labelled.any():
        return None, {name: None for name in classes}
    t, g = labels[labelled], guess[labelled]
    recall = {name: (float((g[t == c] == c).mean()) if (t == c).any() else None) for c, name in enumerate(classes)}
    return float((t == g).mean()), recall


# -- frequency groups (LVIS APr / APc / APf) ---------------------------------------------------
def frequency_ap(
    index: Any, per_class_rows: dict[str, Any], frequency: Mapping[str, str | None] | None = None
) -> dict[str, Any]:
    """``apr``, ``apc``, ``apf`` as LVIS gives them: the mean AP@0.5:0.95 over the classes of
    each frequency group (:func:`~detloader.stats.describe.class_frequency`) that have ground truth
    in the evaluated images (None: no such class), and ``frequency_groups``: per group the
    ``classes`` in it, how many were ``scored``, their ``names`` (at most
    :data:`GROUP_NAMES_SHOWN`, ``more`` the rest), then ``without_training_images`` (classes in
    no group) and the groups' ``source``. ``frequency``: class name -> ``"r"`` / ``"c"`` /
    ``"f"`` / None (e.g. of the training split); default: the dataset's own
    (``index.meta["frequency"]``, LVIS), else counted on ``index``'s own ``train`` split, or on its
    images without one. Each row of ``per_class_rows`` gains its ``frequency``."""
    from detloader.stats.describe import FREQUENCIES, class_frequency, training_frequency

    if frequency is None:
        groups, source = training_frequency(index)
    else:
        groups, source = class_frequency(index.classes, np.zeros(len(index.classes)), frequency), "given"
    out: dict[str, Any] = {}
    summary: dict[str, Any] = {}
    for letter, name in FREQUENCIES.items():
        members = [c for c in index.classes if groups[c] == letter]
        aps = [per_class_rows[c]["ap50_95"] for c in members if per_class_rows[c]["ap50_95"] is not None]
        out[f"ap{letter}"] = float(np.mean(aps)) if aps else None
        summary[name] = {"classes": len(members), "scored": len(aps), "names": members[:GROUP_NAMES_SHOWN],
                         "more": max(len(members) - GROUP_NAMES_SHOWN, 0)}
    for c in index.classes:
        per_class_rows[c]["frequency"] = groups[c]
    summary["without_training_images"] = sum(g is None for g in groups.values())
    summary["source"] = source
    return out | {"frequency_groups": summary}


# -- all together -----------------------------------------------------------------------------
def compute_metrics(
    index: Any, predictions: Sequence[ImagePredictions], *, score_threshold: float = 0.3, backend: Backend = "auto",
    frequency: Mapping[str, str | None] | None = None, protocol: Protocol = "auto",
) -> dict[str, Any]:
    """Every metric of the module docstring as a JSON-ready dict (keys ``map50``,
    ``map50_95``, ``map75``, ``map_small``, ``map_medium``, ``map_large`` (None: no object of
    that size), ``protocol`` (``"coco"``, ``"lvis"`` or ``"openimages"``:
    :func:`~.coco_eval.evaluation_protocol` of ``protocol``; Open Images' figures:
    :func:`~.openimages_eval.with_openimages_ap`), ``per_class`` (per class ``objects``,
    ``ignored`` (crowd or difficult), ``tp``, ``fp``, ``fn``, ``precision``, ``recall``, ``max_recall``, ``ap50``,
    ``ap50_95``), ``tp``, ``fp``, ``fn``, ``precision``, ``recall`` (all classes, at
    ``score_threshold`` and IoU 0.5), ``score_threshold``, ``nme``, ``nme_normaliser``,
    ``nme_objects``, ``image_class_accuracy``, ``image_class_recall``, ``images``,
    ``images_with_predictions``, ``backend``, and LVIS's ``apr``, ``apc``, ``apf`` with
    ``frequency_groups`` and each class's ``frequency``: :func:`frequency_ap` of ``frequency``).

    ``index`` is the evaluated split, every image of it counted (one without a prediction entry
    is all misses); each prediction's ``image_id`` is a row of it and its labels class indexes
    (:class:`PredictionError` otherwise, and for NaN boxes or scores outside [0, 1])."""
    if not 0.0 <= score_threshold <= 1.0:
        raise DetloaderValueError(f"score_threshold={score_threshold!r} must be in [0, 1]")
    seen = {p.image_id for p in predictions}
    if len(seen) != len(predictions):
        raise DetloaderValueError("predictions: an image_id appears twice (a rank evaluated an image twice?)")
    check_predictions(predictions, len(index), len(index.classes))
    predictions = sorted(predictions, key=lambda p: p.image_id)
    protocol = evaluation_protocol(index, protocol)  # type: ignore[assignment]
    coco = "coco" if protocol == "openimages" else protocol  # the figures Open Images has none of
    gt = coco_ground_truth(index, coco)
    detections = coco_detections(index, predictions)
    result = coco_evaluate(gt, detections, backend, coco)
    n_classes = len(index.classes)
    labels = np.asarray(index.labels, dtype=np.int64)
    counts = np.bincount(labels, minlength=n_classes)
    ignored = np.bincount(labels[np.asarray(index.crowd) | np.asarray(index.difficult)], minlength=n_classes)
    point = operating_point(gt, detections, score_threshold, coco)
    nme, normaliser, nme_objects = _nme(index, predictions)
    accuracy, recall = _image_class(index, predictions)
    rows = per_class(result, index.classes, counts, ignored, point)
    metrics = {
        "map50": float(result["stats"][1]),
        "map50_95": float(result["stats"][0]),
        "map75": float(result["stats"][2]),
        **{f"map_{area}": (None if v < 0 else float(v)) for area, v in zip(AREAS[1:], result["stats"][3:].tolist())},
        "protocol": protocol,
        **frequency_ap(index, rows, frequency),
        "per_class": rows,
        **rates(point.sum(axis=0)),
        "score_threshold": score_threshold,
        "nme": nme,
        "nme_normaliser": normaliser,
        "nme_objects": nme_objects,
        "image_class_accuracy": accuracy,
        "image_class_recall": recall,
        "images": len(index),
        "images_with_predictions": len(seen),
        "backend": result["backend"],
    }
    return with_openimages_ap(metrics, index, predictions) if protocol == "openimages" else metrics


def score_predictions(
    predictions: Sequence[Any] | Mapping[int, Any],
    index: Any,
    *,
    ids: ImageIds = "row",
    labels: LabelIds = "index",
    score_threshold: float = 0.3,
    backend: Backend = "auto",
    coco_json: str | os.PathLike[str] | None = None,
    frequency: Mapping[str, str | None] | None = None,
    protocol: Protocol = "auto",
) -> dict[str, Any]:
    """Any model's predictions scored: the metrics of :func:`compute_metrics` (what
    ``train`` and ``detloader evaluate`` report), by the COCO or the LVIS ``protocol``
    or Open Images ``protocol`` (``"auto"``: :func:`~.coco_eval.evaluation_protocol`).

    ``predictions``: one entry per image (:func:`as_predictions`: :class:`ImagePredictions`
    or dicts of tensors, arrays or lists in annotation coordinates), a sequence or a mapping
    ``{image_id: entry}``, over ``index``, the evaluated images (e.g. ``index.split("val")``).
    Every image of ``index`` counts: one without an entry is all misses. ``ids`` says what an
    image id is, never guessed: ``"row"`` a row of ``index`` (``batch.image_ids`` of a loader
    over it), ``"dataset"`` the dataset's own id (``index.image_ids``: the COCO image ``id``);
    ``labels`` likewise: ``"index"`` class indexes of ``index.classes``, ``"category"`` the
    dataset's category ids (``index.category_ids``). An id, label, box or score that cannot be
    scored is a :class:`PredictionError`. ``coco_json``: also write the detections there as a
    COCO results list with the dataset's ids (``image_id``, ``category_id``, ``bbox`` xywh,
    ``score``, and ``keypoints`` x, y, 1 per landmark): it loads with pycocotools' ``loadRes``
    against the dataset's own annotation file. ``frequency``: class name -> LVIS frequency group
    (``"r"``, ``"c"``, ``"f"``, None), best of the training images (``detloader.stats.training_frequency``
    of the whole dataset); default: counted on ``index`` (its ``train`` split, else its images)."""
    if ids not in ("row", "dataset"):
        raise DetloaderValueError(f"ids={ids!r} is not 'row' or 'dataset'")
    if labels not in ("index", "category"):
        raise DetloaderValueError(f"labels={labels!r} is not 'index' or 'category'")
    entries = predictions.items() if isinstance(predictions, Mapping) else ((None, e) for e in predictions)
    preds = [as_predictions(entry, image_id) for image_id, entry in entries]
    if ids == "dataset":
        row = {int(v): r for r, v in enumerate(evaluation_image_ids(index).tolist())}
        unknown = [p.image_id for p in preds if p.image_id not in row]
        if unknown:
            raise PredictionError(
                f"image_id={unknown[0]} is not an image id of the evaluated images ({len(row)} images, ids "
                f"{min(row)}..{max(row)}); pass ids='row' for rows of the index"
            )
        preds = [replace(p, image_id=row[p.image_id]) for p in preds]
    if labels == "category":
        cat_ids = index.category_ids
        lut = {int(c): k for k, c in enumerate(cat_ids.tolist())}
        for p in preds:
            unknown = [int(v) for v in p.labels.tolist() if int(v) not in lut]
            if unknown:
                raise PredictionError(
                    f"image row {p.image_id}: category_id={unknown[0]} is not a category of the dataset "
                    f"(ids {cat_ids.tolist()}); pass labels='index' for class indexes"
                )
        preds = [replace(p, labels=np.asarray([lut[int(v)] for v in p.labels.tolist()], np.int64)) for p in preds]
    check_predictions(preds, len(index), len(index.classes))
    if coco_json is not None:
        write_file(coco_json, json.dumps(coco_detections(index, preds, keypoints=True)))
    return compute_metrics(
        index, preds, score_threshold=score_threshold, backend=backend, frequency=frequency, protocol=protocol
    )
