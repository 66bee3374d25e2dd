"""COCO JSON: instances and person_keypoints files (and what CVAT / Datumaro export as COCO),
and LVIS (:class:`LvisReader`: COCO-shaped, images named by ``coco_url``, per-image
``neg_category_ids`` / ``not_exhaustive_category_ids`` and per-category ``frequency``, which
any COCO file may carry too).

The JSON is loaded whole (the format gives no record boundary to stream on), under the format
option ``max_json_bytes``. Layouts, split files and image folders: docs/formats.md ("Each
reader's files and layouts", "What each format maps to"); positions in problems are 0-based,
as in the file (``annotations[17]/bbox``).

Three parts: the reader and the general path (:class:`CocoReader`, any file); the record
helpers both paths use (ids, categories, attributes, image records); the fast path of a file of
boxes (:func:`parse_fast`: a typed ``msgspec`` decode and numpy columns). Both paths give the
same index and problems (docs/index.md, "COCO at scale").
"""

from __future__ import annotations

import dataclasses
import json
import os
import posixpath
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

import msgspec
import numpy as np

from detloader._system.files import open_regular, read_capped
from detloader.annotations.builder import ChunkBuilder
from detloader.annotations.checks import ReadOptions, check_box
from detloader.annotations.fields import MISSING
from detloader.annotations.index import AnnotationIndex
from detloader.annotations.landmarks import LandmarkSchema, preset_schema
from detloader.annotations.readers.common import (
    Reader,
    Source,
    candidate_dirs,
    check_options,
    file_source,
    find_child_dir,
    holds_xml,
    parse_flag,
    read_head,
)
from detloader.annotations.readers.locate import ImageLocator, locate_image
from detloader.annotations.splits import files_as_splits, split_role
from detloader.errors import DetloaderValueError, FileTooLargeError

NAME = "coco"
#: Format options this reader accepts (``read_annotations(path, **options)``).
OPTIONS: tuple[str, ...] = ("max_json_bytes",)
MAX_JSON_BYTES = 4 * 1024**3
_PREFIX = re.compile(r"^(instances|person_keypoints|image_info|annotations?)_", re.IGNORECASE)
_FLAGS = ("occluded", "difficult", "truncated")


def _looks_like_coco(path: Path) -> bool:
    head = read_head(path, 1 << 20).lstrip()
    return head.startswith(b"{") and (b'"images"' in head or b'"annotations"' in head)


def _looks_like_lvis(path: Path) -> bool:
    """A COCO file whose first or last MiB (LVIS puts its images after the annotations) holds
    ``neg_category_ids`` / ``not_exhaustive_category_ids``, or ``coco_url`` and no ``file_name``."""
    if not _looks_like_coco(path):
        return False
    ends = read_head(path, 1 << 20)
    try:
        with open_regular(path) as fh:
            fh.seek(max(0, os.fstat(fh.fileno()).st_size - (1 << 20)))
            ends += fh.read()
    except OSError:
        pass
    marked = b'"neg_category_ids"' in ends or b'"not_exhaustive_category_ids"' in ends
    return marked or (b'"coco_url"' in ends and b'"file_name"' not in ends)


def _coco_files(folder: Path) -> list[Path]:
    places = [folder]
    ann = find_child_dir(folder, ("annotations",))
    if ann is not None:
        if holds_xml(ann):
            return []  # a VOC layout
        places.append(ann)
    places += [d for d in sorted(folder.iterdir()) if split_role(d.name) and d.is_dir()]  # train/ valid/ test/
    return [p for place in places for p in sorted(place.glob("*.json")) if _looks_like_coco(p)]


def _in_split_folder(js: Path, path: Path) -> bool:
    return js.parent.parent == path and split_role(js.parent.name) is not None


_WORD = re.compile(r"[^_.\-]+")


def _split_word(js: Path, path: Path) -> tuple[str, str]:
    """(split word, the name around it) of a COCO file read beside others: its split folder
    (``valid/_annotations.coco.json``), the name less its prefix (``instances_val2017``), or
    the one word of the name that is a split (``custom_val`` -> ``val``, around it
    ``custom_{}``); files pair when the names around are the same and the splits distinct.
    ``("", stem)`` when there is no such word, or more than one."""
    if _in_split_folder(js, path):
        return js.parent.name, "{}"
    name = _PREFIX.sub("", js.stem)
    if split_role(name) is not None:
        return name, "{}"
    words = [m for m in _WORD.finditer(js.stem) if split_role(m.group()) is not None]
    if len(words) != 1:
        return "", js.stem
    m = words[0]
    return m.group(), js.stem[: m.start()] + "{}" + js.stem[m.end() :]


