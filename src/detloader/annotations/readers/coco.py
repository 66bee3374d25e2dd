"""COCO JSON: instances and person_keypoints files (and what CVAT / Datumaro export as COCO).

The JSON is loaded whole (the format gives no record boundary to stream on), under the format
option ``max_json_bytes``. Layouts, split files and image folders: docs/formats.md ("Each
reader's files and layouts", "What each format maps to"); positions in problems are 0-based,
as in the file (``annotations[17]/bbox``). A file of boxes takes the fast path
(:mod:`~detloader.annotations.readers.coco_fast`), any other the general one below; both give
the same index and problems (docs/index.md, "COCO at scale").
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from detloader._system.files import read_capped
from detloader.annotations.builder import ChunkBuilder
from detloader.annotations.checks import ReadOptions
from detloader.annotations.index import AnnotationIndex
from detloader.annotations.landmarks import LandmarkSchema, preset_schema
from detloader.annotations.readers import coco_records as rec
from detloader.annotations.readers.coco_fast import parse_fast
from detloader.annotations.readers.common import (
    Reader,
    Source,
    candidate_dirs,
    check_options,
    file_source,
    find_child_dir,
    parse_flag,
    read_head,
)
from detloader.annotations.readers.locate import ImageLocator
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


def _coco_files(folder: Path) -> list[Path]:
    places = [folder]
    ann = find_child_dir(folder, ("annotations",))
    if ann is not None:
        with os.scandir(ann) as entries:  # stops at the first: a listing of 100k files costs more than the read
            if any(e.name.lower().endswith(".xml") for e in entries):
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
    cat = rec.referred(ann, "category_id", categories, "categories", where, b)
    if cat is None:
        return
    name, kp_names = cat
    bbox = ann.get("bbox")
    box = None  # keypoints alone: the builder makes the box (boxes_from_points)
    if bbox not in (None, []) or not ann.get("keypoints"):
        box = _bbox(bbox, f"{where}/bbox", b)
        if box is None:
            return
    attrs = rec.attributes(ann.get("attributes"), f"{where}/attributes", b)
    flags = {}
    for key in _FLAGS:
        text = attrs.pop(key, None)
        if (value := parse_flag(text)) is None:  # parse_flag(None) is False
            b.problem("bad_value", f"{where}/attributes/{key}", f"{key}={text!r} is not a boolean", "treated as false")
        flags[key] = bool(value)
    crowd = ann.get("iscrowd", 0)
    crowd_flag = parse_flag(rec.text(crowd)) if crowd is not None else False
    if crowd_flag is None:
        b.problem("bad_value", f"{where}/iscrowd", f"iscrowd={crowd!r} is not 0/1", "treated as 0")
    points = _keypoints(ann.get("keypoints"), kp_names, f"{where}/keypoints", b)
    b.add_object(
        box, name, element=where, box_field="bbox", attributes=attrs, landmarks=points, crowd=bool(crowd_flag), **flags
    )


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

    def discover(self, path: Path, options: ReadOptions) -> CocoSource:
        """The COCO JSON at ``path`` (or its files of distinct splits), the dataset root and the
        candidate image folders of each file."""
        check_options(options, NAME, OPTIONS)
        path = path.resolve()
        found = [path] if path.is_file() else _coco_files(path)
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
        """The fast path (:func:`~detloader.annotations.readers.coco_fast.parse_fast`) when the file
        fits it, else every record in Python; both report the same problems in the same order."""
        root = str(source.root)
        raw = _read(os.path.join(root, rel), source.max_json_bytes, b)
        if raw is None:
            return
        locator = ImageLocator(root, source.file_image_dirs.get(rel, source.image_dirs), b.options.check_images)
        if parse_fast(raw, locator, b):
            return
        data = _decode(raw, b)
        del raw
        if data is None:
            return
        if not isinstance(data, dict):
            b.problem("unsupported", "", f"top level is a {type(data).__name__}, not a COCO object", "file skipped")
            return
        images, annotations, cats = (_records(data, key, b) for key in ("images", "annotations", "categories"))
        if images is None or annotations is None or cats is None:
            return
        categories, _ = rec.declare(cats, b)
        image_ids = rec.image_rows(images, b)
        per_image: dict[int, list[int]] = {}
        for j, ann in enumerate(annotations):
            where = f"annotations[{j}]"
            if not isinstance(ann, dict):
                b.problem("bad_value", where, "not an object", "object skipped")
                continue
            owner = rec.referred(ann, "image_id", image_ids, "images", where, b)
            if owner is None:
                continue
            per_image.setdefault(owner, []).append(j)
        for i, img in enumerate(images):
            where = f"images[{i}]"
            if not rec.image_problem(img, where, image_ids, i, b) and rec.image(img, where, locator, b):
                for j in per_image.get(i, ()):
                    _annotation(annotations[j], f"annotations[{j}]", categories, b)

    def splits(self, source: CocoSource, index: AnnotationIndex) -> dict[str, np.ndarray]:
        """One split per file when there are several (``instances_val2017.json`` -> ``val``)."""
        return files_as_splits(index, source.file_splits)

    def default_landmarks(self, source: CocoSource, names: Sequence[str]) -> LandmarkSchema | None:
        """The iBUG 68-point preset for names ``00`` .. ``67``; else names in category order with
        flip pairs from left/right spelling (None: the builder's default does exactly that)."""
        return preset_schema(names)
