"""Plain-text annotation lists: classification lists, RetinaFace ``label.txt``, WIDER FACE.

The kind (``list``, ``retinaface``, ``wider``) is recognised from the first lines; the format
option ``kind`` overrides. The kinds' lines and layouts: docs/formats.md ("Each reader's files
and layouts").
"""

from __future__ import annotations

import itertools
import os
import re
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from detloader.annotations.builder import ChunkBuilder
from detloader.annotations.checks import ReadOptions
from detloader.annotations.index import AnnotationIndex
from detloader.annotations.landmarks import FACE5, LandmarkSchema
from detloader.annotations.problems import check_choice
from detloader.annotations.readers.common import (
    Reader,
    Source,
    Stamp,
    candidate_dirs,
    check_options,
    parse_floats,
    read_head,
    stat_entry,
)
from detloader.annotations.readers.locate import IMAGE_SUFFIXES, ImageLocator, add_listed_image
from detloader.annotations.splits import files_as_splits
from detloader.errors import DetloaderValueError

NAME = "txt"
#: Format options this reader accepts (``read_annotations(path, **options)``).
OPTIONS: tuple[str, ...] = ("kind", "names")
KINDS = ("list", "retinaface", "wider")
LIST_NAMES = ("label", "labels", "train", "val", "valid", "validation", "test", "trainval")
NAMES_FILES = ("classes.txt", "names.txt")
FACE_CLASS = "face"
#: A whole number, as the face count and size fields hold it.
INTEGER = re.compile(r"^[+-]?\d+$")

#: WIDER FACE attribute columns and the words for their values.
WIDER_ATTRIBUTES: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("blur", ("clear", "normal", "heavy")),
    ("expression", ("typical", "exaggerate")),
    ("illumination", ("normal", "extreme")),
    ("invalid", ("false", "true")),
    ("occlusion", ("none", "partial", "heavy")),
    ("pose", ("typical", "atypical")),
)


def _is_image_path(token: str) -> bool:
    return token.lower().endswith(IMAGE_SUFFIXES)


def _split_list_line(line: str) -> tuple[str, str] | None:
    parts = line.rsplit(None, 1)
    if len(parts) == 2:
        return parts[0].strip(), parts[1].strip()
    if "," in line:
        path, label = line.rsplit(",", 1)
        return path.strip(), label.strip()
    return None


def detect_kind(path: Path) -> str | None:
    """``list``, ``retinaface`` or ``wider`` from the first lines of ``path``; None if none fits."""
    raw = read_head(path, 16384)
    try:
        head = raw.decode("utf-8", errors="strict" if len(raw) < 16384 else "ignore")
    except UnicodeDecodeError:
        return None
    rows = head.splitlines()
    if len(raw) == 16384 and len(rows) > 1:
        rows = rows[:-1]  # the last line may be cut
    lines = [line.strip() for line in rows if line.strip()]
    if not lines:
        return None
    first = lines[0]
    if first.startswith("#") and len(first) > 1:
        rest = first[1:].split()
        if rest and _is_image_path(rest[0]):
            return "retinaface"
    if _is_image_path(first) and len(lines) > 1 and INTEGER.match(lines[1]):
        return "wider"
    rows = [_split_list_line(line) for line in lines[:50] if not line.startswith("#")]
    if rows and all(r is not None and _is_image_path(r[0]) and r[1] for r in rows):
        return "list"
    return None


def _list_files(folder: Path) -> list[Path]:
    return [p for p in (folder / f"{name}.txt" for name in LIST_NAMES) if p.is_file() and detect_kind(p) is not None]


