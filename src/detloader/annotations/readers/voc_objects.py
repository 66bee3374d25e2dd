"""One VOC ``<object>`` into the builder: box, flags, ``<attributes>`` (of objects and images) and
the three landmark dialects (docs/index.md, "VOC dialects read").

Landmarks are ``(name, x, y, visibility)`` tuples in pixels. Element access goes through
:func:`first_children`: one pass over the children, the first of each tag, which is much
cheaper than repeated ``find()`` on files with many objects.
"""

from __future__ import annotations

import re

import numpy as np
from lxml import etree

from detloader.annotations.builder import ChunkBuilder
from detloader.annotations.landmarks import FACE5
from detloader.annotations.readers.common import flag_value, parse_flag, parse_floats

_LM_TAG = re.compile(r"^([xy])(\d+)$")
_NUMBERS = re.compile(r"[,\s;]+")


def parse_landmarks(
    f: dict[str, etree._Element], element: str, b: ChunkBuilder
) -> tuple[list[tuple[str, float, float, int]] | None, str]:
    """Landmarks of the object whose first children by tag are ``f`` (None when it has
    none), and the field they came from (for problems and ``index.meta``)."""
    kp = f.get("keypoints")
    if kp is not None:
        children = list(kp.iterchildren("keypoint"))
        if children:
            return _named_keypoints(children, f"{element}/keypoints", b), "keypoints/keypoint"
        return _list_keypoints(kp.text or "", f"{element}/keypoints", b), "keypoints"
    lm = f.get("lm")
    if lm is not None:
        has = f.get("has_lm")
        if has is not None and parse_flag(has.text or "") is False:
            return None, "lm"
        return _retinaface_points(lm, f"{element}/lm", b), "lm"
    return None, "keypoints"


def _field(el: etree._Element, *names: str) -> str | None:
    """The first of ``names`` that ``el`` has, as an attribute or else a child element's text."""
    values = (el.get(name) if el.get(name) is not None else el.findtext(name) for name in names)
    return next((value for value in values if value is not None), None)


def _visibility(text: str | None) -> int | None:
    if text is None:
        return 2
    value = text.strip().lower()
    if value in ("true", "yes"):
        return 2
    if value in ("false", "no"):
        return 1
    try:
        v = float(value)
    except ValueError:
        return None
    return int(v) if v in (0.0, 1.0, 2.0) else None  # inf, nan, 1e309: not a visibility


def _named_keypoints(children: list, where: str, b: ChunkBuilder) -> list[tuple[str, float, float, int]]:
    points: list[tuple[str, float, float, int]] = []
    for k, child in enumerate(children, start=1):
        get = child.get
        name, xs, ys, vs = get("name"), get("x"), get("y"), get("visible")
        if name and xs is not None and ys is not None and vs in (None, "0", "1", "2"):
            try:  # the common, well-formed case: all attributes present
                points.append((name.strip(), float(xs), float(ys), 2 if vs is None else int(vs)))
                continue
            except ValueError:
                pass
        at = f"{where}/keypoint[{k}]"
        name = (_field(child, "name", "label") or "").strip()
        if not name:
            b.problem("missing_field", at, "keypoint name is missing", "point skipped")
            continue
        vis_text = _field(child, "visible", "visibility", "v")
        v = _visibility(vis_text)
        if v is None:
            b.problem("bad_value", at, f"{name}: visible={vis_text!r} is not 0, 1 or 2", "point skipped")
            continue
        x = b.number(_field(child, "x"), at, f"{name}: x", "point skipped") if v else 0.0
        y = b.number(_field(child, "y"), at, f"{name}: y", "point skipped") if v else 0.0
        if x is None or y is None:
            continue
        points.append((name, x, y, v))
    return points


