"""Open Images V6 / V7 boxes (``format="openimages"``): each split's boxes CSV, its human
image-level labels, the class descriptions and the class hierarchy JSON, told by their header
row (the descriptions and the hierarchy by their shape), the split by the file name's split word
(``validation-annotations-bbox.csv`` -> ``val``). docs/formats.md, "Open Images".

Streamed: the CSVs are read row by row, and a split's boxes and labels, both sorted by
``ImageID`` as Open Images ships them, are walked together one image at a time: memory holds
the index being built, not the rows. The images are those of the boxes file (of the labels
file for a split without one); an image with labels and no box, a verified negative, is read
when its file is there (else its labels are counted in ``labels_of_images_not_found``).
Coordinates are fractions of the image, whose size the image header gives. ``IsOccluded`` /
``IsTruncated`` are the index's flags, ``IsGroupOf`` its crowd flag, ``IsDepiction`` /
``IsInside`` the attributes ``depiction`` / ``inside`` (``"1"``, or ``"-1"`` unknown; unset
where the file says 0); labels of confidence 1 / 0 the image's ``present`` / ``absent`` class
lists; the hierarchy ``index.meta["hierarchy"]`` (class -> every ancestor class), each class's
MID ``index.meta["mids"]``. Problems name the file, the line (1-based, the header is line 1)
and the value.
"""

from __future__ import annotations

import csv
import io
import json
import os
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from detloader._system.files import open_regular, read_capped
from detloader.annotations.builder import ChunkBuilder
from detloader.annotations.checks import ReadOptions
from detloader.annotations.index import AnnotationIndex
from detloader.annotations.problems import Problem
from detloader.annotations.readers.common import (
    Reader,
    Source,
    candidate_dirs,
    check_options,
    find_child_dir,
    holds_xml,
    read_head,
    stat_entry,
)
from detloader.annotations.readers.locate import ImageLocator, find_image, size_from_header
from detloader.annotations.splits import files_as_splits, split_role
from detloader.errors import DetloaderValueError

NAME = "openimages"
BOX_COLUMNS = ("ImageID", "LabelName", "XMin", "XMax", "YMin", "YMax")
LABEL_COLUMNS = ("ImageID", "LabelName", "Confidence")
#: Box columns -> the index's per-object flags, and -> object attributes.
FLAGS = {"IsOccluded": "occluded", "IsTruncated": "truncated", "IsGroupOf": "crowd"}
ATTRIBUTES = {"IsDepiction": "depiction", "IsInside": "inside"}
#: The hierarchy JSON's size cap (Open Images' is 86 kB).
MAX_HIERARCHY_BYTES = 64 * 1024**2
_FOLDERS = ("annotations", "labels", "metadata")
_MID = re.compile(r"^/[mg]/\w+$")


def _header(path: Path) -> list[str]:
    line = read_head(path, 4096).split(b"\n", 1)[0].decode("utf-8", "replace").strip().lstrip("\ufeff")
    return [c.strip() for c in line.split(",")]


def _kind(path: Path) -> str | None:
    """``"boxes"``, ``"labels"``, ``"classes"`` (descriptions), ``"hierarchy"`` or None."""
    if path.suffix.lower() == ".json":
        return "hierarchy" if re.match(rb'\s*\{\s*"LabelName"', read_head(path, 256)) else None
    header = _header(path)
    if set(BOX_COLUMNS) <= set(header) and "Score" not in header:  # with Score: detections
        return "boxes"
    if set(LABEL_COLUMNS) <= set(header) and "machine" not in path.name.lower():
        return "labels"
    if len(header) == 2 and (header == ["LabelName", "DisplayName"] or _MID.match(header[0])):
        return "classes"
    return None


def _files(folder: Path) -> dict[str, list[Path]]:
    """The dataset's files in ``folder`` and its annotations/ labels/ metadata/ folders, by kind
    (not an annotations/ folder with XML files in it: VOC's, as for COCO)."""
    places = [folder, *(d for d in (find_child_dir(folder, [n]) for n in _FOLDERS) if d is not None)]
    out: dict[str, list[Path]] = {}
    for place in places:  # a YOLO labels/ folder holds 100,000 names: one text search first
        if place is not folder and place.name.lower() == "annotations" and holds_xml(place):
            continue
        names = os.listdir(place)
        text = "\n".join(names).lower()
        if ".csv" not in text and ".json" not in text:
            continue
        names = sorted(name for name in names if name.lower().endswith((".csv", ".json")))
        for p in (place / name for name in names):
            if p.is_file() and (kind := _kind(p)):
                out.setdefault(kind, []).append(p)
    return out