@dataclass(kw_only=True)
class CocoSource(Source):
    """The JSON size cap; with several files (one split each) each file's image folders and split."""

    max_json_bytes: int
    file_image_dirs: dict[str, list[str]]
    file_splits: dict[str, str]


def _read(full: str, cap: int, b: ChunkBuilder) -> bytes | None:
    try:
        return read_capped(full, cap, "max_json_bytes")
    except FileTooLargeError as err:
        b.problem("file_too_large", "", str(err), "file skipped")
    except OSError as err:
        b.problem("unreadable_file", "", f"{err.strerror or err}", "file skipped")
    except ValueError as err:
        b.problem("unparseable", "", f"not JSON text: {err}", "file skipped")
    return None


def _decode(raw: bytes, b: ChunkBuilder) -> Any:
    try:
        return json.loads(raw)
    except json.JSONDecodeError as err:
        b.problem("unparseable", f"line {err.lineno} column {err.colno}", err.msg, "file skipped")
    except (UnicodeDecodeError, ValueError, RecursionError) as err:
        b.problem("unparseable", "", f"not JSON text: {err}", "file skipped")
    return None


def _records(data: dict, key: str, b: ChunkBuilder) -> list | None:
    value = data.get(key, [])
    if not isinstance(value, list):
        b.problem("bad_value", key, f"{key} is a {type(value).__name__}, not a list", "file skipped")
        return None
    return value


def _annotation(ann: dict, where: str, categories: dict, b: ChunkBuilder) -> None:
    cat = referred(ann, "category_id", categories, "categories", where, b)
    if cat is None:
        return
    name, kp_names = cat
    bbox = ann.get("bbox")
    box = None  # keypoints alone: the builder makes the box (boxes_from_points)
    if bbox not in (None, []) or not ann.get("keypoints"):
        box = _bbox(bbox, f"{where}/bbox", b)
        if box is None:
            return
    attrs = record_attributes(ann.get("attributes"), f"{where}/attributes", b)
    flags = {}
    for key in _FLAGS:
        text = attrs.pop(key, None)
        if (value := parse_flag(text)) is None:  # parse_flag(None) is False
            b.problem("bad_value", f"{where}/attributes/{key}", f"{key}={text!r} is not a boolean", "treated as false")
        flags[key] = bool(value)
    crowd = ann.get("iscrowd", 0)
    crowd_flag = parse_flag(record_text(crowd)) if crowd is not None else False
    if crowd_flag is None:
        b.problem("bad_value", f"{where}/iscrowd", f"iscrowd={crowd!r} is not 0/1", "treated as 0")
    points = _keypoints(ann.get("keypoints"), kp_names, f"{where}/keypoints", b)
    area = ann.get("area")
    if area is not None and not _area_ok(area):
        b.problem("bad_value", f"{where}/area", f"area={area!r} is not a number >= 0", "box area used", "repaired")
        area = None
    b.add_object(
        box, name, element=where, box_field="bbox", attributes=attrs, landmarks=points, crowd=bool(crowd_flag),
        area=area, **flags,
    )


