"""Metrics of predictions on an annotated split: COCO box mAP (pycocotools, or faster-coco-eval with the
``eval`` extra; not a home-made matcher), per-class TP / FP / FN at an operating point (pycocotools'
matching), landmark NME (normaliser as mmpose's ``keypoint_2d_metrics``), image-class accuracy; what
each is: docs/training.md, "Evaluation".

Ground truth comes from the index (annotation coordinates), with the dataset's own image and
category ids (``index.image_ids``, ``index.category_ids``); COCO crowd regions enter as
``iscrowd: 1`` and difficult objects (VOC ``<difficult>``) as ignored ground truth, so neither
is a miss, and a detection on one is not a false positive. Every image of the index counts: one
without predictions is all misses. Predictions must already be mapped back to annotation
coordinates (``Batch.boxes_to_original``). Undefined figures (no landmark head, no image
classes) are ``None``.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Literal

import numpy as np

from detloader.errors import DetloaderValueError, MissingExtraError, PredictionError

Backend = Literal["auto", "faster_coco_eval", "pycocotools"]
BACKENDS: tuple[str, ...] = ("auto", "faster_coco_eval", "pycocotools")
#: How prediction image ids are read: ``"row"`` a row of the evaluated index, ``"dataset"`` the
#: dataset's own image id (``index.image_ids``: COCO ``id``).
ImageIds = Literal["row", "dataset"]
#: How prediction labels are read: ``"index"`` a class index (``index.classes``), ``"category"``
#: the dataset's category id (``index.category_ids``: COCO ``category_id``).
LabelIds = Literal["index", "category"]
#: IoU of the operating point (TP / FP / FN counts).
OPERATING_IOU = 0.5
#: The area given to a difficult object in the evaluator's ground truth: below every area range,
#: so pycocotools ignores it (matched by IoU like any object, neither a miss nor, when matched,
#: a false positive), as the VOC devkit does.
DIFFICULT_AREA = -1.0


@dataclass(frozen=True)
class ImagePredictions:
    """Predictions for one image, in annotation coordinates (plain numpy: cheap to pickle
    between ranks).

    Attributes:
        image_id: row of the image in the index being evaluated.
        boxes: float32 ``[P, 4]`` xyxy pixels; scores: float32 ``[P]`` in [0, 1]; labels: int64
            ``[P]`` class indexes of the index.
        landmarks: float32 ``[P, K, 2]`` pixels.
        image_probs: float32 ``[I]`` image-class probabilities (``I = 0``: no head).
    """

    image_id: int
    boxes: np.ndarray
    scores: np.ndarray
    labels: np.ndarray
    landmarks: np.ndarray
    image_probs: np.ndarray


def _array(value: Any, dtype: Any) -> np.ndarray:
    if hasattr(value, "detach"):  # a torch tensor, on any device, of any float type
        value = value.detach().cpu()
        value = value.float() if value.is_floating_point() else value
    return np.asarray(value, dtype=dtype)


def as_predictions(entry: Any, image_id: int | None = None) -> ImagePredictions:
    """One image's predictions as :class:`ImagePredictions`: one already (returned as it is),
    or a mapping with ``boxes`` ``[P, 4]`` xyxy, ``scores`` ``[P]``, ``labels`` ``[P]`` (class
    ids of the index) and optionally ``landmarks`` ``[P, K, 2]``, ``image_probs`` ``[I]``
    (image-class scores: the highest counts) and ``image_id`` (else ``image_id``), all in
    annotation coordinates, as torch tensors (any device), numpy arrays or lists."""
    if isinstance(entry, ImagePredictions):
        return entry
    if not isinstance(entry, Mapping) or not {"boxes", "scores", "labels"} <= set(entry):
        what = sorted(entry) if isinstance(entry, Mapping) else type(entry).__name__
        raise DetloaderValueError(
            f"a prediction must be an ImagePredictions or a dict with boxes, scores, labels; got {what}"
        )
    image_id = entry.get("image_id", image_id)
    if image_id is None:
        raise DetloaderValueError(f"a prediction without image_id (keys {sorted(entry)})")
    boxes = _array(entry["boxes"], np.float32)
    boxes = boxes.reshape(0, 4) if boxes.size == 0 else boxes
    scores, labels = _array(entry["scores"], np.float32).reshape(-1), _array(entry["labels"], np.int64).reshape(-1)
    n = len(boxes)
    raw = entry.get("landmarks")
    lms = np.zeros((n, 0, 2), np.float32) if raw is None else _array(raw, np.float32)
    lms = lms.reshape(n, 0, 2) if lms.size == 0 else lms
    probs = _array(entry.get("image_probs", ()), np.float32).reshape(-1)
    if boxes.ndim != 2 or boxes.shape[1] != 4 or len(scores) != n or len(labels) != n or lms.ndim != 3 or (
        lms.shape[::2] != (n, 2)
    ):
        raise DetloaderValueError(
            f"image_id={image_id}: boxes {boxes.shape}, scores {scores.shape}, labels {labels.shape}, landmarks "
            f"{lms.shape}; expected [P, 4], [P], [P], [P, K, 2]"
        )
    return ImagePredictions(int(image_id), boxes, scores, labels, lms, probs)


# -- COCO mAP ---------------------------------------------------------------------------------
def evaluation_image_ids(index: Any) -> np.ndarray:
    """int64 ``[n]``: the id of each row in the evaluator and the results file, the dataset's own
    (``index.image_ids``). Ids that repeat (splits of several COCO files read together) are
    refused: evaluate one split."""
    ids = np.asarray(index.image_ids, dtype=np.int64)
    uniq, counts = np.unique(ids, return_counts=True)
    if len(uniq) != len(ids):
        dup = int(uniq[counts > 1][0])
        rows = np.flatnonzero(ids == dup)[:2].tolist()
        raise DetloaderValueError(
            f"image id {dup} belongs to rows {rows[0]} and {rows[1]} of the evaluated images: their ids come "
            "from several annotation files; evaluate one split (e.g. index.split('val'), --split val)"
        )
    return ids


def coco_ground_truth(index: Any) -> dict[str, Any]:
    """The index as a COCO ``instances`` dict with the dataset's ids: image ``id`` =
    ``index.image_ids``, category ``id`` = ``index.category_ids``, ``bbox`` xywh pixels,
    ``iscrowd`` = ``index.crowd``; a difficult object gets ``area`` :data:`DIFFICULT_AREA`
    (ignored by the evaluator, as the VOC devkit ignores it)."""
    image_ids = evaluation_image_ids(index).tolist()
    cat_ids = index.category_ids.tolist()
    images = [{"id": image_ids[i], "width": int(index.width[i]), "height": int(index.height[i])}
              for i in range(len(index))]
    cats = [{"id": cat_ids[c], "name": name} for c, name in enumerate(index.classes)]
    anns = []
    owner = index.object_image.tolist()
    crowd, difficult = index.crowd.tolist(), index.difficult.tolist()
    for j, (box, label) in enumerate(zip(index.boxes.tolist(), index.labels.tolist())):
        x1, y1, x2, y2 = box
        w, h = max(x2 - x1, 0.0), max(y2 - y1, 0.0)
        anns.append({"id": j + 1, "image_id": image_ids[owner[j]], "category_id": cat_ids[label],
                     "bbox": [x1, y1, w, h], "area": DIFFICULT_AREA if difficult[j] else w * h,
                     "iscrowd": int(crowd[j])})
    return {"images": images, "categories": cats, "annotations": anns}


def _detections(
    index: Any, predictions: Sequence[ImagePredictions], keypoints: bool = False
) -> list[dict[str, Any]]:
    """COCO results of ``predictions`` (image ids: rows of ``index``; labels: class indexes),
    numbered with the dataset's image and category ids."""
    image_ids = evaluation_image_ids(index).tolist()
    cat_ids = index.category_ids.tolist()
    out = []
    for p in predictions:
        for j, (box, score, label) in enumerate(zip(p.boxes.tolist(), p.scores.tolist(), p.labels.tolist())):
            x1, y1, x2, y2 = box
            out.append({"image_id": image_ids[p.image_id], "category_id": cat_ids[label],
                        "bbox": [x1, y1, max(x2 - x1, 0.0), max(y2 - y1, 0.0)], "score": float(score)})
            if keypoints and p.landmarks.shape[1]:
                out[-1]["keypoints"] = [v for x, y in p.landmarks[j].tolist() for v in (x, y, 1)]
    return out