def _split_word(path: Path) -> str | None:
    return next((w for w in re.split(r"[-_.]", path.stem) if split_role(w)), None)


@dataclass(kw_only=True)
class OpenImagesSource(Source):
    """Per unit (a split's boxes CSV, or its labels CSV when it has none): ``[boxes, labels]``
    (either None), split and image folders; the classes as ``[MID, name]``, the descriptions and
    hierarchy files; ``class_map`` (the hierarchy is named as the index's classes are)."""

    parts: dict[str, list[str | None]]
    file_splits: dict[str, str]
    file_image_dirs: dict[str, list[str]]
    classes_file: str | None
    class_names: list[list[str]]
    hierarchy_file: str | None
    class_map: list[list[Any]]


def _class_names(path: Path, rel: str, problems: list[Problem]) -> list[list[str]]:
    """``[MID, display name]`` per row of the descriptions; a name that several MIDs share, or
    none, becomes ``"Name (MID)"`` with a problem naming the line."""
    rows: list[tuple[int, str, str]] = []
    with open_regular(path) as fh, io.TextIOWrapper(fh, encoding="utf-8", newline="") as text:
        reader = csv.reader(text)
        for row in reader:
            if len(row) >= 2 and _MID.match(row[0].strip()):
                rows.append((reader.line_num, row[0].strip(), row[1].strip()))
    lines: dict[str, list[tuple[int, str]]] = {}
    for line, mid, name in rows:
        lines.setdefault(name, []).append((line, mid))
    out = []
    for line, mid, name in rows:
        if name and len(lines[name]) == 1:
            out.append([mid, name])
            continue
        others = ", ".join(f"{m} (line {n})" for n, m in lines[name] if m != mid)
        message = f"DisplayName={name!r} also names {others}" if name else "DisplayName is empty"
        shown = f"{name} ({mid})" if name else mid
        problems.append(Problem("bad_value", rel, f"line {line}/DisplayName", message, f"class named {shown!r}",
                                "repaired"))
        out.append([mid, shown])
    return out