def _area_ok(value: Any) -> bool:
    """Whether an ``area`` is a finite number >= 0 (as float32)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and 0 <= value < 3e38


def _bbox(bbox: Any, where: str, b: ChunkBuilder) -> tuple[float, float, float, float] | None:
    """``bbox`` ``[x, y, w, h]`` as xyxy; None and a problem when it is missing or bad."""
    if bbox is None:
        b.problem("missing_field", where, "bbox is missing", "object skipped")
        return None
    if not isinstance(bbox, list) or len(bbox) != 4:
        b.problem("bad_value", where, f"bbox={bbox!r} is not [x, y, w, h]", "object skipped")
        return None
    xywh = []
    for field, value in zip("xywh", bbox):
        v = b.number(value, where, field, "object skipped", json=True)
        if v is None:
            return None
        xywh.append(v)
    x, y, w, h = xywh
    return (x, y, x + w, y + h)


def _keypoints(
    values: Any, names: list[str] | None, where: str, b: ChunkBuilder
) -> list[tuple[str, float, float, int]] | None:
    if not isinstance(values, list) or len(values) % 3:
        if values is not None:
            shown = len(values) if isinstance(values, list) else type(values).__name__
            b.problem("landmark_count", where, f"{shown} values is not x,y,v triples", "landmarks skipped")
        return None
    if not values:
        return None
    n = len(values) // 3
    if names is None:
        names = b.positional_names(n, where)
        if names is None:
            return None
    elif len(names) != n:
        b.problem("landmark_count", where, f"{n} points, category names {len(names)} keypoints", "landmarks skipped")
        return None
    points: list[tuple[str, float, float, int]] = []
    for k, name in enumerate(names):
        at = f"{where}[{3 * k}]"
        v = b.number(values[3 * k + 2], at, f"{name}: v", "point skipped", json=True)
        if v is None:
            continue
        if v not in (0.0, 1.0, 2.0):
            b.problem("bad_value", at, f"{name}: v={values[3 * k + 2]!r} is not 0, 1 or 2", "point skipped")
            continue
        if v == 0:
            points.append((name, 0.0, 0.0, 0))
            continue
        x = b.number(values[3 * k], at, f"{name}: x", "point skipped", json=True)
        y = b.number(values[3 * k + 1], at, f"{name}: y", "point skipped", json=True)
        if x is None or y is None:
            continue
        points.append((name, x, y, int(v)))
    return points


class CocoReader(Reader):
    """COCO JSON (see the module docstring)."""

    name = NAME
    parallel = False

    def sniff(self, path: Path) -> bool:
        """A ``.json`` file that opens with an object holding ``images`` or ``annotations``, or a
        folder (or its ``annotations/``, ``train/``, ``valid/``, ...) with such files and no XML
        annotations."""
        if path.is_file():
            return path.suffix.lower() == ".json" and _looks_like_coco(path)
        return path.is_dir() and bool(_coco_files(path))

    def _files(self, folder: Path) -> list[Path]:
        """The format's JSON files in ``folder`` (and its ``annotations/``, split folders)."""
        return _coco_files(folder)

    def discover(self, path: Path, options: ReadOptions) -> CocoSource:
        """The COCO JSON at ``path`` (or its files of distinct splits), the dataset root and the
        candidate image folders of each file."""
        check_options(options, self.name, OPTIONS)
        path = path.resolve()
        found = [path] if path.is_file() else self._files(path)
        words = {js: _split_word(js, path) for js in found}
        splits = {js: word for js, (word, _) in words.items()}
        roles = [split_role(name) for name in splits.values()]
        if len(found) != 1 and (
            not found or None in roles or len(set(roles)) < len(roles) or len({t for _, t in words.values()}) > 1
        ):
            names = ", ".join(p.name for p in found) or "none"
            raise DetloaderValueError(
                f"path={str(path)!r} holds {len(found)} COCO files ({names}); pass one of them (files whose "
                "names differ only by a split word, as custom_train.json and custom_val.json, are read as one)"
            )
        js = found[0]
        root = js.parent.parent if js.parent.name.lower() == "annotations" else js.parent
        root = path if _in_split_folder(js, path) else root
        by_role: dict[str | None, list[str]] = {}  # train2017/, images/train/ for custom_train.json
        for top in (root, root / "images") if len(found) > 1 else ():
            for d in sorted(top.iterdir()) if top.is_dir() else ():
                if split_role(d.name) is not None and d.is_dir():
                    by_role.setdefault(split_role(d.name), []).append(os.path.relpath(d, root))
        dirs: dict[str, list[str]] = {}
        for js, split in splits.items():
            here = os.path.relpath(js.parent, root)
            here = here if here != "." else ""
            alike = by_role.get(split_role(split), [])
            names = [f"images/{split}", split, *alike, "images", "", here, os.path.join(here, "images")]
            dirs[os.path.relpath(js, root)] = candidate_dirs(root, names, options.image_dir)
        several = len(found) > 1
        every_dir = list(dict.fromkeys(d for ds in dirs.values() for d in ds))
        return file_source(
            CocoSource, found, root, every_dir, max_json_bytes=int(options.option("max_json_bytes", MAX_JSON_BYTES)),
            file_image_dirs=dirs if several else {},
            file_splits={rel: split_role(splits[js]) for rel, js in zip(dirs, found)} if several else {},
        )

    def parse_file(self, source: CocoSource, rel: str, b: ChunkBuilder) -> None:
        """The fast path (:func:`~detloader.annotations.readers.coco.parse_fast`) when the file
        fits it, else every record in Python; both report the same problems in the same order."""
        root = str(source.root)
        raw = _read(os.path.join(root, rel), source.max_json_bytes, b)
        if raw is None:
            return
        dirs = source.file_image_dirs.get(rel, source.image_dirs)
        locator = ImageLocator(root, dirs, b.options.check_images, listed=True)  # one file, many images
        if parse_fast(raw, locator, b):
            return
        data = _decode(raw, b)
        del raw
        if data is None:
            return
        if not isinstance(data, dict):
            b.problem("unsupported", "", f"top level is a {type(data).__name__}, not a {self.name.upper()} object",
                      "file skipped")
            return
        if "images" not in data:  # the objects would have no image: say so once, not once per object
            keys = ", ".join(sorted(map(str, data))[:8]) or "none"
            b.problem("missing_field", "images", f"images is missing (keys: {keys})", "file skipped")
            return
        images, annotations, cats = (_records(data, key, b) for key in ("images", "annotations", "categories"))
        if images is None or annotations is None or cats is None:
            return
        categories, _ = declare(cats, b)
        image_ids = image_rows(images, b)
        per_image: dict[int, list[int]] = {}
        first_of: dict[Any, int] = {}
        for j, ann in enumerate(annotations):
            where = f"annotations[{j}]"
            if not isinstance(ann, dict):
                b.problem("bad_value", where, "not an object", "object skipped")
                continue
            aid = coco_id(ann.get("id"))
            first = j if aid is None else first_of.setdefault(aid, j)
            if first != j and repeated_id(ann.get("id"), j, first, same_object(ann, annotations[first]), b):
                continue
            owner = referred(ann, "image_id", image_ids, "images", where, b)
            if owner is None:
                continue
            per_image.setdefault(owner, []).append(j)
        for i, img in enumerate(images):
            where = f"images[{i}]"
            if not image_problem(img, where, image_ids, i, b) and record_image(img, where, locator, b, categories):
                for j in per_image.get(i, ()):
                    _annotation(annotations[j], f"annotations[{j}]", categories, b)

    def splits(self, source: CocoSource, index: AnnotationIndex) -> dict[str, np.ndarray]:
        """One split per file when there are several (``instances_val2017.json`` -> ``val``)."""
        return files_as_splits(index, source.file_splits)

    def default_landmarks(self, source: CocoSource, names: Sequence[str]) -> LandmarkSchema | None:
        """The iBUG 68-point preset for names ``00`` .. ``67``; else names in category order with
        flip pairs from left/right spelling (None: the builder's default does exactly that)."""
        return preset_schema(names)