def _backend(name: str) -> str:
    if name not in BACKENDS:
        raise DetloaderValueError(f"backend={name!r} is not one of {BACKENDS}")
    order = ("faster_coco_eval", "pycocotools") if name == "auto" else (name,)
    for candidate in order:
        with contextlib.suppress(ImportError):
            __import__(candidate)
            return candidate
    raise MissingExtraError(
        f"backend={name!r}: {' or '.join(order)} is not installed; detloader installs pycocotools "
        "(pip install pycocotools), faster-coco-eval comes with pip install 'detloader[eval]'"
    )


def coco_evaluate(gt: dict[str, Any], detections: list[dict[str, Any]], backend: Backend = "auto") -> dict[str, Any]:
    """COCO bbox evaluation, quietly: ``{"backend", "stats" [12], "precision" [T, R, C],
    "scores" [T, R, C], "recall" [T, C]}`` (area "all", 100 detections; -1 where a class
    has no ground truth). Every image of ``gt`` is evaluated. No detections at all give zeros."""
    name = _backend(backend)
    c = len(gt["categories"])
    if not detections:
        curves = np.zeros((10, 101, c))
        return {"backend": name, "stats": np.zeros(12), "precision": curves, "scores": curves,
                "recall": np.zeros((10, c))}
    with contextlib.redirect_stdout(io.StringIO()):
        if name == "faster_coco_eval":
            from faster_coco_eval import COCO, COCOeval_faster

            coco_gt = COCO(gt)
            coco_dt = coco_gt.loadRes(detections)
            ev = COCOeval_faster(coco_gt, coco_dt, "bbox")
        else:
            from pycocotools.coco import COCO
            from pycocotools.cocoeval import COCOeval

            coco_gt = COCO()
            coco_gt.dataset = gt
            coco_gt.createIndex()
            coco_dt = coco_gt.loadRes(detections)
            ev = COCOeval(coco_gt, coco_dt, "bbox")
        ev.evaluate()
        ev.accumulate()
        ev.summarize()
    return {
        "backend": name,
        "stats": np.asarray(ev.stats, dtype=np.float64),
        "precision": np.asarray(ev.eval["precision"])[:, :, :, 0, -1],
        "scores": np.asarray(ev.eval["scores"])[:, :, :, 0, -1],
        "recall": np.asarray(ev.eval["recall"])[:, :, 0, -1],
    }


