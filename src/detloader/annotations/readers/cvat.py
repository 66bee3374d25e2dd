"""CVAT for images 1.1 XML (``annotations.xml`` of a CVAT task, job or project export).

The file is streamed: each ``<image>`` is handled when it ends, then dropped with its earlier
siblings, so memory does not grow with the file. Landmark slots follow the ``<meta>`` label
schema. Layout, file and options: docs/formats.md ("Each reader's files and layouts", "What
each format maps to", "Points without boxes").
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from contextlib import closing
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from lxml import etree

from detloader.annotations.builder import ChunkBuilder
from detloader.annotations.checks import ReadOptions
from detloader.annotations.index import AnnotationIndex
from detloader.annotations.landmarks import LandmarkSchema, preset_schema
from detloader.annotations.problems import check_choice
from detloader.annotations.readers.common import Reader, Source, candidate_dirs, check_options, file_source, int_or_none
from detloader.annotations.readers.cvat_shapes import (
    BoxShape,
    PointsShape,
    link_points,
    parse_attributes,
    parse_box,
    parse_points,
    parse_skeleton,
)
from detloader.annotations.readers.locate import IMAGE_EXTENSIONS, ImageLocator, locate_image
from detloader.annotations.readers.safe_xml import (
    STREAM_ERRORS,
    annotation_xml,
    iterparse_safe,
    sniff_xml,
    stream_records,
)

NAME = "cvat"
#: Format options this reader accepts (``read_annotations(path, **options)``).
OPTIONS: tuple[str, ...] = ("images_by", "link_points")
ROOT_TAG = "annotations"
IMAGES_BY = ("name", "id")
LINK_POINTS = ("group_or_inside", "group")
#: Shapes without a box; counted and reported once per file.
UNSUPPORTED_SHAPES = ("polygon", "polyline", "ellipse", "mask", "cuboid")
SUBSET_ATTRIBUTE = "subset"


@dataclass(kw_only=True)
class CvatSource(Source):
    """The CVAT file's options and its ``<meta>`` landmark order."""

    images_by: str
    link_points: str
    point_labels: list[str]


def _point_labels(xml: Path) -> list[str]:
    """Landmark names declared in ``<meta>``: skeleton sub-labels, then ``points`` labels,
    in declaration order. Reads only up to the first ``<image>``."""
    labels: list[tuple[str, str, str]] = []  # (name, type, parent)
    try:
        with closing(iterparse_safe(str(xml), ("meta", "image"), events=("start", "end"))) as events:
            for event, el in events:
                if el.tag == "image":
                    break
                if event == "end":
                    for label in el.iterfind(".//labels/label"):
                        labels.append(tuple((label.findtext(k) or "").strip() for k in ("name", "type", "parent")))
                    break
    except STREAM_ERRORS:
        return []  # parse() reports the problem
    skeletons = {name for name, kind, _ in labels if kind == "skeleton"}
    sub_labels = [name for name, _, parent in labels if parent in skeletons]
    points = [name for name, kind, parent in labels if kind == "points" and not parent]
    return [name for name in dict.fromkeys(sub_labels + points) if name]


def _image_candidates(name: str, image_id: str, images_by: str) -> tuple[str, list[str]]:
    if images_by == "name":
        return name, []
    number = int_or_none(image_id)
    stems = [image_id] + ([f"{number:06d}", f"frame_{number:06d}"] if number is not None else [])
    ext = os.path.splitext(name)[1]
    exts = [ext] if ext else []
    exts += [e for e in IMAGE_EXTENSIONS if e != ext]
    names = [s + e for s in stems for e in exts]
    return names[0], names[1:]