class OpenImagesReader(Reader):
    """Open Images CSVs (see the module docstring)."""

    name = NAME
    parallel = False

    def sniff(self, path: Path) -> bool:
        """A boxes CSV (its header names ``ImageID``, ``LabelName``, ``XMin`` .. ``YMax``), or a
        folder holding one (or its ``annotations/``, ``labels/``, ``metadata/`` folders)."""
        try:
            if path.is_file():
                return path.suffix.lower() == ".csv" and _kind(path) == "boxes"
            return path.is_dir() and "boxes" in _files(path)
        except OSError:
            return False

    def discover(self, path: Path, options: ReadOptions) -> OpenImagesSource:
        """The boxes and labels CSVs of each split, the class descriptions and the hierarchy."""
        check_options(options, NAME, ())
        path = path.resolve()
        folder = path.parent if path.is_file() else path
        root = folder.parent if folder.name.lower() in _FOLDERS else folder
        found = _files(folder if path.is_dir() else root)
        if path.is_file():
            found["boxes"] = [path]
        boxable_first = sorted(found.get("labels", []), key=lambda p: "boxable" not in p.name.lower())
        by_role: dict[str | None, list[Path | None]] = {}  # role -> [boxes, labels]
        for p in found.get("boxes", []):
            role = split_role(_split_word(p) or "")
            if role in by_role:
                raise DetloaderValueError(
                    f"path={str(path)!r}: {by_role[role][0].name} and {p.name} are both boxes of split "  # type: ignore[union-attr]
                    f"{role or '(no split word)'}; pass one of them"
                )
            by_role[role] = [p, None]
        for p in boxable_first:
            role = split_role(_split_word(p) or "")
            if (not path.is_file() or role in by_role) and by_role.setdefault(role, [None, None])[1] is None:
                by_role[role][1] = p
        if None in by_role and len(by_role) > 1:
            named = ", ".join(p.name for r, pair in by_role.items() for p in pair if r and p)
            raise DetloaderValueError(
                f"path={str(path)!r}: {next(p for p in by_role[None] if p).name} has no split word (train, "
                f"validation, test) beside {named}; pass one file"
            )
        problems: list[Problem] = []
        classes = sorted(found.get("classes", []), key=lambda p: "boxable" not in p.name.lower())
        classes_rel = os.path.relpath(classes[0], root) if classes else None
        names = _class_names(classes[0], classes_rel, problems) if classes else []  # type: ignore[arg-type]
        hierarchy = found.get("hierarchy", [None])[0]
        rel = {p: os.path.relpath(p, root) for pair in by_role.values() for p in pair if p}
        units = {rel[pair[0] or pair[1]]: pair for pair in by_role.values()}  # type: ignore[index]
        if not classes and units:
            problems.append(Problem("missing_field", min(units), "", "no class descriptions CSV (LabelName,"
                                    "DisplayName) beside it", "classes named by their MID", "repaired"))
        dirs = {}
        for unit, pair in units.items():
            word = _split_word(pair[0] or pair[1]) or ""  # type: ignore[arg-type]
            role = split_role(word) or ""
            here = os.path.dirname(unit)
            splits = [x for w in dict.fromkeys([word, role]) if w for x in (w, f"images/{w}", f"{w}/data")]
            dirs[unit] = candidate_dirs(root, [*splits, "images", "data", "", here], options.image_dir)
        stamped = [*rel, *classes[:1], *([hierarchy] if hierarchy else [])]
        return OpenImagesSource(
            root=root, files=sorted(units), stamp=[stat_entry(p, root) for p in stamped],
            image_dirs=list(dict.fromkeys(d for ds in dirs.values() for d in ds)), problems=problems,
            parts={u: [rel[p] if p else None for p in pair] for u, pair in units.items()},
            file_splits={rel[pair[0] or pair[1]]: r for r, pair in by_role.items() if r},  # type: ignore[index]
            file_image_dirs=dirs, classes_file=classes_rel, class_names=names,
            hierarchy_file=os.path.relpath(hierarchy, root) if hierarchy else None,
            class_map=[list(pair) for pair in options.class_map],
        )

    def parse_file(self, source: OpenImagesSource, rel: str, b: ChunkBuilder) -> None:
        """One split: its images in ``ImageID`` order, each with its boxes and its labels."""
        names = {mid: name for mid, name in source.class_names}
        if names:
            b.declare_classes(list(names.values()))
        boxes_rel, labels_rel = source.parts[rel]
        root = str(source.root)
        locator = ImageLocator(root, source.file_image_dirs.get(rel, source.image_dirs), b.options.check_images)
        boxes = _groups(_rows(source.root, boxes_rel, BOX_COLUMNS, b), boxes_rel, b) if boxes_rel else iter(())
        labels = _groups(_rows(source.root, labels_rel, LABEL_COLUMNS, b), labels_rel, b) if labels_rel else iter(())
        for image_id, line, box_rows, label_rows in _by_image(boxes, labels):
            where = f"line {line}/ImageID"
            if boxes_rel is not None and not box_rows:  # labels alone: a verified negative image, when it is here
                where = f"{labels_rel} {where}"
                found = locator.find(f"{image_id}.jpg")
                if found is None:
                    b.count("labels_of_images_not_found", len(label_rows))
                    continue
            else:
                found = find_image(locator, b, f"{image_id}.jpg", where, f"ImageID={image_id!r}")
            size = None if found is None else size_from_header(b, root, found, where)
            if found is None or size is None or not b.add_image(found, *size, record=image_id):
                continue
            for row_line, row in box_rows:
                _box(row, f"line {row_line}", names, source.classes_file, size, b)
            verified: dict[str, list[str]] = {"present": [], "absent": []}
            for row_line, row in label_rows:
                confidence = row["Confidence"]
                if confidence not in ("0", "1"):
                    b.problem("bad_value", f"line {row_line}/Confidence", f"Confidence={confidence!r} is not 0 or 1",
                              "label skipped", file=labels_rel)
                    continue
                name = _class_of(row["LabelName"], names)
                if name is None:
                    b.count("labels_of_undescribed_classes")
                    continue
                verified["present" if confidence == "1" else "absent"].append(name)
            for kind, listed in verified.items():
                b.add_class_list(kind, listed)

    def splits(self, source: OpenImagesSource, index: AnnotationIndex) -> dict[str, np.ndarray]:
        """One split per file with a split word; also records the hierarchy and MIDs in ``index.meta``."""
        _record_hierarchy(source, index)
        return files_as_splits(index, source.file_splits)


