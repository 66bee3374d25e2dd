"""Open Images Challenge box AP@0.5: the protocol of the TensorFlow Object Detection API's
``OpenImagesChallengeEvaluator`` (group-of weight 1) after its hierarchy expansion
(``oid_hierarchical_labels_expansion``), on plain data. docs/formats.md, "Open Images".

- Hierarchy: each ground truth box counts for its class and every ancestor (a copy of the box,
  group-of flag included); a class verified present is verified for its ancestors too, one
  verified absent for its descendants; detections are expanded as boxes are
  (``expand_detections``; the challenge itself leaves them as the model gave them).
- Verified classes of an image: its box classes and its verified present and absent classes.
  Detections of any other class are ignored (the image was never checked for it); detections of
  a verified absent class have nothing to match and are false positives.
- Matching, per image and class, detections by score: each takes the box of highest IoU; at IoU
  >= 0.5 it is a true positive if that box is free, else a false positive (as the VOC devkit).
  The rest then fall in the group-of box that holds most of them (intersection over the
  detection's area >= 0.5): all those in one group-of box count once, as one true positive with
  their highest score (a group-of box no detection falls in is one miss). Difficult boxes
  (never in Open Images) ignore what they match, as the evaluator does.
- AP: the VOC devkit's area under the interpolated precision / recall curve over every image, per
  class with ground truth; the mean over those classes.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from detloader.errors import DetloaderValueError
from detloader.train.predictions import ImagePredictions

#: The evaluator's cap on the detections of one class in one image (its ``nms_max_output_boxes``).
MAX_DETECTIONS = 10000


def _empty(dtype: Any) -> Any:
    return field(default_factory=lambda: np.zeros(0, dtype=dtype))


@dataclass(frozen=True)
class ImageTruth:
    """One image's ground truth: ``boxes`` float ``[M, 4]`` xyxy (pixels, or any unit the
    detections share), ``labels`` int ``[M]`` class indexes, ``group_of`` bool ``[M]``,
    ``difficult`` bool ``[M]`` (empty: none; a difficult group-of box is a group-of box), and
    the classes verified ``present`` and ``absent`` on the image (int, image-level labels of
    confidence 1 and 0)."""

    boxes: np.ndarray
    labels: np.ndarray
    group_of: np.ndarray
    difficult: np.ndarray = _empty(np.bool_)
    present: np.ndarray = _empty(np.int64)
    absent: np.ndarray = _empty(np.int64)


class _Closure:
    """Each class with its ancestors (``up``) or descendants (``down``), as flat index lists."""

    def __init__(self, members: Sequence[Sequence[int]]) -> None:
        lists = [np.unique(np.asarray([c, *m], dtype=np.int64)) for c, m in enumerate(members)]
        self.size = np.asarray([len(m) for m in lists], dtype=np.int64)
        self.start = np.concatenate([[0], np.cumsum(self.size)[:-1]]).astype(np.int64)
        self.flat = np.concatenate(lists) if lists else np.zeros(0, np.int64)

    def expand(self, labels: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(row of ``labels`` each copy comes from, its class) for every label and its relatives."""
        labels = np.asarray(labels, dtype=np.int64)
        size = self.size[labels]
        rows = np.repeat(np.arange(len(labels)), size)
        first = np.repeat(np.cumsum(size) - size, size)
        return rows, self.flat[np.repeat(self.start[labels], size) + np.arange(int(size.sum())) - first]


def ancestor_lists(classes: Sequence[str], hierarchy: Mapping[str, Sequence[str]] | None) -> list[list[int]]:
    """``hierarchy`` (class name -> the names of all its ancestors, as ``index.meta["hierarchy"]``
    holds it) as class indexes; a name that is no class is a :class:`DetloaderValueError`."""
    lookup = {name: c for c, name in enumerate(classes)}
    out: list[list[int]] = [[] for _ in classes]
    for name, ancestors in (hierarchy or {}).items():
        unknown = [n for n in (name, *ancestors) if n not in lookup]
        if unknown:
            raise DetloaderValueError(f"hierarchy: {unknown[0]!r} (ancestors of {name!r}) is not a class of the index")
        out[lookup[name]] = [lookup[n] for n in ancestors]
    return out


