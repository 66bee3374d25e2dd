"""Pascal VOC writer: ``Annotations/*.xml``, ``JPEGImages/``, ``ImageSets/Main/<split>.txt``."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from xml.sax.saxutils import escape, quoteattr

import numpy as np

from detloader._system.files import write_file
from detloader.annotations.index import AnnotationIndex
from detloader.annotations.writers.common import ImagePlacer, attribute_rows, image_attributes, prepare_out


def shortest_float32(value: float) -> str:
    """Shortest text that reads back as the same float32 (``10``, ``10.5``, ``0.1``)."""
    return np.format_float_positional(np.float32(value), trim="-")


def unique_stems(keys: Sequence[str]) -> list[str]:
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


def write_voc(
    index: AnnotationIndex, out: str | os.PathLike[str], *, images: str = "link", overwrite: bool = False,
    image_class_attribute: str = "class",
) -> Path:
    """Write ``out/Annotations/<image>.xml``, ``out/JPEGImages/<image>`` (unless ``images="none"``)
    and ``out/ImageSets/Main/<split>.txt``; return ``out``. Landmarks are written with all K slots
    on each object that has a labelled point, so the schema order survives (docs/formats.md,
    "Writing").
    """
    placer = ImagePlacer(index, images)
    root = prepare_out(out, overwrite)
    ann_dir = root / "Annotations"
    img_dir = root / "JPEGImages"
    ann_dir.mkdir(exist_ok=True)
    stems = unique_stems(placer.keys)
    image_attrs = attribute_rows(index.image_attributes, index.vocab.image_attributes)
    object_attrs = attribute_rows(index.object_attributes, index.vocab.object_attributes)
    names = index.landmark_schema.names
    for i in range(len(index)):
        target = placer.place(i, img_dir)
        xml_path = ann_dir / f"{stems[i]}.xml"
        xml_path.parent.mkdir(parents=True, exist_ok=True)
        filename = os.path.relpath(target, xml_path.parent) if images == "none" else os.path.basename(target)
        attrs = image_attributes(index, image_attrs, i, image_class_attribute)
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
            crowd = {"iscrowd": "1"} if index.crowd[j] else {}  # VOC has no crowd flag: an attribute
            lines += _voc_object(index, j, {**object_attrs(j), **crowd}, names)
        lines.append("</annotation>\n")
        write_file(xml_path, "\n".join(lines))
    if index.splits:
        main = root / "ImageSets" / "Main"
        main.mkdir(parents=True, exist_ok=True)
        for split, members in index.splits.items():
            ids = "".join(f"{os.path.basename(stems[int(m)])}\n" for m in members)
            write_file(main / f"{split}.txt", ids)
    return root


def _voc_attributes(attrs: dict[str, str], indent: str) -> list[str]:
    if not attrs:
        return []
    inner = "".join(
        f"<attribute><name>{escape(k)}</name><value>{escape(v)}</value></attribute>" for k, v in attrs.items()
    )
    return [f"{indent}<attributes>{inner}</attributes>"]


def _voc_object(index: AnnotationIndex, j: int, attrs: dict[str, str], names: Sequence[str]) -> list[str]:
    x1, y1, x2, y2 = (shortest_float32(v) for v in index.boxes[j])
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
                f'      <keypoint name={quoteattr(name)} x="{shortest_float32(x)}" '
                f'y="{shortest_float32(y)}" visible="{int(v)}"/>'
            )
        lines.append("    </keypoints>")
    lines += _voc_attributes(attrs, "    ")
    lines.append("  </object>")
    return lines
