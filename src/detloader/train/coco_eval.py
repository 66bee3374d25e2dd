"""COCO box mAP by a well-kept evaluator (pycocotools, or faster-coco-eval with the ``eval`` extra;
not a home-made matcher) and per-class TP / FP / FN at an operating point by pycocotools' own
matching: the index as COCO ground truth with the dataset's own ids (crowd regions ``iscrowd: 1``,
difficult objects ignored), the predictions as COCO detections. The LVIS protocol (``"lvis"``)
scores as lvis-api's ``LVISEval``: at most 300 detections per image, a detection of a class
neither annotated on its image nor verified absent from it not scored, an unmatched detection of
a class not exhaustively annotated on its image ignored (faster-coco-eval's ``lvis_style``; on
pycocotools the same rules on its per-image results). docs/training.md, "Evaluation".
"""

from __future__ import annotations

import contextlib
import io
from collections import defaultdict
from collections.abc import Sequence
from typing import Any, Literal

import numpy as np

from detloader.errors import DetloaderValueError, MissingExtraError
from detloader.train.predictions import ImagePredictions

Backend = Literal["auto", "faster_coco_eval", "pycocotools"]
BACKENDS: tuple[str, ...] = ("auto", "faster_coco_eval", "pycocotools")
Protocol = Literal["auto", "coco", "lvis", "openimages"]
PROTOCOLS: tuple[str, ...] = ("auto", "coco", "lvis", "openimages")
#: LVIS scores at most this many detections per image, the highest-scoring ones.
LVIS_MAX_DETS = 300
#: LVIS's per-image category lists in its files and the evaluator, and the index's class list of each.
LVIS_LISTS = (("neg_category_ids", "absent"), ("not_exhaustive_category_ids", "not_exhaustive"))
#: The evaluator's area ranges, in its order (AP, APs, APm, APl), and the row of IoU 0.75 in its 0.50:0.05:0.95.
AREAS = ("all", "small", "medium", "large")
AREA_RANGES = ((0.0, 1e10), (0.0, 32.0**2), (32.0**2, 96.0**2), (96.0**2, 1e10))
IOU75 = 5
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


def evaluation_protocol(index: Any, protocol: str = "auto") -> str:
    """``"coco"``, ``"lvis"`` or ``"openimages"``: ``protocol`` itself, or for ``"auto"`` Open
    Images when the index carries its class hierarchy (``meta["hierarchy"]``) or classes verified
    present, else LVIS when it carries LVIS's fields (a class frequency, absent or not-exhaustive
    class lists), else COCO."""
    if protocol not in PROTOCOLS:
        raise DetloaderValueError(f"protocol={protocol!r} is not one of {', '.join(PROTOCOLS)}")
    if protocol != "auto":
        return protocol
    has = {name: len(index.class_lists(name)[0]) > 0 for name in ("absent", "present", "not_exhaustive")}
    if "hierarchy" in index.meta or has["present"]:
        return "openimages"
    lvis = index.meta.get("frequency") is not None or has["absent"] or has["not_exhaustive"]
    return "lvis" if lvis else "coco"


