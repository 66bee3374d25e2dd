"""COCO JSON writer: ``<file_name>`` or ``instances_<split>.json``, ``images/``, ``splits.json``."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import numpy as np

from detloader._system.files import atomic_write
from detloader.annotations.index import AnnotationIndex
from detloader.annotations.landmarks import skeleton_for
from detloader.annotations.readers.coco import CLASS_LIST_FIELDS
from detloader.annotations.splits import split_role, write_splits_json
from detloader.annotations.writers.common import ImagePlacer, attribute_rows, image_attributes, prepare_out
from detloader.errors import DetloaderValueError


def write_coco(
    index: AnnotationIndex, out: str | os.PathLike[str], *, images: str = "link", overwrite: bool = False,
    image_class_attribute: str = "class", file_name: str = "annotations.json",
) -> Path:
    """Write the COCO JSON and ``out/images/<image>`` (unless ``images="none"``); return the
    JSON's path, or ``out`` when there is one JSON per split.

    Without splits: ``out/<file_name>``. With splits that are files of their own
    (:func:`split_files`): ``out/instances_<split>.json`` each, which the COCO reader pairs
    as splits (as ``instances_train2017.json`` + ``instances_val2017.json``); otherwise
    ``out/<file_name>`` with every image. Splits the files do not give back as they are
    (``trainval``, images in no split, ``Train`` read back as ``train``) are written to
    ``splits.json`` beside them, which every read of the export takes as its splits. Categories
    get ids 1..C in class order; what is kept: docs/formats.md ("Writing").
    """
    placer = ImagePlacer(index, images)
    files = split_files(index)
    exact = files is not None and set(files) == set(index.splits) and all(split_role(n) == n for n in files)
    data_root = _dataset_root(Path(out))
    if index.splits and not exact and data_root != Path(out):
        raise DetloaderValueError(
            f"out={str(out)!r}: the splits {', '.join(index.splits)} need splits.json at the dataset root, which "
            f"for a COCO file in a folder named {Path(out).name!r} is the folder above; choose another out "
            "folder, or write one split (split=)"
        )
    root = prepare_out(out, overwrite)
    img_dir = root / "images"
    image_attrs = attribute_rows(index.image_attributes, index.vocab.image_attributes)
    object_attrs = attribute_rows(index.object_attributes, index.vocab.object_attributes)
    categories, with_points = _categories(index)
    category_ids = index.category_ids.tolist()
    image_ids = index.image_ids.tolist()
    if len(set(image_ids)) != len(image_ids):  # several files' ids together: renumbered by row
        image_ids = list(range(1, len(index) + 1))
    lvis = any(len(index.class_lists(name)[0]) for _, name in CLASS_LIST_FIELDS)  # LVIS's per-image lists
    image_records: list[dict[str, Any]] = []
    annotations: list[list[dict[str, Any]]] = []  # per image
    written: list[str] = []  # each image's path relative to the dataset root, "/" separated
    for i in range(len(index)):
        target = placer.place(i, img_dir)
        name = os.path.relpath(target, root if images == "none" else img_dir)
        written.append(Path(os.path.relpath(target, root)).as_posix())
        record: dict[str, Any] = {
            "id": image_ids[i],
            "file_name": name.replace(os.sep, "/"),
            "width": int(index.width[i]),
            "height": int(index.height[i]),
        }
        attrs = image_attributes(index, image_attrs, i, image_class_attribute)
        if attrs:
            record["attributes"] = attrs
        for key, list_name in CLASS_LIST_FIELDS if lvis else ():
            record[key] = [category_ids[c] for c in index.class_list(list_name, i).tolist()]
        image_records.append(record)
        annotations.append([
            _coco_annotation(index, j, (image_ids[i], category_ids[int(index.labels[j])]), object_attrs(j), with_points)
            for j in range(int(index.object_offsets[i]), int(index.object_offsets[i + 1]))
        ])
    parts = {file_name: np.arange(len(index))} if files is None else {
        f"instances_{name}.json": ids for name, ids in files.items()
    }
    for json_name, ids in parts.items():
        _write_json(root / json_name, [image_records[i] for i in ids], [a for i in ids for a in annotations[i]],
                    categories)
    if index.splits and not exact:
        from detloader._system import VERSION

        made = {"by": f"detloader {VERSION}", "converted_from": index.meta.get("format", "an index")}
        paths = {name: [written[int(i)] for i in ids] for name, ids in index.splits.items()}
        write_splits_json(root, paths, made)
    return root / file_name if files is None else root


def _categories(index: AnnotationIndex) -> tuple[list[dict[str, Any]], np.ndarray]:
    """The COCO categories of ``index``'s classes (its category ids), with the landmark names
    and skeleton for each class that has an object with a visible or hidden point; and which
    classes those are (bool ``[C]``)."""
    schema = index.landmark_schema
    with_points = np.zeros(len(index.classes), dtype=bool)
    if len(schema) and index.num_objects:
        has = index.visibility.any(axis=1)
        with_points[np.unique(index.labels[has])] = True
    category_ids = index.category_ids.tolist()
    frequency = index.meta.get("frequency") or {}
    categories: list[dict[str, Any]] = []
    for c, name in enumerate(index.classes):
        cat: dict[str, Any] = {"id": category_ids[c], "name": name, "supercategory": ""}
        if frequency.get(name) is not None:
            cat["frequency"] = frequency[name]
        if with_points[c]:
            cat["keypoints"] = list(schema.names)
            cat["skeleton"] = skeleton_for(schema)
        categories.append(cat)
    return categories, with_points


def _write_json(path: Path, images: list[dict[str, Any]], annotations: list[dict[str, Any]],
                categories: list[dict[str, Any]]) -> None:
    """One COCO file at ``path``, written atomically."""
    data = {
        "info": {"description": "written by detloader", "version": "1.0"},
        "licenses": [],
        "images": images,
        "annotations": annotations,
        "categories": categories,
    }
    with atomic_write(path, "w") as fh:
        json.dump(data, fh, ensure_ascii=False)


def split_files(index: AnnotationIndex) -> dict[str, np.ndarray] | None:
    """The splits of ``index`` to write as one COCO file each: its train / val / test splits
    (:func:`~detloader.annotations.splits.split_role`: ``train``, ``Validation``, ``test2``),
    when there are two or more (the reader pairs several files only), of distinct roles, and
    every image lies in exactly one of them; else None (one file for every image)."""
    named = {name: ids for name, ids in index.splits.items() if split_role(name) is not None}
    roles = [split_role(name) for name in named]
    if len(named) < 2 or len(set(roles)) < len(roles):
        return None
    times = np.zeros(len(index), dtype=np.int64)
    for ids in named.values():
        np.add.at(times, np.asarray(ids, dtype=np.int64), 1)
    return named if bool((times == 1).all()) else None


def _dataset_root(out: Path) -> Path:
    """The dataset root the COCO reader takes for a JSON in ``out``: the folder above one
    named ``annotations``, else ``out``."""
    return out.parent if out.name.lower() == "annotations" else out


def _coco_annotation(
    index: AnnotationIndex, j: int, ids: tuple[int, int], attrs: dict[str, str], with_points: np.ndarray
) -> dict[str, Any]:
    """Object ``j`` as a COCO annotation; ``ids``: its image id and category id."""
    x1, y1, x2, y2 = (float(v) for v in index.boxes[j])
    w, h = x2 - x1, y2 - y1
    area = float(index.area[j])
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
        "area": w * h if area < 0 else area,  # MISSING: the source gave none
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
