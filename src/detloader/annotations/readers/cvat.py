"""CVAT for images 1.1 XML (``annotations.xml`` of a CVAT task, job or project export).

Pass the XML file, or the export folder holding it. Images are looked up in ``images/`` next
to the file, then beside it (``image_dir`` overrides)::

    <annotations>
      <meta><task><labels><label><name>face</name><type>rectangle</type>...</labels></task></meta>
      <image id="12" name="img/0012.jpg" width="640" height="480" subset="Train">
        <box label="face" xtl="10" ytl="20" xbr="50" ybr="70" occluded="0" group_id="1">
          <attribute name="age">adult</attribute>
        </box>
        <points label="left_eye" points="20.5,35.0" occluded="0" group_id="1"/>
        <skeleton label="face5" group_id="1">
          <points label="nose" points="30,45" outside="0" occluded="1"/>
        </skeleton>
        <tag label="indoor"/>
      </image>
    </annotations>

Mapping to the index:

* ``<box>``: ``xtl ytl xbr ybr`` is xyxy; ``occluded`` is the flag; ``<attribute>`` children
  become object attributes, except ``difficult`` and ``truncated`` which set those flags.
  A ``rotation`` other than 0 is replaced by the rotated box's axis-aligned bounds (an
  ``unsupported`` problem of repaired severity: the index holds upright boxes).
* ``<points>`` and ``<skeleton>`` are landmarks of a box. A ``<points>`` element with one
  point is the landmark named by its label; with several points they are named ``p0, p1, ..``
  (or by a given landmark schema). In a skeleton each child ``<points>`` is one landmark named
  by its label; ``outside="1"`` is absent (visibility 0), ``occluded="1"`` hidden (1), else
  visible (2). Landmarks join the box with the same ``group_id``; ungrouped ones (or those
  whose group has no box) join the smallest box containing all their points, unless the
  format option ``link_points="group"`` asks for groups only. A skeleton that no box takes
  becomes an object of the skeleton's class boxed by its labelled points; lone ``<points>``
  are reported (``unsupported``) and skipped.
* ``<tag>``: the first tag of an image is its image-level class, the tag's attributes are
  image attributes; a further tag is an ``unsupported`` error (an image has one class).
* ``subset`` (project exports) becomes the image attribute ``subset`` and a split per value.
* ``<polygon>``, ``<polyline>``, ``<ellipse>``, ``<mask>``, ``<cuboid>`` carry no box: they
  are counted in ``index.meta["stats"]`` and reported once per file (``unsupported``,
  repaired severity, so they never fail a read). CVAT for video (``<track>``) is not read.
* Landmark order: the ``<meta>`` label schema (skeleton sub-labels, then points labels), so
  that the landmark slots follow the project's definition, not the first annotation.

Format options (``read_annotations(path, **options)``):

* ``images_by="name"`` (default) finds images by the ``name`` attribute; ``"id"`` by the
  image ``id``, for exports whose images were renamed to their id: ``12.jpg``,
  ``000012.jpg`` or ``frame_000012.jpg`` (the original extension first, then the usual ones).
* ``link_points="group_or_inside"`` (default) or ``"group"``, see above.

The file is streamed: each ``<image>`` is processed when it ends and then dropped with its
earlier siblings, so a file of hundreds of MB is read in bounded memory (see
``benchmarks/bench_cvat_stream.py``). Problems name the image by id: ``image[id=12]/box[3]``
is the third ``<box>`` of image 12; the record of an image is its ``name``.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

import numpy as np
from lxml import etree

from detloader.annotations.builder import ChunkBuilder, ReadOptions
from detloader.annotations.index import AnnotationIndex
from detloader.annotations.landmarks import LandmarkSchema, preset_schema
from detloader.annotations.readers.common import (
    IMAGE_EXTENSIONS,
    ImageLocator,
    Source,
    candidate_dirs,
    check_options,
    declared_size,
    file_source,
    flag_value,
    int_or_none,
)
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
PARALLEL = False
ROOT_TAG = "annotations"
IMAGES_BY = ("name", "id")
LINK_POINTS = ("group_or_inside", "group")
#: Shapes without a box; counted and reported once per file.
UNSUPPORTED_SHAPES = ("polygon", "polyline", "ellipse", "mask", "cuboid")
#: Box attributes that are index flags.
_FLAG_ATTRIBUTES = ("difficult", "truncated")
SUBSET_ATTRIBUTE = "subset"


def sniff(path: Path) -> bool:
    """An ``.xml`` file whose root element is ``<annotations>``, or a folder holding one."""
    return sniff_xml(path, ROOT_TAG)


def _annotation_file(path: Path) -> Path:
    return annotation_xml(path, ROOT_TAG, "CVAT", preferred="annotations.xml")


def discover(path: Path, options: ReadOptions) -> Source:
    check_options(options, NAME, OPTIONS)
    xml = _annotation_file(path.resolve())
    root = xml.parent
    images_by = options.option("images_by", "name")
    if images_by not in IMAGES_BY:
        raise ValueError(f"images_by={images_by!r} is not one of {', '.join(IMAGES_BY)}")
    link = options.option("link_points", "group_or_inside")
    if link not in LINK_POINTS:
        raise ValueError(f"link_points={link!r} is not one of {', '.join(LINK_POINTS)}")
    dirs = candidate_dirs(root, ("images", ""), options.image_dir)
    return file_source(
        NAME,
        xml,
        root,
        dirs,
        extra={"images_by": images_by, "link_points": link, "point_labels": _point_labels(xml)},
    )


def _point_labels(xml: Path) -> list[str]:
    """Landmark names declared in ``<meta>``: skeleton sub-labels, then ``points`` labels,
    in declaration order. Reads only up to the first ``<image>``."""
    labels: list[tuple[str, str, str]] = []  # (name, type, parent)
    try:
        for event, el in iterparse_safe(str(xml), ("meta", "image"), events=("start", "end")):
            if el.tag == "image":
                break
            if event == "end":
                for label in el.iterfind(".//labels/label"):
                    labels.append(
                        (
                            (label.findtext("name") or "").strip(),
                            (label.findtext("type") or "").strip(),
                            (label.findtext("parent") or "").strip(),
                        )
                    )
                break
    except STREAM_ERRORS:
        return []  # parse() reports the problem
    skeletons = {name for name, kind, _ in labels if kind == "skeleton"}
    names: list[str] = []
    for name, kind, parent in labels:
        if parent in skeletons and name and name not in names:
            names.append(name)
    for name, kind, parent in labels:
        if kind == "points" and not parent and name and name not in names:
            names.append(name)
    return names


def default_landmarks(source: Source, names: Sequence[str]) -> LandmarkSchema | None:
    """The ``<meta>`` landmark order (flip pairs from left/right names) or a preset."""
    preset = preset_schema(names)
    if preset is not None:
        return preset
    declared = source.extra.get("point_labels") or []
    return LandmarkSchema.from_names(declared) if declared else None


def splits(source: Source, index: AnnotationIndex) -> dict[str, np.ndarray]:
    """One split per ``subset`` value (project exports)."""
    names = [n for n, _ in index.vocab.image_attributes]
    if SUBSET_ATTRIBUTE not in names:
        return {}
    column = index.image_attributes[:, names.index(SUBSET_ATTRIBUTE)]
    values = dict(index.vocab.image_attributes)[SUBSET_ATTRIBUTE]
    return {value: np.flatnonzero(column == v).astype(np.int64) for v, value in enumerate(values)}


def parse(source: Source, files: Sequence[str], builder: ChunkBuilder) -> None:
    for rel in files:
        builder.begin_file(rel)
        _parse_file(str(source.root), rel, source, builder)


@dataclass
class _Box:
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
class _Points:
    element: str
    label: str
    group: str
    points: list[tuple[str, float, float, int]]
    skeleton: bool


def _parse_file(root: str, rel: str, source: Source, b: ChunkBuilder) -> None:
    locator = ImageLocator(root, source.extra["image_dirs"], b.options.check_images)
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
        b.problem(
            "unsupported",
            "track",
            f"{tracks} <track> elements: CVAT for video is not read; export as CVAT for images",
            "tracks ignored",
        )
    for tag, (count, first) in ignored.items():
        b.count(f"ignored_{tag}", count)
        b.problem(
            "unsupported",
            tag,
            f"{count} <{tag}> shapes (first: {first}) carry no box",
            "ignored",
            "repaired",
        )


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
    image: etree._Element, locator: ImageLocator, source: Source, b: ChunkBuilder, ignored: dict[str, list]
) -> None:
    image_id = (image.get("id") or "").strip()
    name = (image.get("name") or "").strip()
    element = f"image[id={image_id}]" if image_id else f"image[name={name!r}]"
    images_by = source.extra["images_by"]
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
    rel = locator.find(first, alternatives)
    if rel is None:
        shown = f"id={image_id!r}" if images_by == "id" else f"name={name!r}"
        b.problem("missing_image", element, f"{shown} not found in {locator.describe()}", "image skipped")
        return
    size = declared_size(b, locator.root, rel, element, image.get("width"), image.get("height"))
    if size is None:
        return
    width, height = size

    boxes: list[_Box] = []
    points: list[_Points] = []
    tags: list[tuple[str, str, dict[str, str]]] = []
    counters: dict[str, int] = {}
    for child in image:
        tag = child.tag
        if not isinstance(tag, str):
            continue
        counters[tag] = counters.get(tag, 0) + 1
        where = f"{element}/{tag}[{counters[tag]}]"
        if tag == "box":
            box = _box(child, where, b)
            if box is not None:
                boxes.append(box)
        elif tag == "points":
            pts = _points_element(child, where, b)
            if pts is not None:
                points.append(pts)
        elif tag == "skeleton":
            pts = _skeleton(child, where, b)
            if pts is not None:
                points.append(pts)
        elif tag == "tag":
            label = (child.get("label") or "").strip()
            if not label:
                b.problem("missing_field", where, "label= is missing", "tag skipped")
                continue
            tags.append((where, label, _attributes(child, where, b)))
        elif tag in UNSUPPORTED_SHAPES:
            entry = ignored.setdefault(tag, [0, where])
            entry[0] += 1

    image_class = None
    attrs: dict[str, str] = {}
    for k, (where, label, tag_attrs) in enumerate(tags):
        if k == 0:
            image_class = label
            attrs.update(tag_attrs)
        else:
            b.problem(
                "unsupported",
                where,
                f"tag label={label!r}: the image already has class {image_class!r} (one class per image)",
                "tag ignored",
            )
    if image_class is None and b.options.image_class_attribute in attrs:
        image_class = attrs.pop(b.options.image_class_attribute)
    subset = image.get("subset")
    if subset is not None and subset.strip():
        attrs[SUBSET_ATTRIBUTE] = subset.strip()
    if not b.add_image(rel, width, height, image_class=image_class, attributes=attrs, record=name or image_id):
        return

    extra_objects = _link(boxes, points, source.extra["link_points"], b)
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
    for pts, extent in extra_objects:
        b.count("boxes_from_skeletons")
        b.add_object(extent, pts.label, element=pts.element, box_field="", landmarks=pts.points, landmark_field="landmarks")


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


def _box(child: etree._Element, where: str, b: ChunkBuilder) -> _Box | None:
    label = (child.get("label") or "").strip()
    if not label:
        b.problem("missing_field", where, "label= is missing", "object skipped")
        return None
    box = _coords(child, where, b)
    if box is None:
        return None
    rotation = child.get("rotation")
    if rotation is not None and rotation.strip():
        try:
            degrees = float(rotation)
        except ValueError:
            b.problem("bad_value", f"{where}/rotation", f"rotation={rotation!r} is not a number", "object skipped")
            return None
        if degrees % 360 != 0:
            box = _rotated_bounds(box, degrees)
            b.problem(
                "unsupported",
                f"{where}/rotation",
                f"rotation={degrees:g} degrees",
                "replaced by its axis-aligned bounds",
                "repaired",
            )
    attrs = _attributes(child, where, b)
    flags = {}
    for name in _FLAG_ATTRIBUTES:
        text = attrs.pop(name, None)
        flags[name] = _flag(child, name, where, b, text) if text is not None else False
    return _Box(
        element=where,
        label=label,
        box=box,
        occluded=_flag(child, "occluded", where, b),
        difficult=flags["difficult"],
        truncated=flags["truncated"],
        group=(child.get("group_id") or "").strip(),
        attributes=attrs,
    )


def _attributes(child: etree._Element, where: str, b: ChunkBuilder) -> dict[str, str]:
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


def _points_element(child: etree._Element, where: str, b: ChunkBuilder) -> _Points | None:
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
        got = b.positional_names(len(coords), where)
        if got is None:
            return None
        names = got
    pts = [(n, x, y, v) if v else (n, 0.0, 0.0, 0) for n, (x, y) in zip(names, coords)]
    return _Points(where, label, (child.get("group_id") or "").strip(), pts, skeleton=False)


def _skeleton(child: etree._Element, where: str, b: ChunkBuilder) -> _Points | None:
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
    return _Points(where, label, (child.get("group_id") or "").strip(), pts, skeleton=True)


def _contains(box: tuple[float, float, float, float], pts: list[tuple[str, float, float, int]]) -> bool:
    x1, y1, x2, y2 = box
    return all(x1 <= x <= x2 and y1 <= y <= y2 for _, x, y, v in pts if v)


def _area(box: tuple[float, float, float, float]) -> float:
    return max(0.0, box[2] - box[0]) * max(0.0, box[3] - box[1])


def _link(
    boxes: list[_Box], points: list[_Points], link: str, b: ChunkBuilder
) -> list[tuple[_Points, tuple[float, float, float, float]]]:
    """Attach landmarks to boxes (group first, then containment); return the skeletons that
    no box takes, with the extent of their labelled points as their box."""
    by_group: dict[str, list[_Box]] = {}
    for box in boxes:
        if box.group:
            by_group.setdefault(box.group, []).append(box)
    standalone: list[tuple[_Points, tuple[float, float, float, float]]] = []
    for pts in points:
        target: _Box | None = None
        group = by_group.get(pts.group, []) if pts.group else []
        if len(group) == 1:
            target = group[0]
        elif len(group) > 1:
            b.problem(
                "unsupported",
                pts.element,
                f"group_id={pts.group} holds {len(group)} boxes; the landmarks fit none of them alone",
                "points skipped",
            )
            continue
        elif link == "group_or_inside" and any(v for *_, v in pts.points):
            inside = [box for box in boxes if _contains(box.box, pts.points)]
            if inside:
                target = min(inside, key=lambda box: _area(box.box))
        if target is not None:
            _merge_points(target, pts, b)
            continue
        visible = [(x, y) for _, x, y, v in pts.points if v]
        if pts.skeleton and visible:
            xs, ys = [p[0] for p in visible], [p[1] for p in visible]
            standalone.append((pts, (min(xs), min(ys), max(xs), max(ys))))
            continue
        b.problem(
            "unsupported",
            pts.element,
            f"label={pts.label!r}: landmarks without a box (no group_id box, inside no box)",
            "points skipped",
        )
    return standalone


def _merge_points(box: _Box, pts: _Points, b: ChunkBuilder) -> None:
    have = {name for name, *_ in box.points}
    for point in pts.points:
        if point[0] in have:
            b.problem(
                "bad_value",
                pts.element,
                f"landmark {point[0]!r} given twice for {box.element}",
                "second point skipped",
            )
            continue
        have.add(point[0])
        box.points.append(point)