def _iou(a: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """IoU ``[N, M]`` and intersection over ``a``'s area ``[N, M]`` of xyxy boxes."""
    inter = np.prod(np.clip(np.minimum(a[:, None, 2:], b[None, :, 2:]) - np.maximum(a[:, None, :2], b[None, :, :2]),
                            0, None), axis=2)
    area_a = np.prod(a[:, 2:] - a[:, :2], axis=1)
    area_b = np.prod(b[:, 2:] - b[:, :2], axis=1)
    return inter / (area_a[:, None] + area_b[None] - inter), inter / area_a[:, None]


def _match(boxes: np.ndarray, scores: np.ndarray, gt: np.ndarray, group_of: np.ndarray, difficult: np.ndarray,
           threshold: float) -> tuple[np.ndarray, np.ndarray]:
    """Scores and true-positive weights of one class's detections in one image (sorted by
    score) against its ground truth: the module docstring's matching."""
    tp, ignored, in_group = (np.zeros(len(boxes), dtype=bool) for _ in range(3))
    single, groups = gt[~group_of], gt[group_of]
    if len(single):
        iou = _iou(boxes, single)[0]
        best = np.argmax(iou, axis=1)
        taken = np.zeros(len(single), dtype=bool)
        hard = difficult[~group_of]
        for k, g in enumerate(best.tolist()):
            if iou[k, g] >= threshold:
                if hard[g]:
                    ignored[k] = True
                elif not taken[g]:
                    tp[k] = taken[g] = True
    group_scores = np.zeros(len(groups))
    if len(groups):
        ioa = _iou(boxes, groups)[1]
        best = np.argmax(ioa, axis=1)
        for k, g in enumerate(best.tolist()):
            if not tp[k] and not ignored[k] and ioa[k, g] >= threshold:
                in_group[k] = True
                group_scores[g] = max(group_scores[g], scores[k])
    keep = ~ignored & ~in_group
    hit = group_scores[group_scores > 0]
    return np.concatenate([scores[keep], hit]), np.concatenate([tp[keep].astype(np.float64), np.ones(len(hit))])


def _average_precision(scores: np.ndarray, tp: np.ndarray, positives: int) -> float:
    """The VOC devkit's AP: area under the precision envelope at each recall reached."""
    if not len(scores):
        return 0.0
    tp = tp[np.argsort(-scores, kind="stable")]
    hits = np.cumsum(tp)
    precision = np.concatenate([[0.0], hits / np.arange(1, len(tp) + 1), [0.0]])
    recall = np.concatenate([[0.0], hits / positives, [1.0]])
    precision = np.maximum.accumulate(precision[::-1])[::-1]
    steps = np.flatnonzero(recall[1:] != recall[:-1]) + 1
    return float(np.sum((recall[steps] - recall[steps - 1]) * precision[steps]))


def openimages_ap(
    truth: Sequence[ImageTruth],
    detections: Sequence[ImagePredictions],
    classes: Sequence[str],
    hierarchy: Mapping[str, Sequence[str]] | None = None,
    *,
    expand_detections: bool = True,
    iou_threshold: float = 0.5,
) -> dict[str, Any]:
    """AP@``iou_threshold`` per class and its mean under the Open Images Challenge protocol (the
    module docstring). ``truth``: one entry per evaluated image; ``detections``: at most one per
    image, ``image_id`` its position in ``truth``, labels class indexes of ``classes``, boxes in
    the unit of ``truth``; ``hierarchy``: class name -> all its ancestors' names (None: flat).

    Returns ``map50`` (None: no class has ground truth), ``per_class`` (name -> ``ap50``, None
    without ground truth; ``objects``, the boxes counted after expansion, group-of ones included,
    other difficult ones not; ``group_of``, how many of them are group-of boxes),
    ``ignored_detections`` (of classes not verified in their image) and ``invalid_detections``
    (verified, but with no area: the evaluator drops them too)."""
    n = len(classes)
    ancestors = ancestor_lists(classes, hierarchy)
    descendants: list[list[int]] = [[] for _ in range(n)]
    for c, above in enumerate(ancestors):
        for a in above:
            descendants[a].append(c)
    up, down = _Closure(ancestors), _Closure(descendants)
    by_image = {int(p.image_id): p for p in detections}
    ranked: list[list[tuple[np.ndarray, np.ndarray]]] = [[] for _ in range(n)]
    objects, groups = np.zeros(n, dtype=np.int64), np.zeros(n, dtype=np.int64)
    ignored = invalid = 0
    for i, t in enumerate(truth):
        rows, gt_labels = up.expand(t.labels)
        gt_boxes = np.asarray(t.boxes, dtype=np.float64).reshape(-1, 4)[rows]
        group_of = np.asarray(t.group_of, dtype=bool)[rows]
        difficult = np.asarray(t.difficult, dtype=bool)[rows] if len(t.difficult) else np.zeros(len(rows), bool)
        objects += np.bincount(gt_labels[group_of | ~difficult], minlength=n)
        groups += np.bincount(gt_labels[group_of], minlength=n)
        p = by_image.get(i)
        if p is None or not len(p.labels):
            continue
        verified = np.concatenate([gt_labels, up.expand(t.present)[1], down.expand(t.absent)[1]])
        rows, labels = up.expand(p.labels) if expand_detections else (np.arange(len(p.labels)), p.labels)
        kept = np.isin(labels, verified)
        ignored += int((~kept).sum())
        boxes = np.asarray(p.boxes, dtype=np.float64)[rows[kept]]
        scores, labels = np.asarray(p.scores, dtype=np.float64)[rows[kept]], labels[kept]
        valid = (boxes[:, 0] < boxes[:, 2]) & (boxes[:, 1] < boxes[:, 3])
        invalid += int((~valid).sum())
        boxes, scores, labels = boxes[valid], scores[valid], labels[valid]
        for c in np.unique(labels).tolist():
            mine = np.flatnonzero(labels == c)
            mine = mine[np.argsort(-scores[mine], kind="stable")][:MAX_DETECTIONS]
            at = gt_labels == c
            ranked[c].append(
                _match(boxes[mine], scores[mine], gt_boxes[at], group_of[at], difficult[at], iou_threshold))
    per_class: dict[str, Any] = {}
    aps = []
    for c, name in enumerate(classes):
        ap = None
        if objects[c]:
            scores = np.concatenate([s for s, _ in ranked[c]]) if ranked[c] else np.zeros(0)
            tp = np.concatenate([w for _, w in ranked[c]]) if ranked[c] else np.zeros(0)
            ap = _average_precision(scores, tp, int(objects[c]))
            aps.append(ap)
        per_class[name] = {"ap50": ap, "objects": int(objects[c]), "group_of": int(groups[c])}
    return {"map50": float(np.mean(aps)) if aps else None, "per_class": per_class,
            "ignored_detections": ignored, "invalid_detections": invalid}


def index_truth(index: Any) -> list[ImageTruth]:
    """Each image of ``index`` as :class:`ImageTruth`: its boxes, labels, crowd flags (Open
    Images' group-of), difficult flags and ``present`` / ``absent`` class lists."""
    offsets = index.object_offsets.tolist()
    lists = {name: index.class_lists(name) for name in ("present", "absent")}
    out = []
    for i in range(len(index)):
        lo, hi = offsets[i], offsets[i + 1]
        verified = {name: v[o[i]:o[i + 1]] for name, (v, o) in lists.items()}
        out.append(ImageTruth(index.boxes[lo:hi], index.labels[lo:hi], index.crowd[lo:hi], index.difficult[lo:hi],
                              **verified))
    return out


def with_openimages_ap(metrics: dict[str, Any], index: Any, predictions: Sequence[ImagePredictions]) -> dict[str, Any]:
    """``metrics`` (:func:`~detloader.train.metrics.compute_metrics`) scored by this protocol:
    ``map50`` and each class's ``ap50`` are :func:`openimages_ap`'s (``index.meta["hierarchy"]``,
    detections expanded); ``map50_95``, ``ap50_95`` and the AP@0.5:0.95 means ``apr``, ``apc``,
    ``apf`` None (the protocol has no such figure);
    each class gains ``expanded_objects`` and ``group_of``; ``protocol`` is ``"openimages"``,
    with ``ignored_detections`` and ``invalid_detections``. The rest (TP / FP / FN at the
    operating point, NME, image class) is as the module it comes from computes it."""
    scored = openimages_ap(index_truth(index), predictions, index.classes, index.meta.get("hierarchy"))
    rows = metrics["per_class"]
    for name, row in scored["per_class"].items():
        rows[name].update(ap50=row["ap50"], ap50_95=None, expanded_objects=row["objects"], group_of=row["group_of"])
    return {**metrics, "map50": scored["map50"], "map50_95": None, "apr": None, "apc": None, "apf": None,
            "protocol": "openimages",
            "ignored_detections": scored["ignored_detections"], "invalid_detections": scored["invalid_detections"]}