#: COCO 2017's image folders, where LVIS v1 images are (a ``coco_url`` names the folder).
COCO_IMAGE_FOLDERS = ("train2017", "val2017")


class LvisReader(CocoReader):
    """LVIS v1 (see the module docstring): ``lvis_v1_train.json`` + ``lvis_v1_val.json`` are
    read as one dataset, one split each (as any COCO files paired by a split word); every image
    is looked for by its ``coco_url``'s folder and name (``train2017/000000391895.jpg``; LVIS
    val images come from both COCO folders) below the root and ``images/``, then by its name
    in ``train2017/`` and ``val2017/``."""

    name = "lvis"

    def sniff(self, path: Path) -> bool:
        """A COCO file that looks like LVIS (:func:`_looks_like_lvis`), or a folder with one."""
        if path.is_file():
            return path.suffix.lower() == ".json" and _looks_like_lvis(path)
        return path.is_dir() and bool(self._files(path))

    def _files(self, folder: Path) -> list[Path]:
        """The LVIS files among the folder's COCO files (COCO's own instances files beside them are not read)."""
        return [p for p in _coco_files(folder) if _looks_like_lvis(p)]

    def discover(self, path: Path, options: ReadOptions) -> CocoSource:
        """:meth:`CocoReader.discover`, with COCO's image folders for every file, and a single
        file's split from its name (``lvis_v1_val.json`` -> ``val``; the folders its images lie
        in are COCO's splits, not LVIS's)."""
        source = super().discover(path, options)
        heres = [posixpath.dirname(rel) for rel in source.files]
        names = ["", "images", *COCO_IMAGE_FOLDERS, *(f"images/{d}" for d in COCO_IMAGE_FOLDERS), *heres]
        splits = {rel: split_role(_split_word(source.root / rel, path)[0]) for rel in source.files}
        return dataclasses.replace(
            source, image_dirs=candidate_dirs(source.root, names, options.image_dir), file_image_dirs={},
            file_splits={rel: role for rel, role in splits.items() if role is not None},
        )


