"""COCO records shared by the general and the fast path of the COCO reader: ids, categories,
attributes and images (:mod:`detloader.annotations.readers.coco`)."""

from __future__ import annotations

import json
from typing import Any

from detloader.annotations.builder import ChunkBuilder
from detloader.annotations.readers.locate import ImageLocator, locate_image


def coco_id(value: Any) -> int | str | None:
    """A COCO id as a dictionary key: an int or a string (an integral float reads as the
    int); None for anything else (lists, objects, booleans, fractions, NaN, infinity)."""
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value if isinstance(value, (int, str)) and not isinstance(value, bool) else None


def bad_id(b: ChunkBuilder, where: str, field: str, value: Any, action: str) -> None:
    b.problem("bad_value", f"{where}/{field}", f"{field}={value!r} is not an integer or string id", action)


def referred(ann: dict, field: str, table: dict, table_name: str, where: str, b: ChunkBuilder) -> Any:
    """The entry of ``table`` that ``ann[field]`` names; None, with the problem reported
    (the object is skipped), when the id is malformed or not in ``table_name``."""
    raw = ann.get(field)
    if raw is not None and coco_id(raw) is None:
        bad_id(b, where, field, raw, "object skipped")
        return None
    found = table.get(coco_id(raw))
    if found is None:
        b.problem("bad_value", f"{where}/{field}", f"{field}={raw!r} is not in {table_name}", "object skipped")
    return found


def text(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (dict, list)):
        return json.dumps(value, sort_keys=True)
    return str(value).strip()


def attributes(value: Any, where: str, b: ChunkBuilder) -> dict[str, str]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        b.problem("bad_value", where, f"attributes={value!r} is not an object", "attributes skipped")
        return {}
    return {str(k).strip(): text(v) for k, v in value.items() if str(k).strip()}


def categories(records: list, b: ChunkBuilder) -> dict[Any, tuple[str, list[str] | None]]:
    out: dict[Any, tuple[str, list[str] | None]] = {}
    for i, cat in enumerate(records):
        where = f"categories[{i}]"
        if not isinstance(cat, dict):
            b.problem("bad_value", where, "not an object", "category skipped")
            continue
        raw_id, name = cat.get("id"), cat.get("name")
        if raw_id is None or name is None or not str(name).strip():
            field = "id" if raw_id is None else "name"
            b.problem("missing_field", f"{where}/{field}", f"{field} is missing", "category skipped")
            continue
        cid = coco_id(raw_id)
        if cid is None:
            bad_id(b, where, "id", raw_id, "category skipped")
            continue
        if cid in out:
            b.problem("bad_value", f"{where}/id", f"id={cid!r} repeats an earlier category", "category skipped")
            continue
        kp = cat.get("keypoints")
        names = [str(n) for n in kp] if isinstance(kp, list) and kp else None
        out[cid] = (str(name).strip(), names)
    return out


def id_order(item: tuple[Any, Any]) -> tuple[int, Any]:
    """Categories in id order (ids are usually ints; anything else after, as text)."""
    cid = item[0]
    return (0, cid) if isinstance(cid, int) else (1, str(cid))


def image(img: Any, where: str, locator: ImageLocator, b: ChunkBuilder) -> tuple[int, int] | None:
    """Locate and add one image (a dict, or anything with ``.get``); its (width, height) when added,
    else None with the problem reported."""
    name = img.get("file_name")
    if not isinstance(name, str) or not name.strip():
        b.problem("missing_field", f"{where}/file_name", "file_name is missing", "image skipped")
        return None
    raw = f"width={img.get('width')!r} height={img.get('height')!r}"
    width, height = text(img.get("width", "")), text(img.get("height", ""))
    shown = f"file_name={name!r}"
    found = locate_image(locator, b, name, where, shown, width, height, name_where=f"{where}/file_name", raw=raw)
    if found is None:
        return None
    rel, width, height = found
    attrs = attributes(img.get("attributes"), f"{where}/attributes", b)
    image_class = attrs.pop(b.options.image_class_attribute, None)
    iid = coco_id(img.get("id"))
    image_id = iid if isinstance(iid, int) else None  # a string id: numbered by row
    added = b.add_image(rel, width, height, image_class=image_class, attributes=attrs, record=name, image_id=image_id)
    return (width, height) if added else None


def is_record(value: Any) -> bool:
    """A JSON object: a dict (general path) or a decoded record of the fast path."""
    return isinstance(value, dict) or hasattr(type(value), "__struct_fields__")


def declare(records: list, b: ChunkBuilder) -> tuple[dict[Any, tuple[str, list[str] | None]], list[str]]:
    """The file's categories (:func:`categories`), declared to ``b`` in id order; and their names in that order."""
    found = categories(records, b)
    ordered = sorted(found.items(), key=id_order)
    b.declare_classes([name for _, (name, _) in ordered], [cid if isinstance(cid, int) else None for cid, _ in ordered])
    return found, [name for _, (name, _) in ordered]


def image_rows(images: list, b: ChunkBuilder) -> dict[Any, int]:
    """``{image id: position in images}``; a malformed or repeated id is reported (image skipped)."""
    rows: dict[Any, int] = {}
    for i, img in enumerate(images):
        if is_record(img) and img.get("id") is not None:
            iid = coco_id(img.get("id"))
            if iid is None:
                bad_id(b, f"images[{i}]", "id", img.get("id"), "image skipped")
                continue
            if iid in rows:
                message = f"id={img.get('id')!r} repeats images[{rows[iid]}]"
                b.problem("duplicate_image", f"images[{i}]/id", message, "image skipped")
                continue
            rows[iid] = i
    return rows


def image_problem(img: Any, where: str, rows: dict[Any, int], i: int, b: ChunkBuilder) -> bool:
    """Whether images[i] is skipped: not an object, or without a usable id (reported), or a repeat."""
    if not is_record(img):
        b.problem("bad_value", where, "not an object", "image skipped")
        return True
    if rows.get(coco_id(img.get("id"))) != i:
        if img.get("id") is None:
            b.problem("missing_field", f"{where}/id", "id is missing", "image skipped")
        return True
    return False
