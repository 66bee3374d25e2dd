"""One VOC ``<object>`` (and the ``<attributes>`` lists of objects and images) into the builder.

Element access goes through :func:`first_children`: one pass over the children, the first of
each tag, which is much cheaper than repeated ``find()`` on files with many objects.
"""

from __future__ import annotations

from lxml import etree

from detloader.annotations.builder import ChunkBuilder
from detloader.annotations.readers.common import flag_value
from detloader.annotations.readers.voc_landmarks import parse_landmarks


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
    flags = []
    for field in ("difficult", "truncated", "occluded"):
        flags.append(flag_value(b, child_text(f, field), element, field))
    attrs = parse_attributes(f.get("attributes"), f"{element}/attributes", b)
    pose = (child_text(f, "pose") or "").strip()
    if pose and pose.lower() != "unspecified" and "pose" not in attrs:
        attrs["pose"] = pose
    if box_el is not None:
        landmarks, lm_field = parse_landmarks(f, element, b)
    b.add_object(
        coords,
        name,
        element=element,
        difficult=flags[0],
        truncated=flags[1],
        occluded=flags[2],
        attributes=attrs,
        landmarks=landmarks,
        landmark_field=lm_field,
    )


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