def _integral(value: Any) -> bool:
    return (isinstance(value, int) and not isinstance(value, bool)) or (isinstance(value, float) and value.is_integer())


def coco_id(value: Any) -> int | str | None:
    """A COCO id as a dictionary key: a 64-bit int or a string (an integral float reads as the
    int); None for anything else (ints beyond 64 bits such as ``2**70``, which no index column
    holds; lists, objects, booleans, fractions, NaN, infinity)."""
    if _integral(value):
        value = int(value)
        return value if -(2**63) <= value < 2**63 else None
    return value if isinstance(value, str) else None


def bad_id(b: ChunkBuilder, where: str, field: str, value: Any, action: str) -> None:
    what = "is outside the 64-bit integer range" if _integral(value) else "is not an integer or string id"
    b.problem("bad_value", f"{where}/{field}", f"{field}={value!r} {what}", action)


def same_object(a: Any, b: Any) -> bool:
    """Whether two annotation records (dicts or fast-path records) give the same object: the
    same image, category and box (a second copy of it would count the object twice)."""
    fields = ("image_id", "category_id", "bbox")
    values = [[x.get(k) if isinstance(x, dict) else getattr(x, k) for k in fields] for x in (a, b)]
    for v in values:
        v[2] = tuple(v[2]) if isinstance(v[2], (list, tuple)) else v[2]
    return values[0] == values[1]


def repeated_id(value: Any, j: int, first: int, same: bool, b: ChunkBuilder) -> bool:
    """Report that ``annotations[j]`` repeats the id of ``annotations[first]``; whether it is
    skipped: a copy of that object (``same``) is, another object is kept (detloader keeps no
    annotation ids, but a COCO evaluation keyed by them would lose one of the two)."""
    if same:
        message = f"id={value!r} repeats annotations[{first}], the same object again"
        b.problem("duplicate_object", f"annotations[{j}]/id", message, "object skipped", "repaired")
    else:
        message = f"id={value!r} repeats annotations[{first}] for another object"
        b.problem("duplicate_object", f"annotations[{j}]/id", message, "object kept", "repaired")
    return same


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


def record_text(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (dict, list)):
        return json.dumps(value, sort_keys=True)
    return str(value).strip()


def record_attributes(value: Any, where: str, b: ChunkBuilder) -> dict[str, str]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        b.problem("bad_value", where, f"attributes={value!r} is not an object", "attributes skipped")
        return {}
    return {str(k).strip(): record_text(v) for k, v in value.items() if str(k).strip()}


def record_categories(records: list, b: ChunkBuilder) -> dict[Any, tuple[str, list[str] | None]]:
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
        if not isinstance(name, (str, int)) or isinstance(name, bool):  # an object's text would be a class
            b.problem("bad_value", f"{where}/name", f"name={name!r} is not a text", "category skipped")
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


def _url_name(url: Any) -> str | None:
    """The image a ``coco_url`` names, as its last folder and file name
    (``http://images.cocodataset.org/val2017/000000397133.jpg`` -> ``val2017/000000397133.jpg``)."""
    if not isinstance(url, str) or not url.strip():
        return None
    parts = [p for p in url.strip().split("?", 1)[0].split("/") if p]
    return "/".join(parts[-2:]) if len(parts) > 2 else (parts[-1] if parts else None)