def _mean_valid(values: np.ndarray) -> float | None:
    v = values[values > -1]
    return float(v.mean()) if v.size else None


def operating_point(gt: dict[str, Any], detections: list[dict[str, Any]], threshold: float) -> np.ndarray:
    """int64 ``[C, 3]``: TP, FP, FN per category of ``gt`` (in its order) for the detections
    with score >= ``threshold``, at IoU :data:`OPERATING_IOU`, as pycocotools' ``COCOeval``
    matches them (greedy by score, per image and category, at most 100 detections per image;
    crowd and ignored ground truth neither missed nor, when matched, false positives)."""
    cats = [c["id"] for c in gt["categories"]]
    out = np.zeros((len(cats), 3), dtype=np.int64)
    row = {cid: k for k, cid in enumerate(cats)}
    kept = [d for d in detections if d["score"] >= threshold]
    if not kept:  # pycocotools refuses an empty results list: every ground truth is missed
        for ann in gt["annotations"]:
            if not ann["iscrowd"] and ann["area"] >= 0:
                out[row[ann["category_id"]], 2] += 1
        return out
    try:
        from pycocotools.coco import COCO
        from pycocotools.cocoeval import COCOeval
    except ImportError as err:
        raise MissingExtraError("TP / FP / FN counts need pycocotools: pip install pycocotools") from err
    with contextlib.redirect_stdout(io.StringIO()):
        coco_gt = COCO()
        coco_gt.dataset = gt
        coco_gt.createIndex()
        ev = COCOeval(coco_gt, coco_gt.loadRes(kept), "bbox")
        ev.params.iouThrs = np.array([OPERATING_IOU])
        ev.params.areaRng = [[0.0, 1e10]]
        ev.params.areaRngLbl = ["all"]
        ev.params.maxDets = [100]
        ev.evaluate()
    for e in ev.evalImgs:
        if e is None:
            continue
        k = row[e["category_id"]]
        matched = np.asarray(e["dtMatches"][0]) > 0
        ignored = np.asarray(e["dtIgnore"][0], dtype=bool)
        tp = int((matched & ~ignored).sum())
        out[k, 0] += tp
        out[k, 1] += int((~matched & ~ignored).sum())
        out[k, 2] += int((~np.asarray(e["gtIgnore"], dtype=bool)).sum()) - tp
    return out


def _ratio(a: int, b: int) -> float | None:
    return a / b if b else None


def _per_class(
    result: dict[str, Any], classes: Sequence[str], counts: np.ndarray, ignored: np.ndarray, point: np.ndarray
) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, name in enumerate(classes):
        tp, fp, fn = (int(v) for v in point[k])
        scored = counts[k] > ignored[k]
        out[name] = {
            "objects": int(counts[k]),
            "ignored": int(ignored[k]),
            "tp": tp,
            "fp": fp,
            "fn": fn,
            "precision": _ratio(tp, tp + fp),
            "recall": _ratio(tp, tp + fn),
            "max_recall": float(result["recall"][0, k]) if scored else None,
            "ap50": _mean_valid(result["precision"][0, :, k]) if scored else None,
            "ap50_95": _mean_valid(result["precision"][:, :, k]) if scored else None,
        }
    return out


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


