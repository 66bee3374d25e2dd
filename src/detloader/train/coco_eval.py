"""COCO box mAP by a well-kept evaluator (pycocotools, or faster-coco-eval with the ``eval`` extra;
not a home-made matcher) and per-class TP / FP / FN at an operating point by pycocotools' own
matching: the index as COCO ground truth with the dataset's own ids (crowd regions ``iscrowd: 1``,
difficult objects ignored), the predictions as COCO detections. docs/training.md, "Evaluation".
"""

from __future__ import annotations

import contextlib
import io
from collections.abc import Sequence
from typing import Any, Literal

import numpy as np

from detloader.errors import DetloaderValueError, MissingExtraError
from detloader.train.predictions import ImagePredictions

Backend = Literal["auto", "faster_coco_eval", "pycocotools"]
BACKENDS: tuple[str, ...] = ("auto", "faster_coco_eval", "pycocotools")
#: IoU of the operating point (TP / FP / FN counts).
OPERATING_IOU = 0.5
#: The area given to a difficult object in the evaluator's ground truth: below every area range,
#: so pycocotools ignores it (matched by IoU like any object, neither a miss nor, when matched,
#: a false positive), as the VOC devkit does.
DIFFICULT_AREA = -1.0


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


def coco_detections(
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


def rates(point: np.ndarray) -> dict[str, Any]:
    """``tp``, ``fp``, ``fn`` of ``point`` (``[3]``) and the ``precision`` and ``recall`` they give (None: 0 / 0)."""
    tp, fp, fn = (int(v) for v in point)
    return {"tp": tp, "fp": fp, "fn": fn, "precision": tp / (tp + fp) if tp + fp else None,
            "recall": tp / (tp + fn) if tp + fn else None}


def per_class(
    result: dict[str, Any], classes: Sequence[str], counts: np.ndarray, ignored: np.ndarray, point: np.ndarray
) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, name in enumerate(classes):
        scored = counts[k] > ignored[k]
        out[name] = {
            "objects": int(counts[k]),
            "ignored": int(ignored[k]),
            **rates(point[k]),
            "max_recall": float(result["recall"][0, k]) if scored else None,
            "ap50": _mean_valid(result["precision"][0, :, k]) if scored else None,
            "ap50_95": _mean_valid(result["precision"][:, :, k]) if scored else None,
        }
    return out