def coco_ground_truth(index: Any, protocol: str = "coco") -> dict[str, Any]:
    """The index as a COCO ``instances`` dict with the dataset's ids: image ``id`` =
    ``index.image_ids``, category ``id`` = ``index.category_ids``, ``bbox`` xywh pixels,
    ``iscrowd`` = ``index.crowd``, ``area`` the object's own (``index.area``: COCO's and LVIS's
    mask area, which decides APs / APm / APl as there) else the box's; a difficult object gets
    ``area`` :data:`DIFFICULT_AREA` (ignored by the evaluator, as the VOC devkit ignores it).
    ``protocol="lvis"``: each image also has LVIS's ``neg_category_ids`` and
    ``not_exhaustive_category_ids`` (its class lists)."""
    image_ids = evaluation_image_ids(index).tolist()
    cat_ids = index.category_ids.tolist()
    images = [{"id": image_ids[i], "width": int(index.width[i]), "height": int(index.height[i])}
              for i in range(len(index))]
    for key, name in LVIS_LISTS if protocol == "lvis" else ():
        values, offsets = index.class_lists(name)
        ids = index.category_ids[values].tolist()
        for i, image in enumerate(images):
            image[key] = ids[offsets[i] : offsets[i + 1]]
    cats = [{"id": cat_ids[c], "name": name} for c, name in enumerate(index.classes)]
    anns = []
    owner = index.object_image.tolist()
    crowd, difficult, area = index.crowd.tolist(), index.difficult.tolist(), index.area.tolist()
    for j, (box, label) in enumerate(zip(index.boxes.tolist(), index.labels.tolist())):
        x1, y1, x2, y2 = box
        w, h = max(x2 - x1, 0.0), max(y2 - y1, 0.0)
        own = w * h if area[j] < 0 else area[j]  # MISSING: the file gives none
        anns.append({"id": j + 1, "image_id": image_ids[owner[j]], "category_id": cat_ids[label],
                     "bbox": [x1, y1, w, h], "area": DIFFICULT_AREA if difficult[j] else own,
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


def lvis_detections(gt: dict[str, Any], detections: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The detections LVIS scores: per image the :data:`LVIS_MAX_DETS` highest scores (ties in
    their order), and of those only the classes annotated on the image or verified absent from
    it (``neg_category_ids``); a detection of any other class is not scored."""
    scored: dict[Any, set[int]] = {image["id"]: set(image.get("neg_category_ids", ())) for image in gt["images"]}
    for ann in gt["annotations"]:
        scored[ann["image_id"]].add(ann["category_id"])
    per_image: dict[Any, list[dict[str, Any]]] = defaultdict(list)
    for det in detections:
        per_image[det["image_id"]].append(det)
    out = []
    for image_id, dets in per_image.items():
        top = sorted(dets, key=lambda d: d["score"], reverse=True)[:LVIS_MAX_DETS]
        out += [d for d in top if d["category_id"] in scored.get(image_id, ())]
    return out


def _pycocotools(gt: dict[str, Any], detections: list[dict[str, Any]], lvis: bool, **params: Any) -> Any:
    """pycocotools' ``COCOeval`` of ``detections`` (already :func:`lvis_detections` for LVIS),
    evaluated (not accumulated) with ``params`` set; for LVIS with 300 detections per image and
    an unmatched detection of a class not exhaustively annotated on its image ignored."""
    from pycocotools.coco import COCO
    from pycocotools.cocoeval import COCOeval

    coco_gt = COCO()
    coco_gt.dataset = gt
    coco_gt.createIndex()
    ev = COCOeval(coco_gt, coco_gt.loadRes(detections), "bbox")
    for key, value in {**params, **({"maxDets": [LVIS_MAX_DETS]} if lvis else {})}.items():
        setattr(ev.params, key, value)
    ev.evaluate()
    if lvis:
        partial = {image["id"]: set(image.get("not_exhaustive_category_ids", ())) for image in gt["images"]}
        for e in ev.evalImgs:
            if e is not None and e["category_id"] in partial.get(e["image_id"], ()):
                e["dtIgnore"] = np.logical_or(e["dtIgnore"], np.asarray(e["dtMatches"]) == 0)
    return ev


def coco_evaluate(
    gt: dict[str, Any], detections: list[dict[str, Any]], backend: Backend = "auto", protocol: str = "coco"
) -> dict[str, Any]:
    """Box evaluation by the COCO or LVIS protocol (``protocol``, see the module docstring),
    quietly: ``{"backend", "protocol", "stats" [6]: AP, AP50, AP75, APs, APm, APl (-1 where no
    class has ground truth), "precision" [T, R, C], "scores" [T, R, C], "recall" [T, C]}`` (area
    "all", the most detections: 100, LVIS 300; -1 where a class has no ground truth). Every
    image of ``gt`` is evaluated (LVIS: with its lists, :func:`coco_ground_truth`). No
    detection to score gives zeros (AP 0 in each size range with an object, -1 in the others)."""
    name = _backend(backend)
    lvis = protocol == "lvis"
    detections = lvis_detections(gt, detections) if lvis else detections
    c = len(gt["categories"])
    if not detections:  # every scored object missed: AP 0 in each area range that has one
        areas = [a["area"] for a in gt["annotations"] if not a["iscrowd"]]
        ap = [0.0 if any(lo <= x <= hi for x in areas) else -1.0 for lo, hi in AREA_RANGES]
        curves = np.zeros((10, 101, c))
        return {"backend": name, "protocol": protocol, "stats": np.asarray([ap[0], ap[0], *ap]), "precision": curves,
                "scores": curves, "recall": np.zeros((10, c))}
    with contextlib.redirect_stdout(io.StringIO()):
        if name == "faster_coco_eval":
            from faster_coco_eval import COCO, COCOeval_faster

            coco_gt = COCO(gt)
            ev = COCOeval_faster(coco_gt, coco_gt.loadRes(detections), "bbox", lvis_style=lvis)
            if lvis:
                ev.params.maxDets = [LVIS_MAX_DETS]
                ev._prepare_freq_group = lambda: [[], [], []]  # its APr / APc / APf are not read (frequency_ap)
            ev.evaluate()
        else:
            ev = _pycocotools(gt, detections, lvis)
        ev.accumulate()
    precision = np.asarray(ev.eval["precision"])[..., -1]  # [T, R, C, A] at the most detections
    stats = [precision[:, :, :, 0], precision[0, :, :, 0], precision[IOU75, :, :, 0],
             *(precision[..., a] for a in range(1, len(AREAS)))]
    return {
        "backend": name,
        "protocol": protocol,
        "stats": np.asarray([-1.0 if (m := _mean_valid(s)) is None else m for s in stats]),
        "precision": precision[..., 0],
        "scores": np.asarray(ev.eval["scores"])[:, :, :, 0, -1],
        "recall": np.asarray(ev.eval["recall"])[:, :, 0, -1],
    }


def _mean_valid(values: np.ndarray) -> float | None:
    v = values[values > -1]
    return float(v.mean()) if v.size else None


def operating_point(
    gt: dict[str, Any], detections: list[dict[str, Any]], threshold: float, protocol: str = "coco"
) -> np.ndarray:
    """int64 ``[C, 3]``: TP, FP, FN per category of ``gt`` (in its order) for the detections
    with score >= ``threshold``, at IoU :data:`OPERATING_IOU`, as pycocotools' ``COCOeval``
    matches them (greedy by score, per image and category, at most 100 detections per image;
    crowd and ignored ground truth neither missed nor, when matched, false positives); by the
    LVIS ``protocol``, of the detections LVIS scores, with its ignored ones not counted."""
    cats = [c["id"] for c in gt["categories"]]
    out = np.zeros((len(cats), 3), dtype=np.int64)
    row = {cid: k for k, cid in enumerate(cats)}
    lvis = protocol == "lvis"
    kept = [d for d in (lvis_detections(gt, detections) if lvis else detections) if d["score"] >= threshold]
    if not kept:  # pycocotools refuses an empty results list: every ground truth is missed
        for ann in gt["annotations"]:
            if not ann["iscrowd"] and ann["area"] >= 0:
                out[row[ann["category_id"]], 2] += 1
        return out
    try:
        import pycocotools  # noqa: F401
    except ImportError as err:
        raise MissingExtraError("TP / FP / FN counts need pycocotools: pip install pycocotools") from err
    with contextlib.redirect_stdout(io.StringIO()):
        ev = _pycocotools(gt, kept, lvis, iouThrs=np.array([OPERATING_IOU]), areaRng=[[0.0, 1e10]],
                          areaRngLbl=["all"], maxDets=[100])
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