def _names(value: Any, root: Path, stamp: list[Stamp]) -> list[str]:
    if value is None:
        value = next((str(root / name) for name in NAMES_FILES if (root / name).is_file()), None)
        if value is None:
            return []
    if isinstance(value, (list, tuple)):
        return [str(v) for v in value]
    path = Path(value) if os.path.isabs(str(value)) else root / str(value)
    if not path.is_file():
        raise DetloaderValueError(f"names={str(value)!r} is neither a list nor an existing file")
    stamp.append(stat_entry(path, root))
    return [line.strip() for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


@dataclass(kw_only=True)
class TxtSource(Source):
    """The kind of each list file (by name) and the class names."""

    kinds: dict[str, str]
    names: list[str]


def _numbered(fh: Iterable[str]) -> Iterator[tuple[int, str]]:
    """(line number, stripped text) of the non-empty lines."""
    for n, line in enumerate(fh, start=1):
        text = line.strip()
        if text:
            yield n, text


def _parse_list(lines: Iterator[tuple[int, str]], locator: ImageLocator, names: list[str], b: ChunkBuilder) -> None:
    for n, text in lines:
        if text.startswith("#"):
            continue
        where = f"line {n}"
        row = _split_list_line(text)
        if row is None or not row[0] or not row[1]:
            b.problem("bad_value", where, f"{text!r} is not 'path label'", "image skipped")
            continue
        path, label = row
        if names and INTEGER.match(label):
            i = int(label)
            if not 0 <= i < len(names):
                b.problem("bad_value", where, f"label={label} is not in names (0..{len(names) - 1})", "image skipped")
                continue
            label = names[i]
        add_listed_image(locator, path, where, b, image_class=label)


def parse_retinaface(lines: Iterator[tuple[int, str]], locator: ImageLocator, b: ChunkBuilder) -> None:
    """A RetinaFace ``label.txt``: ``# path [w h]`` lines, then one face per line."""
    open_image = False
    for n, text in lines:
        where = f"line {n}"
        if text.startswith("#"):
            tokens = text[1:].split()
            if not tokens:
                b.problem("missing_field", where, "image path is missing after '#'", "image skipped")
                open_image = False
                continue
            size = None
            if len(tokens) >= 3 and INTEGER.match(tokens[-1]) and INTEGER.match(tokens[-2]):
                size = (int(tokens[-2]), int(tokens[-1]))
                tokens = tokens[:-2]
            open_image = add_listed_image(locator, " ".join(tokens), where, b, size)
            continue
        if not open_image:
            continue  # faces of a skipped image (its problem is reported)
        values = parse_floats(text.split(), where, b, "object skipped")
        if values is None:
            continue
        if len(values) not in (4, 5, 19, 20):
            message = f"{len(values)} values: expected x y w h [+ 5 x (x y flag) + score]"
            b.problem("bad_value", where, message, "object skipped")
            continue
        x, y, w, h = values[:4]
        points = None
        if len(values) >= 19:
            points = []
            for k, name in enumerate(FACE5.names):
                px, py, flag = values[4 + 3 * k : 7 + 3 * k]
                points.append((name, 0.0, 0.0, 0) if px < 0 and py < 0 else (name, px, py, 1 if flag == 1.0 else 2))
        b.add_object(
            (x, y, x + w, y + h), FACE_CLASS, element=where, box_field="", landmarks=points, landmark_field="landmarks"
        )


def parse_wider(lines: Iterator[tuple[int, str]], locator: ImageLocator, b: ChunkBuilder) -> None:
    """A WIDER FACE ``wider_face_*_bbx_gt.txt``: path, face count, one face per line."""
    for n, text in lines:
        where = f"line {n}"
        path = text
        try:
            n_count, count_text = next(lines)
        except StopIteration:
            b.problem("missing_field", where, f"{path!r}: the face count line is missing", "image skipped")
            return
        if not INTEGER.match(count_text):
            message = f"face count {count_text!r} is not an integer"
            b.problem("unparseable", f"line {n_count}", message, "rest of the file skipped")
            return
        count = int(count_text)
        rows = list(itertools.islice(lines, max(count, 1)))  # a count of 0 is followed by one line of zeros
        if count == 0 and rows and set(rows[0][1].split()) != {"0"}:
            message = "expected a line of zeros after a count of 0"
            b.problem("unparseable", f"line {rows[0][0]}", message, "rest of the file skipped")
            return
        if len(rows) < count:
            b.problem("missing_field", where, f"{path!r}: {count} faces announced, {len(rows)} given", "image skipped")
            return
        if not add_listed_image(locator, path, where, b):
            continue
        for n_row, row in rows[:count]:
            _wider_face(row, f"line {n_row}", b)


def _wider_face(text: str, where: str, b: ChunkBuilder) -> None:
    values = parse_floats(text.split(), where, b, "object skipped")
    if values is None:
        return
    if len(values) != 10:
        b.problem("bad_value", where, f"{len(values)} values: expected x y w h + 6 attributes", "object skipped")
        return
    x, y, w, h = values[:4]
    attrs: dict[str, str] = {}
    codes: dict[str, int] = {}
    for (name, words), value in zip(WIDER_ATTRIBUTES, values[4:]):
        code = int(value) if value.is_integer() else -1
        if not 0 <= code < len(words):
            message = f"{name}={value:g} is not one of 0..{len(words) - 1}"
            b.problem("bad_value", f"{where}/{name}", message, "attribute skipped")
            continue
        codes[name] = code
        attrs[name] = words[code]
    b.add_object(
        (x, y, x + w, y + h),
        FACE_CLASS,
        element=where,
        box_field="",
        difficult=codes.get("invalid", 0) == 1,
        occluded=codes.get("occlusion", 0) > 0,
        attributes=attrs,
    )


class TxtReader(Reader):
    """Plain-text lists: classification, RetinaFace, WIDER FACE (see the module docstring)."""

    name = NAME
    parallel = False

    def default_landmarks(self, source: Source, names: Sequence[str]) -> LandmarkSchema | None:
        return FACE5

    def sniff(self, path: Path) -> bool:
        """A ``.txt`` file of one of the three kinds, or a folder with ``label.txt`` or split lists."""
        if path.is_file():
            return path.suffix.lower() == ".txt" and detect_kind(path) is not None
        return path.is_dir() and bool(_list_files(path))

    def discover(self, path: Path, options: ReadOptions) -> TxtSource:
        """The list file(s) at ``path``, the kind of each, class names and image folders."""
        check_options(options, NAME, OPTIONS)
        path = path.resolve()
        if path.is_file():
            lists = [path]
        else:
            lists = _list_files(path)
            if not lists:
                raise DetloaderValueError(
                    f"path={str(path)!r} holds no list file ({', '.join(n + '.txt' for n in LIST_NAMES)})"
                )
            if any(p.stem in ("label", "labels") for p in lists) and len(lists) > 1:
                lists = [p for p in lists if p.stem in ("label", "labels")][:1]
        root = lists[0].parent
        kind_option = options.option("kind")
        if kind_option is not None:
            check_choice("kind", kind_option, KINDS)
        kinds = {}
        for p in lists:
            kind = kind_option or detect_kind(p)
            if kind is None:
                raise DetloaderValueError(f"{p.name}: not a 'path label' list, RetinaFace label.txt or WIDER FACE file")
            kinds[p.name] = kind
        stamp = [stat_entry(p, root) for p in lists]
        names = _names(options.option("names"), root, stamp)
        dirs = candidate_dirs(root, ("images", ""), options.image_dir)
        files = [os.path.relpath(p, root) for p in lists]
        return TxtSource(root=root, files=files, stamp=stamp, image_dirs=dirs, kinds=kinds, names=names)

    def parse_file(self, source: TxtSource, rel: str, builder: ChunkBuilder) -> None:
        root = str(source.root)
        locator = ImageLocator(root, source.image_dirs, builder.options.check_images)
        kind = source.kinds[os.path.basename(rel)]
        try:
            with open(os.path.join(root, rel), encoding="utf-8") as fh:
                lines = _numbered(fh)
                if kind == "list":
                    _parse_list(lines, locator, source.names, builder)
                elif kind == "retinaface":
                    parse_retinaface(lines, locator, builder)
                else:
                    parse_wider(lines, locator, builder)
        except OSError as err:
            builder.problem("unreadable_file", "", f"{err.strerror or err}", "file skipped")
        except UnicodeDecodeError as err:
            builder.problem("unparseable", "", f"not UTF-8 text: {err.reason}", "rest of the file skipped")

    def splits(self, source: TxtSource, index: AnnotationIndex) -> dict[str, np.ndarray]:
        """One split per list file when there are several (``train.txt`` -> ``train``); their
        lines are checked as they are parsed (``bad_value``, ``missing_image``, ``duplicate_image``)."""
        if len(source.files) < 2:
            return {}
        return files_as_splits(index, {rel: os.path.splitext(os.path.basename(rel))[0] for rel in source.files})
