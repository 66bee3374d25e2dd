"""Metrics of predictions on an annotated split: COCO box mAP (faster-coco-eval or pycocotools, the ``eval``
extra, not a home-made matcher), per-class precision / recall, landmark NME (normaliser as mmpose's
``keypoint_2d_metrics``), image-class accuracy; what each is: docs/training.md, "Evaluation".

Ground truth comes from the index (annotation coordinates); predictions must already be mapped
back to them (``Batch.boxes_to_original``). Undefined figures (no landmark head, no image
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

from detloader.errors import DetloaderValueError, MissingExtraError

Backend = Literal["auto", "faster_coco_eval", "pycocotools"]
BACKENDS: tuple[str, ...] = ("auto", "faster_coco_eval", "pycocotools")


@dataclass(frozen=True)
class ImagePredictions:
    """Predictions for one image, in annotation coordinates (plain numpy: cheap to pickle
    between ranks).

    Attributes:
        image_id: row of the image in the index being evaluated.
        boxes: float32 ``[P, 4]`` xyxy pixels; scores: float32 ``[P]``; labels: int64 ``[P]``.
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
def coco_ground_truth(index: Any) -> dict[str, Any]:
    """The index as a COCO ``instances`` dict: image ids = index rows + 1, category ids =
    class ids + 1, ``bbox`` xywh pixels."""
    images = [{"id": i + 1, "width": int(index.width[i]), "height": int(index.height[i])} for i in range(len(index))]
    cats = [{"id": c + 1, "name": name} for c, name in enumerate(index.classes)]
    anns = []
    for j in range(index.num_objects):
        x1, y1, x2, y2 = (float(v) for v in index.boxes[j])
        w, h = max(x2 - x1, 0.0), max(y2 - y1, 0.0)
        anns.append({"id": j + 1, "image_id": int(index.object_image[j]) + 1, "category_id": int(index.labels[j]) + 1,
                     "bbox": [x1, y1, w, h], "area": w * h, "iscrowd": 0})
    return {"images": images, "categories": cats, "annotations": anns}


