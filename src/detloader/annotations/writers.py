"""Write an :class:`~detloader.annotations.index.AnnotationIndex` as Pascal VOC, COCO JSON or YOLO.

``write_annotations(index, out, "voc" | "coco" | "yolo")`` (the ``detloader convert``
command) writes a new dataset folder ``out``; reading it back gives the same index (boxes,
classes, landmarks, and whatever else the target format can hold; see each writer). Images
are placed under ``out`` as hard links (``images="link"``, a copy where a link is refused),
copies (``"copy"``) or symbolic links (``"symlink"``), or left where they are and named by a
path relative to the annotation (``"none"``; VOC and COCO only). Their layout below the image
folder mirrors the source images below their common folder, so equal base names in
different folders stay apart.

Numbers are written exactly: a float32 coordinate is written with the fewest digits that read
back to the same float32 (VOC), or as the float64 that holds it (COCO), and YOLO's normalised
values carry full float64 precision.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any, Callable, Sequence
from xml.sax.saxutils import escape, quoteattr

import numpy as np
import yaml

from detloader.annotations.landmarks import skeleton_for
from detloader.annotations.index import MISSING, AnnotationIndex

EXPORT_FORMATS = ("voc", "coco", "yolo")
IMAGE_MODES = ("link", "copy", "symlink", "none")
#: Index split names that map to Ultralytics' data.yaml keys.
YOLO_SPLIT_KEYS = {
    "train": "train",
    "training": "train",
    "val": "val",
    "valid": "val",
    "validation": "val",
    "test": "test",
    "testing": "test",
}


def _check_choice(name: str, value: str, choices: Sequence[str]) -> None:
    if value not in choices:
        raise ValueError(f"{name}={value!r} is not one of {', '.join(choices)}")


def _prepare_out(out: str | os.PathLike[str], overwrite: bool) -> Path:
    path = Path(out)
    if path.exists() and not path.is_dir():
        raise ValueError(f"out={str(out)!r} is a file, not a folder")
    if path.is_dir() and any(path.iterdir()) and not overwrite:
        raise ValueError(f"out={str(out)!r} is not empty; pass overwrite=True (--overwrite) to write into it")
    path.mkdir(parents=True, exist_ok=True)
    return path


def _num(value: float) -> str:
    """Shortest text that reads back as the same float32 (``10``, ``10.5``, ``0.1``)."""
    return np.format_float_positional(np.float32(value), trim="-")


class _Images:
    """Where each image of the index goes under the output folder, and putting it there."""

    def __init__(self, index: AnnotationIndex, mode: str) -> None:
        _check_choice("images", mode, IMAGE_MODES)
        self.mode = mode
        self.sources = [os.path.abspath(index.image_path(i)) for i in range(len(index))]
        if self.sources:
            common = os.path.commonpath([os.path.dirname(s) for s in self.sources])
            self.keys = [os.path.relpath(s, common) for s in self.sources]
        else:
            self.keys = []

    def place(self, i: int, folder: Path) -> Path:
        """Put image ``i`` at ``folder/key`` (by the mode) and return that path; with mode
        ``"none"`` return the source path instead."""
        src = self.sources[i]
        if self.mode == "none":
            return Path(src)
        dst = folder / self.keys[i]
        dst.parent.mkdir(parents=True, exist_ok=True)
        if dst.exists() or dst.is_symlink():
            dst.unlink()
        if self.mode == "symlink":
            os.symlink(os.path.relpath(src, dst.parent), dst)
        elif self.mode == "link":
            try:
                os.link(src, dst)
            except OSError:
                shutil.copy2(src, dst)
        else:
            shutil.copy2(src, dst)
        return dst


def _attribute_rows(
    table: np.ndarray, vocab: Sequence[tuple[str, Sequence[str]]]
) -> Callable[[int], dict[str, str]]:
    def row(i: int) -> dict[str, str]:
        return {name: values[v] for (name, values), v in zip(vocab, table[i]) if v != MISSING}

    return row


def _unique_stems(keys: Sequence[str]) -> list[str]:
    """Annotation file names (without extension) for image keys; ``a.jpg`` and ``a.png`` in
    one folder become ``a`` and ``a.png``."""
    seen: set[str] = set()
    out = []
    for key in keys:
        stem = os.path.splitext(key)[0]
        if stem in seen:
            stem = key
        seen.add(stem)
        out.append(stem)
    return out


# -- Pascal VOC ------------------------------------------------------------------------------
def write_voc(
    index: AnnotationIndex,
    out: str | os.PathLike[str],
    *,
    images: str = "link",
    overwrite: bool = False,
    image_class_attribute: str = "class",
) -> Path:
    """Write ``out/Annotations/<image>.xml``, ``out/JPEGImages/<image>`` (unless
    ``images="none"``) and ``out/ImageSets/Main/<split>.txt``; return ``out``.

    Everything in the index is kept: the image class (as the image attribute
    ``image_class_attribute``), image and object attributes in ``<attributes>`` (CVAT's and
    Datumaro's VOC dialect; ``pose`` also in ``<pose>``), difficult / truncated / occluded,
    labelImg's ``verified``, and landmarks as ``<keypoints><keypoint name x y visible/>`` on
    each object that has a labelled point (all K slots, so the schema order survives). Flip
    pairs are not stored in VOC: reading back infers them from left/right names (pass
    ``landmark_schema=`` for others, such as the iBUG 68 points).
    """
    placer = _Images(index, images)
    root = _prepare_out(out, overwrite)
    ann_dir = root / "Annotations"
    img_dir = root / "JPEGImages"
    ann_dir.mkdir(exist_ok=True)
    stems = _unique_stems(placer.keys)
    image_attrs = _attribute_rows(index.image_attributes, index.vocab.image_attributes)
    object_attrs = _attribute_rows(index.object_attributes, index.vocab.object_attributes)
    names = index.landmark_schema.names
    for i in range(len(index)):
        target = placer.place(i, img_dir)
        xml_path = ann_dir / f"{stems[i]}.xml"
        xml_path.parent.mkdir(parents=True, exist_ok=True)
        filename = (
            os.path.relpath(target, xml_path.parent) if images == "none" else os.path.basename(target)
        )
        attrs = image_attrs(i)
        label = int(index.image_labels[i])
        if label != MISSING:
            attrs = {image_class_attribute: index.image_classes[label], **attrs}
        lines = [
            '<annotation verified="yes">' if index.verified[i] else "<annotation>",
            f"  <folder>{escape(img_dir.name)}</folder>",
            f"  <filename>{escape(filename)}</filename>",
            f"  <size><width>{int(index.width[i])}</width><height>{int(index.height[i])}</height>"
            "<depth>3</depth></size>",
            "  <segmented>0</segmented>",
        ]
        lines += _voc_attributes(attrs, "  ")
        for j in range(int(index.object_offsets[i]), int(index.object_offsets[i + 1])):
            lines += _voc_object(index, j, object_attrs(j), names)
        lines.append("</annotation>\n")
        xml_path.write_text("\n".join(lines), encoding="utf-8")
    if index.splits:
        main = root / "ImageSets" / "Main"
        main.mkdir(parents=True, exist_ok=True)
        for split, members in index.splits.items():
            ids = "".join(f"{os.path.basename(stems[int(m)])}\n" for m in members)
            (main / f"{split}.txt").write_text(ids, encoding="utf-8")
    return root


def _voc_attributes(attrs: dict[str, str], indent: str) -> list[str]:
    if not attrs:
        return []
    inner = "".join(
        f"<attribute><name>{escape(k)}</name><value>{escape(v)}</value></attribute>" for k, v in attrs.items()
    )
    return [f"{indent}<attributes>{inner}</attributes>"]


def _voc_object(index: AnnotationIndex, j: int, attrs: dict[str, str], names: Sequence[str]) -> list[str]:
    x1, y1, x2, y2 = (_num(v) for v in index.boxes[j])
    lines = [
        "  <object>",
        f"    <name>{escape(index.classes[int(index.labels[j])])}</name>",
        f"    <pose>{escape(attrs.get('pose', 'Unspecified'))}</pose>",
        f"    <truncated>{int(index.truncated[j])}</truncated>",
        f"    <difficult>{int(index.difficult[j])}</difficult>",
        f"    <occluded>{int(index.occluded[j])}</occluded>",
        f"    <bndbox><xmin>{x1}</xmin><ymin>{y1}</ymin><xmax>{x2}</xmax><ymax>{y2}</ymax></bndbox>",
    ]
    vis = index.visibility[j] if names else ()
    if len(vis) and vis.any():
        lines.append("    <keypoints>")
        for name, (x, y), v in zip(names, index.landmarks[j], vis):
            lines.append(
                f"      <keypoint name={quoteattr(name)} x=\"{_num(x)}\" y=\"{_num(y)}\" visible=\"{int(v)}\"/>"
            )
        lines.append("    </keypoints>")
    lines += _voc_attributes(attrs, "    ")
    lines.append("  </object>")
    return lines


# -- COCO --------------------------------------------------------------------------------------
def write_coco(
    index: AnnotationIndex,
    out: str | os.PathLike[str],
    *,
    images: str = "link",
    overwrite: bool = False,
    image_class_attribute: str = "class",
    file_name: str = "annotations.json",
) -> Path:
    """Write ``out/<file_name>`` and ``out/images/<image>`` (unless ``images="none"``); return
    the JSON's path.

    Categories get ids 1..C in class order; a category with landmarked objects carries the
    landmark names as ``keypoints`` and a ``skeleton`` (COCO's limbs for the COCO person
    schema, else empty: flip pairs are symmetries, not limbs). Objects: ``bbox`` xywh,
    ``area`` w*h, ``iscrowd`` from the object attribute ``iscrowd``, ``keypoints`` (x, y, v
    triples, v 0/1/2) and ``num_keypoints``; other attributes and the flags in an
    ``attributes`` object (as CVAT writes it). Images carry their size and, in
    ``attributes``, their image attributes and class. Flip pairs are inferred again from the
    names on reading (left/right spelling, or the iBUG 68-point preset).
    """
    placer = _Images(index, images)
    root = _prepare_out(out, overwrite)
    img_dir = root / "images"
    image_attrs = _attribute_rows(index.image_attributes, index.vocab.image_attributes)
    object_attrs = _attribute_rows(index.object_attributes, index.vocab.object_attributes)
    schema = index.landmark_schema
    k = len(schema)
    with_points = np.zeros(len(index.classes), dtype=bool)
    if k and index.num_objects:
        has = index.visibility.any(axis=1)
        with_points[np.unique(index.labels[has])] = True
    categories: list[dict[str, Any]] = []
    for c, name in enumerate(index.classes):
        cat: dict[str, Any] = {"id": c + 1, "name": name, "supercategory": ""}
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
            "id": i + 1,
            "file_name": name.replace(os.sep, "/"),
            "width": int(index.width[i]),
            "height": int(index.height[i]),
        }
        attrs = image_attrs(i)
        label = int(index.image_labels[i])
        if label != MISSING:
            attrs = {image_class_attribute: index.image_classes[label], **attrs}
        if attrs:
            record["attributes"] = attrs
        image_records.append(record)
        for j in range(int(index.object_offsets[i]), int(index.object_offsets[i + 1])):
            annotations.append(_coco_annotation(index, i, j, object_attrs(j), with_points))
    data = {
        "info": {"description": "written by detloader", "version": "1.0"},
        "licenses": [],
        "images": image_records,
        "annotations": annotations,
        "categories": categories,
    }
    path = root / file_name
    with open(path, "w", encoding="utf-8") as fh:
        json.dump(data, fh, ensure_ascii=False)
    return path


def _coco_annotation(
    index: AnnotationIndex, i: int, j: int, attrs: dict[str, str], with_points: np.ndarray
) -> dict[str, Any]:
    x1, y1, x2, y2 = (float(v) for v in index.boxes[j])
    w, h = x2 - x1, y2 - y1
    label = int(index.labels[j])
    crowd = attrs.pop("iscrowd", "0") not in ("0", "", "false")
    for flag in ("occluded", "difficult", "truncated"):
        if getattr(index, flag)[j]:
            attrs[flag] = True  # type: ignore[assignment]
    ann: dict[str, Any] = {
        "id": j + 1,
        "image_id": i + 1,
        "category_id": label + 1,
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


# -- YOLO ---------------------------------------------------------------------------------------
def write_yolo(
    index: AnnotationIndex,
    out: str | os.PathLike[str],
    *,
    images: str = "link",
    overwrite: bool = False,
) -> Path:
    """Write ``out/images/<image>``, ``out/labels/<image>.txt`` and ``out/data.yaml``; return
    the YAML's path.

    Labels: ``class cx cy w h`` normalised by the image size, plus ``K x (px py v)`` when the
    index has landmarks (YOLO-pose; objects without points get zeros, v = 0). data.yaml:
    ``names``, ``nc``, and with landmarks ``kpt_shape: [K, 3]``, ``flip_idx`` (from the flip
    pairs) and ``kpt_names``. Splits named train / val / test (or training, valid,
    validation, testing) become ``.txt`` image lists under those keys; without them
    ``train`` and ``val`` both name ``images``. YOLO holds no flags, attributes or image
    classes. ``images="none"`` is refused: YOLO finds a label from its image's path.
    """
    if images == "none":
        raise ValueError("images='none' is not possible for YOLO (labels are found from image paths); "
                         "choose one of link, copy, symlink")
    placer = _Images(index, images)
    root = _prepare_out(out, overwrite)
    img_dir, lbl_dir = root / "images", root / "labels"
    lbl_dir.mkdir(exist_ok=True)
    schema = index.landmark_schema
    k = len(schema)
    targets: list[Path] = []
    for i in range(len(index)):
        target = placer.place(i, img_dir)
        targets.append(target)
        label_file = lbl_dir / (os.path.splitext(placer.keys[i])[0] + ".txt")
        label_file.parent.mkdir(parents=True, exist_ok=True)
        w, h = float(index.width[i]), float(index.height[i])
        rows = []
        for j in range(int(index.object_offsets[i]), int(index.object_offsets[i + 1])):
            x1, y1, x2, y2 = (float(v) for v in index.boxes[j])
            fields = [
                str(int(index.labels[j])),
                repr((x1 + x2) / 2 / w),
                repr((y1 + y2) / 2 / h),
                repr((x2 - x1) / w),
                repr((y2 - y1) / h),
            ]
            for (x, y), v in zip(index.landmarks[j], index.visibility[j]):
                fields += [repr(float(x) / w), repr(float(y) / h), str(int(v))] if v else ["0", "0", "0"]
            rows.append(" ".join(fields) + "\n")
        label_file.write_text("".join(rows), encoding="utf-8")
    config: dict[str, Any] = {}
    written: set[str] = set()
    for split, members in index.splits.items():
        list_file = root / f"{split}.txt"
        lines = "".join(f"./{targets[int(m)].relative_to(root).as_posix()}\n" for m in members)
        list_file.write_text(lines, encoding="utf-8")
        key = YOLO_SPLIT_KEYS.get(split.lower())
        if key is not None and key not in written:
            config[key] = list_file.name
            written.add(key)
    if "train" not in config:
        config["train"] = "images"
    if "val" not in config:
        config["val"] = "images"
    config["nc"] = len(index.classes)
    config["names"] = {c: name for c, name in enumerate(index.classes)}
    if k:
        flip = schema.flip_permutation()
        config["kpt_shape"] = [k, 3]
        config["flip_idx"] = [int(v) for v in flip]
        config["kpt_names"] = {c: list(schema.names) for c in range(len(index.classes))}
    path = root / "data.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False, allow_unicode=True), encoding="utf-8")
    return path


_WRITERS: dict[str, Callable[..., Path]] = {"voc": write_voc, "coco": write_coco, "yolo": write_yolo}


def write_annotations(
    index: AnnotationIndex,
    out: str | os.PathLike[str],
    format: str,
    *,
    images: str = "link",
    split: str | None = None,
    overwrite: bool = False,
) -> Path:
    """Write ``index`` (or its split ``split``) to the folder ``out`` in ``format`` (one of
    :data:`EXPORT_FORMATS`); return the path to read back (the folder for VOC, the JSON for
    COCO, data.yaml for YOLO)."""
    _check_choice("format", format, EXPORT_FORMATS)
    _check_choice("images", images, IMAGE_MODES)
    if split is not None:
        index = index.split(split)
    return _WRITERS[format](index, out, images=images, overwrite=overwrite)
