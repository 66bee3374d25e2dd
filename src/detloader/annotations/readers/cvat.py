"""CVAT for images 1.1 XML (``annotations.xml`` of a CVAT task, job or project export).

The file is streamed: each ``<image>`` is handled when it ends, then dropped with its earlier
siblings, so memory does not grow with the file. Landmark slots follow the ``<meta>`` label
schema. The reader and the file first, then the shapes of an image: boxes (:func:`parse_box`),
points and skeletons (:func:`parse_points`, :func:`parse_skeleton`) and the points linked to
their boxes (:func:`link_points`). Layout, file and options: docs/formats.md ("Each reader's
files and layouts", "What each format maps to", "Points without boxes").
"""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from contextlib import closing
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from lxml import etree

from detloader.annotations.builder import ChunkBuilder
from detloader.annotations.checks import ReadOptions
from detloader.annotations.index import AnnotationIndex
from detloader.annotations.landmarks import LandmarkSchema, preset_schema
from detloader.annotations.problems import check_choice
from detloader.annotations.readers.common import (
    Reader,
    Source,
    candidate_dirs,
    check_options,
    file_source,
    flag_value,
    int_or_none,
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


#: Box attributes that are index flags.
_FLAG_ATTRIBUTES = ("difficult", "truncated")

@dataclass
class BoxShape:
    """A ``<box>``: xyxy pixels, flags, attributes, and the landmarks that joined it."""

    element: str
    label: str
    box: tuple[float, float, float, float]
    occluded: bool
    difficult: bool
    truncated: bool
    group: str
    attributes: dict[str, str]
    points: list[tuple[str, float, float, int]] = field(default_factory=list)


@dataclass
class PointsShape:
    """A ``<points>`` element or a ``<skeleton>``: labelled landmarks waiting for a box."""

    element: str
    label: str
    group: str
    points: list[tuple[str, float, float, int]]


def _coords(child: etree._Element, where: str, b: ChunkBuilder) -> tuple[float, float, float, float] | None:
    values = []
    for field_name in ("xtl", "ytl", "xbr", "ybr"):
        v = b.number(child.get(field_name), where, field_name, "object skipped")
        if v is None:
            return None
        values.append(v)
    return values[0], values[1], values[2], values[3]


def _rotated_bounds(box: tuple[float, float, float, float], degrees: float) -> tuple[float, float, float, float]:
    """Axis-aligned bounds of ``box`` rotated by ``degrees`` about its centre (CVAT's rule)."""
    x1, y1, x2, y2 = box
    cx, cy = (x1 + x2) / 2, (y1 + y2) / 2
    t = math.radians(degrees)
    c, s = math.cos(t), math.sin(t)
    xs, ys = [], []
    for x, y in ((x1, y1), (x2, y1), (x2, y2), (x1, y2)):
        dx, dy = x - cx, y - cy
        xs.append(cx + dx * c - dy * s)
        ys.append(cy + dx * s + dy * c)
    return min(xs), min(ys), max(xs), max(ys)


def _flag(child: etree._Element, name: str, where: str, b: ChunkBuilder, text: str | None = None) -> bool:
    return flag_value(b, child.get(name) if text is None else text, where, name)


def parse_box(child: etree._Element, where: str, b: ChunkBuilder) -> BoxShape | None:
    """The ``<box>`` (rotation replaced by its upright bounds); None and a problem when bad."""
    label = (child.get("label") or "").strip()
    if not label:
        b.problem("missing_field", where, "label= is missing", "object skipped")
        return None
    box = _coords(child, where, b)
    if box is None:
        return None
    rotation = child.get("rotation")
    if rotation is not None and rotation.strip():
        degrees = b.number(rotation, f"{where}/rotation", "rotation", "object skipped")
        if degrees is None:
            return None
        if not math.isfinite(degrees):
            message = f"rotation={rotation.strip()!r} is not finite"
            b.problem("non_finite", f"{where}/rotation", message, "object skipped")
            return None
        if degrees % 360 != 0:
            box = _rotated_bounds(box, degrees)
            repair = "replaced by its axis-aligned bounds"
            b.problem("unsupported", f"{where}/rotation", f"rotation={degrees:g} degrees", repair, "repaired")
    attrs = parse_attributes(child, where, b)
    flags = {name: name in attrs and _flag(child, name, where, b, attrs.pop(name)) for name in _FLAG_ATTRIBUTES}
    return BoxShape(
        element=where,
        label=label,
        box=box,
        occluded=_flag(child, "occluded", where, b),
        difficult=flags["difficult"],
        truncated=flags["truncated"],
        group=(child.get("group_id") or "").strip(),
        attributes=attrs,
    )


def parse_attributes(child: etree._Element, where: str, b: ChunkBuilder) -> dict[str, str]:
    """``<attribute name="k">v</attribute>`` children as ``{k: v}``."""
    out: dict[str, str] = {}
    for k, attr in enumerate(child.iterfind("attribute"), start=1):
        name = (attr.get("name") or "").strip()
        if not name:
            b.problem("missing_field", f"{where}/attribute[{k}]", "name= is missing", "attribute skipped")
            continue
        out[name] = (attr.text or "").strip()
    return out


def _point_list(text: str | None, where: str, b: ChunkBuilder) -> list[tuple[float, float]] | None:
    if text is None or not text.strip():
        b.problem("missing_field", where, "points= is missing", "points skipped")
        return None
    out = []
    for pair in text.strip().split(";"):
        xy = pair.split(",")
        if len(xy) != 2:
            b.problem("bad_value", where, f"points={pair!r} is not x,y", "points skipped")
            return None
        try:
            out.append((float(xy[0]), float(xy[1])))
        except ValueError:
            b.problem("bad_value", where, f"points={pair!r} is not a pair of numbers", "points skipped")
            return None
    return out


def _visibility(child: etree._Element, where: str, b: ChunkBuilder) -> int:
    if _flag(child, "outside", where, b):
        return 0
    return 1 if _flag(child, "occluded", where, b) else 2


def parse_points(child: etree._Element, where: str, b: ChunkBuilder) -> PointsShape | None:
    """A ``<points>`` element: one point named by its label, or several named positionally."""
    label = (child.get("label") or "").strip()
    if not label:
        b.problem("missing_field", where, "label= is missing", "points skipped")
        return None
    coords = _point_list(child.get("points"), where, b)
    if coords is None:
        return None
    v = _visibility(child, where, b)
    if len(coords) == 1:
        names = [label]
    else:
        names = b.positional_names(len(coords), where)
        if names is None:
            return None
    pts = [(n, x, y, v) if v else (n, 0.0, 0.0, 0) for n, (x, y) in zip(names, coords)]
    return PointsShape(where, label, (child.get("group_id") or "").strip(), pts)


def parse_skeleton(child: etree._Element, where: str, b: ChunkBuilder) -> PointsShape | None:
    """A ``<skeleton>``: one landmark per child ``<points>``, named by its label."""
    label = (child.get("label") or "").strip()
    if not label:
        b.problem("missing_field", where, "label= is missing", "skeleton skipped")
        return None
    pts: list[tuple[str, float, float, int]] = []
    for k, node in enumerate(child.iterfind("points"), start=1):
        at = f"{where}/points[{k}]"
        name = (node.get("label") or "").strip()
        if not name:
            b.problem("missing_field", at, "label= is missing", "point skipped")
            continue
        v = _visibility(node, at, b)
        if v == 0:
            pts.append((name, 0.0, 0.0, 0))
            continue
        coords = _point_list(node.get("points"), at, b)
        if coords is None:
            continue
        if len(coords) != 1:
            b.problem("landmark_count", at, f"{len(coords)} points in one skeleton node", "point skipped")
            continue
        pts.append((name, coords[0][0], coords[0][1], v))
    return PointsShape(where, label, (child.get("group_id") or "").strip(), pts)


def _contains(box: tuple[float, float, float, float], pts: list[tuple[str, float, float, int]]) -> bool:
    x1, y1, x2, y2 = box
    return all(x1 <= x <= x2 and y1 <= y <= y2 for _, x, y, v in pts if v)


def _area(box: tuple[float, float, float, float]) -> float:
    return max(0.0, box[2] - box[0]) * max(0.0, box[3] - box[1])


def link_points(boxes: list[BoxShape], points: list[PointsShape], link: str, b: ChunkBuilder) -> list[PointsShape]:
    """Attach landmarks to boxes (group first, then containment); return the points and
    skeletons that no box takes (objects of their own, boxed by the builder)."""
    by_group: dict[str, list[BoxShape]] = {}
    for box in boxes:
        if box.group:
            by_group.setdefault(box.group, []).append(box)
    standalone: list[PointsShape] = []
    for pts in points:
        target: BoxShape | None = None
        group = by_group.get(pts.group, []) if pts.group else []
        if len(group) == 1:
            target = group[0]
        elif len(group) > 1:
            message = f"group_id={pts.group} holds {len(group)} boxes; the landmarks fit none of them alone"
            b.problem("unsupported", pts.element, message, "points skipped")
            continue
        elif link == "group_or_inside" and any(v for *_, v in pts.points):
            inside = [box for box in boxes if _contains(box.box, pts.points)]
            if inside:
                target = min(inside, key=lambda box: _area(box.box))
        if target is not None:
            _merge_points(target, pts, b)
        else:
            standalone.append(pts)
    return standalone


def _merge_points(box: BoxShape, pts: PointsShape, b: ChunkBuilder) -> None:
    have = {name for name, *_ in box.points}
    for point in pts.points:
        if point[0] in have:
            message = f"landmark {point[0]!r} given twice for {box.element}"
            b.problem("bad_value", pts.element, message, "second point skipped")
            continue
        have.add(point[0])
        box.points.append(point)