def _detections(predictions: Sequence[ImagePredictions], keypoints: bool = False) -> list[dict[str, Any]]:
    out = []
    for p in predictions:
        for j, (box, score, label) in enumerate(zip(p.boxes.tolist(), p.scores.tolist(), p.labels.tolist())):
            x1, y1, x2, y2 = box
            out.append({"image_id": p.image_id + 1, "category_id": int(label) + 1,
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
        f"backend={name!r}: {' or '.join(order)} is not installed; box mAP needs the 'eval' "
        "extra: pip install 'detloader[eval]'"
    )


def coco_evaluate(gt: dict[str, Any], detections: list[dict[str, Any]], backend: Backend = "auto") -> dict[str, Any]:
    """COCO bbox evaluation, quietly: ``{"backend", "stats" [12], "precision" [T, R, C],
    "scores" [T, R, C], "recall" [T, C]}`` (area "all", 100 detections; -1 where a class
    has no ground truth). No detections at all give zeros."""
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


def _per_class(result: dict[str, Any], classes: Sequence[str], counts: np.ndarray, threshold: float) -> dict[str, Any]:
    rec_thrs = np.linspace(0.0, 1.0, 101)
    out: dict[str, Any] = {}
    for k, name in enumerate(classes):
        prec50 = result["precision"][0, :, k]
        scores50 = result["scores"][0, :, k]
        reached = np.flatnonzero((scores50 >= threshold) & (prec50 > 0))
        if counts[k] == 0:
            precision = recall = None
        elif reached.size:
            r = int(reached[-1])
            precision, recall = float(prec50[r]), float(rec_thrs[r])
        else:
            precision, recall = 0.0, 0.0
        out[name] = {
            "objects": int(counts[k]),
            "precision": precision,
            "recall": recall,
            "max_recall": float(result["recall"][0, k]) if counts[k] else None,
            "ap50": _mean_valid(prec50) if counts[k] else None,
            "ap50_95": _mean_valid(result["precision"][:, :, k]) if counts[k] else None,
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
    classes = index.image_classes
    if not classes:
        return None, {}
    truth, guess = [], []
    for p in predictions:
        label = int(index.image_labels[p.image_id])
        if label >= 0 and p.image_probs.size:
            truth.append(label)
            guess.append(int(np.argmax(p.image_probs)))
    if not truth:
        return None, {name: None for name in classes}
    t, g = np.asarray(truth), np.asarray(guess)
    recall = {name: (float((g[t == c] == c).mean()) if (t == c).any() else None) for c, name in enumerate(classes)}
    return float((t == g).mean()), recall


# -- all together -----------------------------------------------------------------------------
def compute_metrics(
    index: Any, predictions: Sequence[ImagePredictions], *, score_threshold: float = 0.3, backend: Backend = "auto"
) -> dict[str, Any]:
    """Every metric of the module docstring as a JSON-ready dict (keys ``map50``,
    ``map50_95``, ``per_class``, ``score_threshold``, ``nme``, ``nme_normaliser``,
    ``nme_objects``, ``image_class_accuracy``, ``image_class_recall``, ``images``,
    ``backend``).

    ``index`` is the evaluated split; each prediction's ``image_id`` is a row of it; images
    without a prediction entry are left out of the evaluation."""
    if not 0.0 <= score_threshold <= 1.0:
        raise DetloaderValueError(f"score_threshold={score_threshold!r} must be in [0, 1]")
    seen = sorted({p.image_id for p in predictions})
    if len(seen) != len(predictions):
        raise DetloaderValueError("predictions: an image_id appears twice (a rank evaluated an image twice?)")
    sub = index.subset(np.asarray(seen, dtype=np.int64)) if len(seen) != len(index) else index
    if sub is not index:  # renumber the predictions to the rows of the subset
        row = {old: new for new, old in enumerate(seen)}
        predictions = [replace(p, image_id=row[p.image_id]) for p in predictions]
    gt = coco_ground_truth(sub)
    result = coco_evaluate(gt, _detections(predictions), backend)
    counts = np.bincount(np.asarray(sub.labels, dtype=np.int64), minlength=len(sub.classes))
    nme, normaliser, nme_objects = _nme(sub, predictions)
    accuracy, recall = _image_class(sub, predictions)
    return {
        "map50": float(result["stats"][1]),
        "map50_95": float(result["stats"][0]),
        "per_class": _per_class(result, sub.classes, counts, score_threshold),
        "score_threshold": score_threshold,
        "nme": nme,
        "nme_normaliser": normaliser,
        "nme_objects": nme_objects,
        "image_class_accuracy": accuracy,
        "image_class_recall": recall,
        "images": len(sub),
        "backend": result["backend"],
    }


def score_predictions(
    predictions: Sequence[Any] | Mapping[int, Any],
    index: Any,
    *,
    score_threshold: float = 0.3,
    backend: Backend = "auto",
    coco_json: str | os.PathLike[str] | None = None,
) -> dict[str, Any]:
    """Any model's predictions scored: the metrics of :func:`compute_metrics` (what
    ``train`` and ``detloader evaluate`` report).

    ``predictions``: one entry per image (:func:`as_predictions`: :class:`ImagePredictions`
    or dicts of tensors, arrays or lists in annotation coordinates), a sequence or a mapping
    ``{image_id: entry}``; an image id is a row of ``index``, the evaluated images (e.g.
    ``index.split("val")``: ``batch.image_ids`` of a loader over it). Images without an entry
    are left out. ``coco_json``: also write the detections there as a COCO results list
    (``image_id`` = row + 1, ``category_id`` = class id + 1, ``bbox`` xywh, ``score``, and
    ``keypoints`` x, y, 1 per landmark), numbered as :func:`coco_ground_truth` numbers the
    index."""
    entries = predictions.items() if isinstance(predictions, Mapping) else ((None, e) for e in predictions)
    preds = [as_predictions(entry, image_id) for image_id, entry in entries]
    outside = [p.image_id for p in preds if not 0 <= p.image_id < len(index)]
    if outside:
        raise DetloaderValueError(f"image_id={outside[0]} is not a row of the index ({len(index)} images)")
    if coco_json is not None:
        Path(coco_json).write_text(json.dumps(_detections(preds, keypoints=True)), encoding="utf-8")
    return compute_metrics(index, preds, score_threshold=score_threshold, backend=backend)