def _rows(root: Path, rel: str, required: tuple[str, ...], b: ChunkBuilder) -> Iterator[tuple[int, dict[str, str]]]:
    """(line, row by column name) of the CSV ``rel``, streamed; a row of the wrong length, or a
    file that is not UTF-8 CSV, is a problem naming the line (the row, or the rest, skipped)."""
    try:
        with open_regular(root / rel) as fh, io.TextIOWrapper(fh, encoding="utf-8", newline="") as text:
            reader = csv.reader(text)
            header = [c.strip().lstrip("\ufeff") for c in next(reader, [])]
            missing = [c for c in required if c not in header]
            if missing:
                b.problem("missing_field", "line 1", f"columns {', '.join(missing)} missing", "file skipped", file=rel)
                return
            for row in reader:
                if len(row) != len(header):
                    message = f"{len(row)} values, the header names {len(header)}: {','.join(row)[:80]!r}"
                    b.problem("bad_value", f"line {reader.line_num}", message, "row skipped", file=rel)
                    continue
                yield reader.line_num, dict(zip(header, (v.strip() for v in row)))
    except (OSError, UnicodeDecodeError, csv.Error) as err:
        b.problem("unparseable", "", f"not a UTF-8 CSV file: {err}", "rest of the file skipped", file=rel)


Rows = list[tuple[int, dict[str, str]]]


def _by_image(
    boxes: Iterator[tuple[str, int, Rows]], labels: Iterator[tuple[str, int, Rows]]
) -> Iterator[tuple[str, int, Rows, Rows]]:
    """(ImageID, its first line, its box rows, its label rows) of every image of either stream
    (:func:`_groups`, both in ``ImageID`` order), walked together."""
    box, label = next(boxes, None), next(labels, None)
    while box is not None or label is not None:
        if box is not None and (label is None or box[0] <= label[0]):
            both = label is not None and label[0] == box[0]
            yield box[0], box[1], box[2], label[2] if both else []  # type: ignore[index]
            box, label = next(boxes, None), next(labels, None) if both else label
        else:
            yield label[0], label[1], [], label[2]  # type: ignore[index]
            label = next(labels, None)


def _groups(rows: Iterator[tuple[int, dict[str, str]]], rel: str, b: ChunkBuilder) -> Iterator[tuple[str, int, Rows]]:
    """(ImageID, first line, rows) of consecutive rows of one image; an ImageID lower than the
    one before (a file not sorted by ImageID) is a problem, and the rest of the file is skipped."""
    current: tuple[str, int, Rows] | None = None
    for line, row in rows:
        image = row["ImageID"]
        if current is not None and image == current[0]:
            current[2].append((line, row))
            continue
        if current is not None:
            if image < current[0]:
                message = (f"ImageID={image!r} comes after {current[0]!r} (line {current[1]}): the file is not "
                           "sorted by ImageID, as Open Images' files are; sort its rows (header first)")
                b.problem("bad_value", f"line {line}/ImageID", message, "rest of the file skipped", file=rel)
                return
            yield current
        current = (image, line, [(line, row)])
    if current is not None:
        yield current


def _class_of(mid: str, names: dict[str, str]) -> str | None:
    """The class of ``mid``: its described name (None: not described); the MID itself without descriptions."""
    return names.get(mid) if names else mid