def _list_keypoints(text: str, where: str, b: ChunkBuilder) -> list[tuple[str, float, float, int]] | None:
    tokens = [t for t in _NUMBERS.split(text.strip()) if t]
    if not tokens:
        return None
    values = parse_floats(tokens, where, b, "landmarks skipped")
    if values is None:
        return None
    if len(values) % 2:
        b.problem("landmark_count", where, f"{len(values)} numbers is not x,y pairs", "landmarks skipped")
        return None
    names = b.positional_names(len(values) // 2, where)
    if names is None:
        return None
    pts = np.asarray(values).reshape(-1, 2)
    return [(n, float(x), float(y), 0 if (x < 0 and y < 0) else 2) for n, (x, y) in zip(names, pts)]


def _retinaface_points(lm: etree._Element, where: str, b: ChunkBuilder) -> list[tuple[str, float, float, int]] | None:
    coords: dict[int, dict[str, str]] = {}
    for child in lm:
        match = _LM_TAG.match(str(child.tag))
        if match:
            coords.setdefault(int(match.group(2)), {})[match.group(1)] = child.text or ""
    if not coords:
        return None
    n = max(coords)
    names = b.positional_names(n, where, FACE5.names)
    if names is None:
        return None
    points = []
    for k in range(1, n + 1):
        xy = coords.get(k, {})
        x = b.number(xy.get("x"), where, f"x{k}", "point skipped")
        y = b.number(xy.get("y"), where, f"y{k}", "point skipped")
        if x is None or y is None:
            continue
        absent = x < 0 and y < 0
        points.append((names[k - 1], 0.0 if absent else x, 0.0 if absent else y, 0 if absent else 2))
    return points


def first_children(el: etree._Element) -> dict[str, etree._Element]:
    """Child elements by tag, the first of each tag (one pass: much cheaper than find())."""
    out: dict[str, etree._Element] = {}
    for child in el:
        out.setdefault(child.tag, child)
    return out


def child_text(children: dict[str, etree._Element], tag: str) -> str | None:
    """Text of the child ``tag`` (``""`` when empty), None when there is no such child."""
    el = children.get(tag)
    return None if el is None else (el.text or "")


def parse_object(obj: etree._Element, element: str, b: ChunkBuilder) -> None:
    """Add the ``<object>`` at ``element`` (``object[2]``) to the open image of ``b``."""
    f = first_children(obj)
    name = child_text(f, "name")
    if name is None:
        b.problem("missing_field", element, "<name> is missing", "object skipped")
        return
    box_el = f.get("bndbox")
    coords: list[float] | None = None
    if box_el is None:  # with landmarks the builder makes the box (boxes_from_points)
        landmarks, lm_field = parse_landmarks(f, element, b)
        if not landmarks:
            b.problem("missing_field", element, "<bndbox> is missing", "object skipped")
            return
    else:
        box = first_children(box_el)
        coords = []
        for field in ("xmin", "ymin", "xmax", "ymax"):
            text = child_text(box, field)
            try:
                coords.append(float(text))  # type: ignore[arg-type]
            except (TypeError, ValueError):
                if b.number(text, f"{element}/bndbox", field, "object skipped") is None:
                    return
                coords.append(float(text))  # type: ignore[arg-type]
    flags = {key: flag_value(b, child_text(f, key), element, key) for key in ("difficult", "truncated", "occluded")}
    attrs = parse_attributes(f.get("attributes"), f"{element}/attributes", b)
    pose = (child_text(f, "pose") or "").strip()
    if pose and pose.lower() != "unspecified" and "pose" not in attrs:
        attrs["pose"] = pose
    if box_el is not None:
        landmarks, lm_field = parse_landmarks(f, element, b)
    b.add_object(coords, name, element=element, attributes=attrs, landmarks=landmarks, landmark_field=lm_field, **flags)


def parse_attributes(el: etree._Element | None, where: str, b: ChunkBuilder) -> dict[str, str]:
    """``<attributes><attribute><name/><value/></attribute>..`` (or ``name=``/``value=``
    attributes) as ``{name: value}``; ``{}`` when ``el`` is None."""
    if el is None:
        return {}
    out: dict[str, str] = {}
    for k, attr in enumerate(el.iterchildren("attribute"), start=1):
        name = value = None
        for child in attr:
            if child.tag == "name" and name is None:
                name = child.text or ""
            elif child.tag == "value" and value is None:
                value = child.text or ""
        name = (name if name is not None else attr.get("name") or "").strip()
        if value is None:
            value = attr.get("value")
        if not name:
            b.problem("missing_field", f"{where}/attribute[{k}]", "attribute <name> is missing", "attribute skipped")
            continue
        out[name] = (value or "").strip()
    return out
