"""COCO JSON writer: ``<file_name>`` and ``images/``."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import numpy as np

from detloader._files import atomic_write
from detloader.annotations.index import AnnotationIndex
from detloader.annotations.landmarks import skeleton_for
from detloader.annotations.writers.common import ImagePlacer, attribute_rows, image_attributes, prepare_out


def write_coco(
    index: AnnotationIndex, out: str | os.PathLike[str], *, images: str = "link", overwrite: bool = False,
    image_class_attribute: str = "class", file_name: str = "annotations.json",
) -> Path:
    """Write ``out/<file_name>`` and ``out/images/<image>`` (unless ``images="none"``); return
    the JSON's path. Categories get ids 1..C in class order; what is kept: docs/formats.md
    ("Writing").
    """
    placer = ImagePlacer(index, images)
    root = prepare_out(out, overwrite)
    img_dir = root / "images"
    image_attrs = attribute_rows(index.image_attributes, index.vocab.image_attributes)
    object_attrs = attribute_rows(index.object_attributes, index.vocab.object_attributes)
    schema = index.landmark_schema
    k = len(schema)
    with_points = np.zeros(len(index.classes), dtype=bool)
    if k and index.num_objects:
        has = index.visibility.any(axis=1)
        with_points[np.unique(index.labels[has])] = True
    category_ids = index.category_ids.tolist()
    image_ids = index.image_ids.tolist()
    if len(set(image_ids)) != len(image_ids):  # several files' ids together: renumbered by row
        image_ids = list(range(1, len(index) + 1))
    categories: list[dict[str, Any]] = []
    for c, name in enumerate(index.classes):
        cat: dict[str, Any] = {"id": category_ids[c], "name": name, "supercategory": ""}
        if with_points[c]:
            cat["keypoints"] = list(schema.names)
            cat["skeleton"] = skeleton_for(schema)
        categories.append(cat)
    image_records: list[dict[str, Any]] = []
    annotations: list[dict[str, Any]] = []
    for i in range(len(index)):
        target = placer.place(i, img_dir)
        name = os.path.relpath(target, root if images == "none" else img_dir)
        record: dict[str, Any] = {
            "id": image_ids[i],
            "file_name": name.replace(os.sep, "/"),
            "width": int(index.width[i]),
            "height": int(index.height[i]),
        }
        attrs = image_attributes(index, image_attrs, i, image_class_attribute)
        if attrs:
            record["attributes"] = attrs
        image_records.append(record)
        for j in range(int(index.object_offsets[i]), int(index.object_offsets[i + 1])):
            ids = (image_ids[i], category_ids[int(index.labels[j])])
            annotations.append(_coco_annotation(index, j, ids, object_attrs(j), with_points))
    data = {
        "info": {"description": "written by detloader", "version": "1.0"},
        "licenses": [],
        "images": image_records,
        "annotations": annotations,
        "categories": categories,
    }
    path = root / file_name
    with atomic_write(path, "w") as fh:
        json.dump(data, fh, ensure_ascii=False)
    return path


def _coco_annotation(
    index: AnnotationIndex, j: int, ids: tuple[int, int], attrs: dict[str, str], with_points: np.ndarray
) -> dict[str, Any]:
    """Object ``j`` as a COCO annotation; ``ids``: its image id and category id."""
    x1, y1, x2, y2 = (float(v) for v in index.boxes[j])
    w, h = x2 - x1, y2 - y1
    label = int(index.labels[j])
    crowd = bool(index.crowd[j]) or attrs.pop("iscrowd", "0") not in ("0", "", "false")
    for flag in ("occluded", "difficult", "truncated"):
        if getattr(index, flag)[j]:
            attrs[flag] = True  # type: ignore[assignment]
    ann: dict[str, Any] = {
        "id": j + 1,
        "image_id": ids[0],
        "category_id": ids[1],
        "bbox": [x1, y1, w, h],
        "area": w * h,
        "iscrowd": int(crowd),
        "segmentation": [],
    }
    if with_points[label]:
        triples: list[float] = []
        for (x, y), v in zip(index.landmarks[j], index.visibility[j]):
            triples += [float(x), float(y), int(v)] if v else [0, 0, 0]
        ann["keypoints"] = triples
        ann["num_keypoints"] = int((index.visibility[j] > 0).sum())
    if attrs:
        ann["attributes"] = attrs
    return ann