def _box(row: dict[str, str], where: str, names: dict[str, str], classes_file: str | None,
         size: tuple[int, int], b: ChunkBuilder) -> None:
    mid = row["LabelName"]
    name = _class_of(mid, names)
    if name is None:
        b.problem("unknown_class", f"{where}/LabelName", f"LabelName={mid!r} is not in {classes_file}",
                  "object skipped")
        return
    coords = [b.number(row[c], f"{where}/{c}", c, "object skipped") for c in ("XMin", "YMin", "XMax", "YMax")]
    if any(v is None for v in coords):
        return
    w, h = size
    x0, y0, x1, y1 = coords
    flags, attributes = {}, {}
    for column, flag in FLAGS.items():
        flags[flag] = _flag(row.get(column, "0"), f"{where}/{column}", column, b) == "1"
    for column, attribute in ATTRIBUTES.items():  # set where not 0: a cell per object would cost 100 bytes
        if column in row and (value := _flag(row[column], f"{where}/{column}", column, b)) not in (None, "0"):
            attributes[attribute] = value
    b.add_object((x0 * w, y0 * h, x1 * w, y1 * h), name, element=where, box_field="", attributes=attributes,
                 **flags)  # type: ignore[arg-type]


def _flag(text: str, where: str, column: str, b: ChunkBuilder) -> str | None:
    """``"1"`` / ``"0"``, ``"-1"`` (Open Images' unknown, counted in ``unknown_flag_values``),
    None with a ``bad_value`` problem for anything else."""
    if text in ("0", "1"):
        return text
    if text == "-1":
        b.count("unknown_flag_values")
        return text
    b.problem("bad_value", where, f"{column}={text!r} is not 0, 1 or -1", "read as 0")
    return None


def _subcategories(node: Any) -> list[Any]:
    sub = node.get("Subcategory", []) if isinstance(node, dict) else []
    return sub if isinstance(sub, list) else [sub]


def _record_hierarchy(source: OpenImagesSource, index: AnnotationIndex) -> None:
    """``index.meta["mids"]`` (class -> MID) and ``["hierarchy"]`` (class -> its ancestor
    classes, the file's root excluded, as the challenge's expansion does), after ``class_map``."""
    mapping = {k: v for k, v in source.class_map}
    classes = set(index.classes)
    final: dict[str, str] = {}
    for mid, name in source.class_names or [[m, m] for m in index.classes if _MID.match(m)]:
        name = mapping.get(name, name)
        if name in classes:
            final[mid] = name
    index.meta["mids"] = {name: mid for mid, name in final.items()}
    if source.hierarchy_file is None:
        return
    try:
        tree = json.loads(read_capped(source.root / source.hierarchy_file, MAX_HIERARCHY_BYTES, "max_hierarchy_bytes"))
    except (OSError, ValueError, RecursionError) as err:
        index.problems.add(Problem("unparseable", source.hierarchy_file, "", str(err), "classes scored flat"))
        return
    parents: dict[str, set[str]] = {}

    def walk(node: Any, above: str | None) -> None:
        mid = node.get("LabelName") if isinstance(node, dict) else None
        if not isinstance(mid, str):
            index.problems.add(Problem("bad_value", source.hierarchy_file or "", "", f"node {node!r:.80} has no "
                                       "LabelName", "node skipped"))
            return
        parents.setdefault(mid, set()).update([above] if above else [])
        for child in _subcategories(node):
            walk(child, mid)

    try:
        for top in _subcategories(tree):  # the root (Entity) is no ancestor
            walk(top, None)
    except RecursionError:
        index.problems.add(Problem("unparseable", source.hierarchy_file, "", "nested too deeply",
                                   "classes scored flat"))
        return
    ancestors: dict[str, set[str]] = {}

    def up(mid: str) -> set[str]:
        if mid not in ancestors:
            ancestors[mid] = set()
            ancestors[mid] = set().union(*({p} | up(p) for p in parents.get(mid, ())))
        return ancestors[mid]

    hierarchy: dict[str, set[str]] = {}
    for mid, name in final.items():
        above = {final[a] for a in up(mid) if a in final} - {name}
        if above:
            hierarchy.setdefault(name, set()).update(above)
    index.meta["hierarchy"] = {name: sorted(above) for name, above in sorted(hierarchy.items())}