def record_image(
    img: Any, where: str, locator: ImageLocator, b: ChunkBuilder, categories: dict[Any, tuple[str, Any]]
) -> tuple[int, int] | None:
    """Locate and add one image (a dict, or anything with ``.get``) by its ``file_name``, else
    (LVIS) its ``coco_url``'s folder and name; then its class lists (:func:`record_class_lists`).
    Its (width, height) when added, else None with the problem reported."""
    name, field = img.get("file_name"), "file_name"
    if not isinstance(name, str) or not name.strip():
        name, field = _url_name(img.get("coco_url")), "coco_url"
    if name is None:
        what = "file_name is missing" + (f", coco_url={img.get('coco_url')!r}" if img.get("coco_url") else "")
        b.problem("missing_field", f"{where}/file_name", what, "image skipped")
        return None
    raw = f"width={img.get('width')!r} height={img.get('height')!r}"
    width, height = record_text(img.get("width", "")), record_text(img.get("height", ""))
    shown = f"{field}={img.get(field)!r}"
    found = locate_image(locator, b, name, where, shown, width, height, name_where=f"{where}/{field}", raw=raw)
    if found is None:
        return None
    rel, width, height = found
    attrs = record_attributes(img.get("attributes"), f"{where}/attributes", b)
    image_class = attrs.pop(b.options.image_class_attribute, None)
    iid = coco_id(img.get("id"))
    image_id = iid if isinstance(iid, int) else None  # a string id: numbered by row
    added = b.add_image(rel, width, height, image_class=image_class, attributes=attrs, record=name, image_id=image_id)
    if not added:
        return None
    record_class_lists(img, where, categories, b)
    return width, height


#: LVIS's per-image category lists and the index's class list each becomes.
CLASS_LIST_FIELDS = (("neg_category_ids", "absent"), ("not_exhaustive_category_ids", "not_exhaustive"))


def record_class_lists(img: Any, where: str, categories: dict[Any, tuple[str, Any]], b: ChunkBuilder) -> None:
    """The image's ``neg_category_ids`` (classes verified absent) and ``not_exhaustive_category_ids``
    as its class lists; an id that is not a category's, or a list that is not one, is a
    ``bad_value`` problem (left out)."""
    for key, name in CLASS_LIST_FIELDS:
        ids = img.get(key)
        if ids is None:
            continue
        if not isinstance(ids, list):
            b.problem("bad_value", f"{where}/{key}", f"{key}={ids!r} is not a list of category ids", "list skipped")
            continue
        names = []
        for k, raw in enumerate(ids):
            cat = categories.get(coco_id(raw)) if coco_id(raw) is not None else None
            if cat is None:
                b.problem("bad_value", f"{where}/{key}[{k}]", f"{raw!r} is not in categories", "left out of the list")
            else:
                names.append(cat[0])
        b.add_class_list(name, names)


def is_record(value: Any) -> bool:
    """A JSON object: a dict (general path) or a decoded record of the fast path."""
    return isinstance(value, dict) or hasattr(type(value), "__struct_fields__")


def declare(records: list, b: ChunkBuilder) -> tuple[dict[Any, tuple[str, list[str] | None]], list[str]]:
    """The file's categories (:func:`categories`), declared to ``b`` in id order with their
    LVIS ``frequency`` when any has one (:func:`record_frequency`); and their names in that order."""
    found = record_categories(records, b)
    ordered = sorted(found.items(), key=id_order)
    letters = record_frequency(records, found, b)
    b.declare_classes(
        [name for _, (name, _) in ordered], [cid if isinstance(cid, int) else None for cid, _ in ordered],
        None if letters is None else [letters.get(cid) for cid, _ in ordered],
    )
    return found, [name for _, (name, _) in ordered]


#: LVIS's frequency groups: rare, common, frequent.
FREQUENCY_LETTERS = ("r", "c", "f")


def record_frequency(records: list, found: dict[Any, Any], b: ChunkBuilder) -> dict[Any, str | None] | None:
    """Category id -> LVIS ``frequency`` of the categories kept (``found``); None when no category
    has the field. A value other than ``"r"`` / ``"c"`` / ``"f"``, or a category without one
    beside others that have it, is a problem (the class is in no frequency group)."""
    if not any(isinstance(cat, dict) and "frequency" in cat for cat in records):
        return None
    letters: dict[Any, str | None] = {}
    for i, cat in enumerate(records):
        cid = coco_id(cat.get("id")) if isinstance(cat, dict) else None
        if cid not in found or cid in letters:
            continue
        letter = cat.get("frequency")
        letters[cid] = letter if letter in FREQUENCY_LETTERS else None
        where, action = f"categories[{i}]/frequency", "class in no frequency group"
        if letter is None:
            b.problem("missing_field", where, "frequency is missing", action)
        elif letter not in FREQUENCY_LETTERS:
            b.problem("bad_value", where, f"frequency={letter!r} is not one of 'r', 'c', 'f'", action)
    return letters


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


