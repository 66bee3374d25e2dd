"""CVAT shapes inside an ``<image>``: boxes, points, skeletons, and how landmarks join boxes.

The mapping rules: docs/formats.md ("What each format maps to"). Element paths (``where``) are
built by the caller (``image[id=12]/box[3]``); landmarks are ``(name, x, y, visibility)``
tuples in pixels.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from lxml import etree

from detloader.annotations.builder import ChunkBuilder
from detloader.annotations.readers.common import flag_value

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