def _image(
    image: etree._Element, locator: ImageLocator, source: CvatSource, b: ChunkBuilder, ignored: dict[str, list]
) -> None:
    image_id = (image.get("id") or "").strip()
    name = (image.get("name") or "").strip()
    element = f"image[id={image_id}]" if image_id else f"image[name={name!r}]"
    images_by = source.images_by
    if images_by == "id" and not image_id:
        b.problem("missing_field", element, "id= is missing (images_by='id')", "image skipped")
        return
    if images_by == "name" and not name:
        b.problem("missing_field", element, "name= is missing", "image skipped")
        return
    first, alternatives = _image_candidates(name, image_id, images_by)
    subset = (image.get("subset") or "").strip()
    if subset and images_by == "name":
        alternatives = alternatives + [os.path.join(subset, name)]
    shown = f"id={image_id!r}" if images_by == "id" else f"name={name!r}"
    found = locate_image(
        locator, b, first, element, shown, image.get("width"), image.get("height"), alternatives=alternatives
    )
    if found is None:
        return
    rel, width, height = found

    boxes: list[BoxShape] = []
    points: list[PointsShape] = []
    tags: list[tuple[str, str, dict[str, str]]] = []
    counters: dict[str, int] = {}
    for child in image:
        tag = child.tag
        if not isinstance(tag, str):
            continue
        counters[tag] = counters.get(tag, 0) + 1
        where = f"{element}/{tag}[{counters[tag]}]"
        if tag == "box":
            box = parse_box(child, where, b)
            if box is not None:
                boxes.append(box)
        elif tag in ("points", "skeleton"):
            pts = (parse_points if tag == "points" else parse_skeleton)(child, where, b)
            if pts is not None:
                points.append(pts)
        elif tag == "tag":
            label = (child.get("label") or "").strip()
            if not label:
                b.problem("missing_field", where, "label= is missing", "tag skipped")
                continue
            tags.append((where, label, parse_attributes(child, where, b)))
        elif tag in UNSUPPORTED_SHAPES:
            entry = ignored.setdefault(tag, [0, where])
            entry[0] += 1

    image_class, attrs = (tags[0][1], tags[0][2]) if tags else (None, {})
    for where, label, _ in tags[1:]:
        message = f"tag label={label!r}: the image already has class {image_class!r} (one class per image)"
        b.problem("unsupported", where, message, "tag ignored")
    if image_class is None and b.options.image_class_attribute in attrs:
        image_class = attrs.pop(b.options.image_class_attribute)
    if subset:
        attrs[SUBSET_ATTRIBUTE] = subset
    if not b.add_image(rel, width, height, image_class=image_class, attributes=attrs, record=name or image_id):
        return

    extra_objects = link_points(boxes, points, source.link_points, b)
    for box in boxes:
        b.add_object(
            box.box,
            box.label,
            element=box.element,
            box_field="",
            difficult=box.difficult,
            truncated=box.truncated,
            occluded=box.occluded,
            attributes=box.attributes,
            landmarks=box.points if box.points else None,
            landmark_field="landmarks",
        )
    for pts in extra_objects:
        b.add_object(
            None, pts.label, element=pts.element, box_field="", landmarks=pts.points, landmark_field="landmarks"
        )


class CvatReader(Reader):
    """CVAT for images 1.1 XML (see the module docstring)."""

    name = NAME
    parallel = False

    def sniff(self, path: Path) -> bool:
        """An ``.xml`` file whose root element is ``<annotations>``, or a folder holding one."""
        return sniff_xml(path, ROOT_TAG)

    def discover(self, path: Path, options: ReadOptions) -> CvatSource:
        """The CVAT XML file at ``path``, its image folders and the ``<meta>`` landmark order."""
        check_options(options, NAME, OPTIONS)
        xml = annotation_xml(path.resolve(), ROOT_TAG, "CVAT", preferred="annotations.xml")
        root = xml.parent
        images_by = options.option("images_by", "name")
        check_choice("images_by", images_by, IMAGES_BY)
        link = options.option("link_points", "group_or_inside")
        check_choice("link_points", link, LINK_POINTS)
        dirs = candidate_dirs(root, ("images", ""), options.image_dir)
        return file_source(
            CvatSource, xml, root, dirs, images_by=images_by, link_points=link, point_labels=_point_labels(xml)
        )

    def parse_file(self, source: CvatSource, rel: str, b: ChunkBuilder) -> None:
        root = str(source.root)
        locator = ImageLocator(root, source.image_dirs, b.options.check_images)
        ignored: dict[str, list] = {}
        tracks = 0

        def record(el: etree._Element) -> None:
            nonlocal tracks
            if el.tag == "image":
                _image(el, locator, source, b, ignored)
            else:
                tracks += 1

        if not stream_records(os.path.join(root, rel), ("image", "track"), ROOT_TAG, b, record):
            return
        if tracks:
            message = f"{tracks} <track> elements: CVAT for video is not read; export as CVAT for images"
            b.problem("unsupported", "track", message, "tracks ignored")
        for tag, (count, first) in ignored.items():
            b.count(f"ignored_{tag}", count)
            message = f"{count} <{tag}> shapes (first: {first}) carry no box"
            b.problem("unsupported", tag, message, "ignored", "repaired")

    def splits(self, source: Source, index: AnnotationIndex) -> dict[str, np.ndarray]:
        """One split per ``subset`` value (project exports)."""
        names = [n for n, _ in index.vocab.image_attributes]
        if SUBSET_ATTRIBUTE not in names:
            return {}
        column = index.image_attributes[:, names.index(SUBSET_ATTRIBUTE)]
        values = dict(index.vocab.image_attributes)[SUBSET_ATTRIBUTE]
        return {value: np.flatnonzero(column == v).astype(np.int64) for v, value in enumerate(values)}

    def default_landmarks(self, source: CvatSource, names: Sequence[str]) -> LandmarkSchema | None:
        """The ``<meta>`` landmark order (flip pairs from left/right names) or a preset."""
        preset = preset_schema(names)
        if preset is not None or not source.point_labels:
            return preset
        return LandmarkSchema.from_names(source.point_labels)