_I64 = Annotated[int, msgspec.Meta(ge=-(2**63), le=2**63 - 1)]
_NONE = Annotated[list, msgspec.Meta(max_length=0)]


class _Image(msgspec.Struct, gc=False):
    """An image record: its fields as in the file (any JSON value; UNSET when absent)."""

    id: Any = msgspec.UNSET
    file_name: Any = msgspec.UNSET
    width: Any = msgspec.UNSET
    height: Any = msgspec.UNSET
    attributes: Any = msgspec.UNSET
    coco_url: Any = msgspec.UNSET
    neg_category_ids: Any = msgspec.UNSET
    not_exhaustive_category_ids: Any = msgspec.UNSET

    def get(self, key: str, default: Any = None) -> Any:
        """``dict.get`` over the fields, so that the general path's image code reads it."""
        value = getattr(self, key, msgspec.UNSET)
        return default if value is msgspec.UNSET else value


#: the fast path's ``id`` of an object record without one
_NO_ID = -(2**63)


class _Object(msgspec.Struct, gc=False):
    """An object record as the fast path takes it (anything else refuses the file)."""

    image_id: _I64
    category_id: _I64
    bbox: tuple[float, float, float, float]
    id: _I64 = _NO_ID
    iscrowd: int | None = 0
    area: float | None = None
    keypoints: _NONE | None = None
    attributes: Annotated[dict, msgspec.Meta(max_length=0)] | None = None


class _File(msgspec.Struct):
    images: list[_Image] | msgspec.UnsetType = msgspec.UNSET  # missing: the general path names it
    annotations: list[_Object] = []
    categories: list[Any] = []


_DECODER = msgspec.json.Decoder(_File)


def _lookup(keys: dict[Any, int], values: np.ndarray) -> np.ndarray:
    """``keys[v]`` for every int64 ``v`` of ``values``, -1 where it is not a key (only int keys
    can match)."""
    pairs = sorted((k, i) for k, i in keys.items() if type(k) is int and -(2**63) <= k < 2**63)
    out = np.full(len(values), -1, dtype=np.int64)
    if pairs and len(values):
        ks = np.fromiter((k for k, _ in pairs), np.int64, len(pairs))
        at = np.minimum(np.searchsorted(ks, values), len(ks) - 1)
        hit = ks[at] == values
        out[hit] = np.fromiter((i for _, i in pairs), np.int64, len(pairs))[at[hit]]
    return out


def _first_of_repeated_ids(ids: np.ndarray) -> dict[int, int]:
    """``{position: first position with its id}`` for every record whose id (not ``_NO_ID``)
    repeats an earlier one's."""
    order = np.argsort(ids, kind="stable")
    sorted_ids = ids[order]
    again = np.flatnonzero((sorted_ids[1:] == sorted_ids[:-1]) & (sorted_ids[1:] != _NO_ID)) + 1
    if not len(again):
        return {}
    run_start = np.flatnonzero(np.r_[True, sorted_ids[1:] != sorted_ids[:-1]])
    first = order[run_start[np.searchsorted(run_start, again, side="right") - 1]]
    return dict(zip(order[again].tolist(), first.tolist()))


def _declared_sides(images: list[_Image]) -> np.ndarray:
    """``[n, 2]`` width, height as declared when both are positive ints (the size the image gets
    without reading its header), else -1 (its objects are checked one by one)."""
    sides = np.full((len(images), 2), -1, dtype=np.int64)
    for i, img in enumerate(images):
        w, h = img.width, img.height
        if type(w) is int and type(h) is int and 0 < w < 2**62 and 0 < h < 2**62:
            sides[i] = (w, h)
    return sides