# -- checks -----------------------------------------------------------------------------------
def _check(p: ImagePredictions, n_images: int, n_classes: int) -> None:
    """``p`` can be scored against an index of ``n_images`` rows and ``n_classes`` classes, else a
    :class:`PredictionError` naming the value."""
    if not 0 <= p.image_id < n_images:
        raise PredictionError(
            f"image_id={p.image_id} is not a row of the index ({n_images} images); pass ids='dataset' to "
            "score_predictions for the dataset's own image ids"
        )
    bad = np.flatnonzero((p.labels < 0) | (p.labels >= n_classes))
    if bad.size:
        raise PredictionError(
            f"image_id={p.image_id}: label {int(p.labels[bad[0]])} is not a class index of the dataset (0.."
            f"{n_classes - 1}); pass labels='category' to score_predictions for the dataset's category ids"
        )
    bad = np.flatnonzero(~np.isfinite(p.boxes).all(axis=1))
    if bad.size:
        raise PredictionError(
            f"image_id={p.image_id}: box {bad[0]} is {p.boxes[bad[0]].tolist()}; boxes must be finite xyxy pixels "
            "(drop or fix NaN / inf boxes before scoring)"
        )
    bad = np.flatnonzero(~((p.scores >= 0.0) & (p.scores <= 1.0)))
    if bad.size:
        raise PredictionError(
            f"image_id={p.image_id}: score {float(p.scores[bad[0]])!r} is outside [0, 1]; scores rank detections "
            "and meet score_threshold as probabilities: apply the sigmoid / softmax first"
        )


# -- all together -----------------------------------------------------------------------------
def compute_metrics(
    index: Any, predictions: Sequence[ImagePredictions], *, score_threshold: float = 0.3, backend: Backend = "auto"
) -> dict[str, Any]:
    """Every metric of the module docstring as a JSON-ready dict (keys ``map50``,
    ``map50_95``, ``per_class`` (per class ``objects``, ``ignored`` (crowd or difficult),
    ``tp``, ``fp``, ``fn``, ``precision``, ``recall``, ``max_recall``, ``ap50``,
    ``ap50_95``), ``tp``, ``fp``, ``fn``, ``precision``, ``recall`` (all classes, at
    ``score_threshold`` and IoU 0.5), ``score_threshold``, ``nme``, ``nme_normaliser``,
    ``nme_objects``, ``image_class_accuracy``, ``image_class_recall``, ``images``,
    ``images_with_predictions``, ``backend``).

    ``index`` is the evaluated split, every image of it counted (one without a prediction entry
    is all misses); each prediction's ``image_id`` is a row of it and its labels class indexes
    (:class:`PredictionError` otherwise, and for NaN boxes or scores outside [0, 1])."""
    if not 0.0 <= score_threshold <= 1.0:
        raise DetloaderValueError(f"score_threshold={score_threshold!r} must be in [0, 1]")
    seen = {p.image_id for p in predictions}
    if len(seen) != len(predictions):
        raise DetloaderValueError("predictions: an image_id appears twice (a rank evaluated an image twice?)")
    for p in predictions:
        _check(p, len(index), len(index.classes))
    predictions = sorted(predictions, key=lambda p: p.image_id)
    gt = coco_ground_truth(index)
    detections = _detections(index, predictions)
    result = coco_evaluate(gt, detections, backend)
    n_classes = len(index.classes)
    labels = np.asarray(index.labels, dtype=np.int64)
    counts = np.bincount(labels, minlength=n_classes)
    ignored = np.bincount(labels[np.asarray(index.crowd) | np.asarray(index.difficult)], minlength=n_classes)
    point = operating_point(gt, detections, score_threshold)
    tp, fp, fn = (int(v) for v in point.sum(axis=0))
    nme, normaliser, nme_objects = _nme(index, predictions)
    accuracy, recall = _image_class(index, predictions)
    return {
        "map50": float(result["stats"][1]),
        "map50_95": float(result["stats"][0]),
        "per_class": _per_class(result, index.classes, counts, ignored, point),
        "tp": tp,
        "fp": fp,
        "fn": fn,
        "precision": _ratio(tp, tp + fp),
        "recall": _ratio(tp, tp + fn),
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


def score_predictions(
    predictions: Sequence[Any] | Mapping[int, Any],
    index: Any,
    *,
    ids: ImageIds = "row",
    labels: LabelIds = "index",
    score_threshold: float = 0.3,
    backend: Backend = "auto",
    coco_json: str | os.PathLike[str] | None = None,
) -> dict[str, Any]:
    """Any model's predictions scored: the metrics of :func:`compute_metrics` (what
    ``train`` and ``detloader evaluate`` report).

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
    against the dataset's own annotation file."""
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
    for p in preds:
        _check(p, len(index), len(index.classes))
    if coco_json is not None:
        Path(coco_json).write_text(json.dumps(_detections(index, preds, keypoints=True)), encoding="utf-8")
    return compute_metrics(index, preds, score_threshold=score_threshold, backend=backend)