def parse_fast(raw: bytes, locator: ImageLocator, b: ChunkBuilder) -> bool:
    """Parse the COCO file ``raw`` into ``b`` on the fast path (see the module docstring); False,
    with nothing added or reported, when the file needs the general path."""
    opts = b.options
    if opts.classes is not None or opts.class_map or opts.one_based:
        return False
    try:
        data = _DECODER.decode(raw)
    except (msgspec.MsgspecError, ValueError, RecursionError):
        return False
    images, objects = data.images, data.annotations
    if images is msgspec.UNSET or (objects and not images):
        return False
    if any(o.area is not None and not _area_ok(o.area) for o in objects):
        return False  # the general path names it
    found, names = declare(data.categories, b)
    image_ids = image_rows(images, b)
    m = len(objects)
    owner = _lookup(image_ids, np.fromiter((o.image_id for o in objects), np.int64, m))
    firsts = _first_of_repeated_ids(np.fromiter((o.id for o in objects), np.int64, m))
    for j in sorted({*np.flatnonzero(owner < 0).tolist(), *firsts}):  # before any image, as on the general path
        if j in firsts and repeated_id(objects[j].id, j, firsts[j], same_object(objects[j], objects[firsts[j]]), b):
            owner[j] = -1
        elif owner[j] < 0:
            message = f"image_id={objects[j].image_id!r} is not in images"
            b.problem("bad_value", f"annotations[{j}]/image_id", message, "object skipped")
    cat_rows = {cid: k for k, cid in enumerate(sorted(found, key=lambda c: id_order((c, None))))}
    labels = _lookup(cat_rows, np.fromiter((o.category_id for o in objects), np.int64, m))
    xywh = np.fromiter((o.bbox for o in objects), np.dtype((np.float64, 4)), m).reshape(m, 4)
    xyxy64 = np.concatenate([xywh[:, :2], xywh[:, :2] + xywh[:, 2:]], axis=1)
    sides = _declared_sides(images)[np.maximum(owner, 0)]
    with np.errstate(over="ignore", invalid="ignore"):  # beyond float32: inf, named by check_box
        boxes = xyxy64.astype(np.float32)
        plain = (
            np.isfinite(boxes).all(axis=1)
            & (boxes[:, 2] > boxes[:, 0])
            & (boxes[:, 3] > boxes[:, 1])
            & (boxes[:, 0] >= 0)
            & (boxes[:, 1] >= 0)
            & (boxes[:, 2] <= sides[:, 0])
            & (boxes[:, 3] <= sides[:, 1])
        )
    slow = (owner >= 0) & ~(plain & (labels >= 0))
    order = np.argsort(owner, kind="stable")  # objects grouped by image, in file order within one
    starts = np.searchsorted(owner[order], np.arange(len(images) + 1))
    slow_per_image = np.bincount(owner[slow], minlength=len(images)) if slow.any() else None
    keep = plain & (labels >= 0)
    row_of = np.full(len(images), -1, dtype=np.int64)
    first = b.image_count
    for i, img in enumerate(images):
        where = f"images[{i}]"
        if image_problem(img, where, image_ids, i, b):
            continue
        size = record_image(img, where, locator, b, found)
        if size is None:
            continue
        row_of[i] = b.image_count - 1
        if slow_per_image is not None and slow_per_image[i]:
            for j in order[starts[i] : starts[i + 1]].tolist():
                if slow[j]:
                    keep[j] = _check_one(j, objects[j], xyxy64[j], labels[j], boxes, size, b)
    kept = order[keep[order] & (row_of[np.maximum(owner[order], 0)] >= 0) & (owner[order] >= 0)]
    crowd = np.fromiter(((o.iscrowd or 0) != 0 for o in objects), np.bool_, m)
    area = np.fromiter((MISSING if o.area is None else o.area for o in objects), np.float64, m)
    b.add_objects(first, row_of[owner[kept]], boxes[kept], labels[kept], names, crowd[kept], area[kept])
    return True


def _check_one(
    j: int, obj: _Object, xyxy: np.ndarray, label: int, boxes: np.ndarray, size: tuple[int, int], b: ChunkBuilder
) -> bool:
    """The general path's checks of one object (unknown category, then the box); its stored box
    goes to ``boxes[j]``. Whether it is kept."""
    where = f"annotations[{j}]"
    if label < 0:
        message = f"category_id={obj.category_id!r} is not in categories"
        b.problem("bad_value", f"{where}/category_id", message, "object skipped")
        return False
    stored, finding = check_box(tuple(xyxy.tolist()), size[0], size[1], one_based=False, clip=b.options.clip_boxes)
    if finding is not None:
        b.report(finding, f"{where}/bbox")
    if stored is None:
        return False
    boxes[j] = stored
    return True
