"""Helpers shared by the readers (XML ones live in
:mod:`~detloader.annotations.readers.safe_xml`).

* :class:`Source` (what a reader found) and :func:`scan_files` / :func:`stat_entry` (the files
  whose change rebuilds the index); :func:`file_source` for a one-file format;
* :func:`read_head` lets ``sniff`` look at a file without reading it whole; :func:`read_capped`
  reads one under a size cap (:class:`FileTooLargeError`);
* :class:`ImageLocator` finds the image an annotation names among candidate folders;
  :func:`declared_size` / :func:`header_size` / :func:`image_size` take an image size from
  the annotation or the image header, as a problem when neither gives one;
* value parsers: :func:`parse_flag` / :func:`flag_value` (0/1 flags), :func:`int_or_none`
  (sizes), :func:`is_number` / :func:`parse_floats` (coordinate lists, a ``bad_value``
  problem naming the first token that is not a number).
"""

from __future__ import annotations

import ntpath
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Sequence

from detloader.annotations.cache import CACHE_SUBDIR
from detloader.annotations.builder import ChunkBuilder, ReadOptions

__all__ = [
    "IMAGE_EXTENSIONS",
    "FileTooLargeError",
    "ImageLocator",
    "Source",
    "candidate_dirs",
    "check_options",
    "declared_size",
    "dir_mtime",
    "file_source",
    "find_child_dir",
    "flag_value",
    "header_size",
    "image_header_size",
    "image_size",
    "int_or_none",
    "is_number",
    "parse_flag",
    "parse_floats",
    "read_capped",
    "read_head",
    "scan_files",
    "stat_entry",
]

#: Image file extensions tried when an annotation names an image without one (or wrongly).
IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".bmp", ".tif", ".tiff", ".webp", ".JPG", ".JPEG", ".PNG")


@dataclass
class Source:
    """What a reader found at the user's path, before parsing anything.

    Attributes:
        format: reader name (``voc``, ``cvat``, ...).
        root: the dataset root; image and annotation paths in the index are relative to it.
        files: annotation files relative to ``root``, sorted: the units of (parallel) work.
        stamp: ``(relative path, mtime_ns, size)`` of every file whose change must rebuild the
            index (annotation files, split files, class-name files).
        extra: format-specific facts (image folder, split files); JSON-serialisable, part of
            the cache key.
    """

    format: str
    root: Path
    files: list[str]
    stamp: list[tuple[str, int, int]] = field(default_factory=list)
    extra: dict[str, Any] = field(default_factory=dict)


def scan_files(
    top: str | os.PathLike[str], suffixes: Iterable[str], *, root: str | os.PathLike[str], recursive: bool = True
) -> list[tuple[str, int, int]]:
    """``(path relative to root, mtime_ns, size)`` of files under ``top`` whose name ends with
    one of ``suffixes`` (case-insensitive), sorted by path. Hidden folders and detloader's
    cache folder are skipped."""
    suffixes = tuple(s.lower() for s in suffixes)
    root = os.fspath(root)
    out: list[tuple[str, int, int]] = []
    stack = [os.fspath(top)]
    while stack:
        folder = stack.pop()
        try:
            entries = list(os.scandir(folder))
        except OSError:
            continue
        prefix = os.path.relpath(folder, root)  # once per folder: relpath per file is slow
        prefix = "" if prefix == "." else prefix + os.sep
        for entry in entries:
            name = entry.name
            if entry.is_dir(follow_symlinks=True):
                if recursive and not name.startswith(".") and name != CACHE_SUBDIR:
                    stack.append(entry.path)
            elif name.lower().endswith(suffixes):
                st = entry.stat()
                out.append((prefix + name, st.st_mtime_ns, st.st_size))
    out.sort()
    return out


def stat_entry(path: str | os.PathLike[str], root: str | os.PathLike[str]) -> tuple[str, int, int]:
    """``(path relative to root, mtime_ns, size)`` of one file (``OSError`` when absent)."""
    st = os.stat(path)
    return (os.path.relpath(path, root), st.st_mtime_ns, st.st_size)


def find_child_dir(parent: Path, names: Iterable[str]) -> Path | None:
    """The first child folder of ``parent`` whose name matches one of ``names``, ignoring case."""
    try:
        children = {p.name.lower(): p for p in parent.iterdir() if p.is_dir()}
    except OSError:
        return None
    for name in names:
        hit = children.get(name.lower())
        if hit is not None:
            return hit
    return None


_TRUE = {"1", "true", "yes", "y", "t"}
_FALSE = {"0", "false", "no", "n", "f", ""}


def parse_flag(text: str | None) -> bool | None:
    """``"1"/"true"/"yes"`` -> True, ``"0"/"false"/"no"/""``/absent -> False, else None."""
    if text is None:
        return False
    value = text.strip().lower()
    if value in _TRUE:
        return True
    if value in _FALSE:
        return False
    try:
        return float(value) != 0.0
    except ValueError:
        return None


def flag_value(b: ChunkBuilder, text: str | None, where: str, name: str) -> bool:
    """:func:`parse_flag` of the field ``name`` at ``where``; text that is no flag is a
    ``bad_value`` problem (``name='x' is not 0/1``) and reads as False."""
    flag = parse_flag(text)
    if flag is None:
        b.problem("bad_value", f"{where}/{name}", f"{name}={text!r} is not 0/1", "treated as 0")
        return False
    return flag


def is_number(token: str) -> bool:
    """Whether ``float(token)`` succeeds."""
    try:
        float(token)
    except ValueError:
        return False
    return True


def parse_floats(tokens: Sequence[str], where: str, b: ChunkBuilder, action: str) -> list[float] | None:
    """``tokens`` as floats; None and a ``bad_value`` problem naming the first token that is
    not a number (``'abc' is not a number``, then ``action``)."""
    try:
        return [float(t) for t in tokens]
    except ValueError:
        bad = next(t for t in tokens if not is_number(t))
        b.problem("bad_value", where, f"{bad!r} is not a number", action)
        return None


def image_header_size(path: str) -> tuple[int, int]:
    """(width, height) as stored in the image file, read from its header only."""
    from PIL import Image

    with Image.open(path) as im:
        return int(im.width), int(im.height)


class FileTooLargeError(ValueError):
    """A file over the size cap; the message names its size and the cap."""


def read_capped(path: str, cap: int) -> bytes:
    """The file's bytes; :class:`FileTooLargeError` naming the size when it exceeds ``cap``."""
    with open(path, "rb") as fh:
        data = fh.read(cap + 1)
    if len(data) > cap:
        size = os.path.getsize(path)
        raise FileTooLargeError(f"size={size} bytes exceeds max_file_bytes={cap}")
    return data


def read_head(path: Path, n: int = 4096) -> bytes:
    """The first ``n`` bytes of a file (empty when it cannot be read)."""
    try:
        with open(path, "rb") as fh:
            return fh.read(n)
    except OSError:
        return b""


def dir_mtime(path: Path) -> int:
    """Modification time of a folder in ns (0 when absent): images added or removed."""
    try:
        return os.stat(path).st_mtime_ns
    except OSError:
        return 0


def file_source(
    name: str,
    annotation_file: Path,
    root: Path,
    image_dirs: Sequence[str],
    *,
    extra_files: Sequence[Path] = (),
    extra: dict[str, Any] | None = None,
) -> Source:
    """The Source of a single-file format: the file (and ``extra_files``, such as a class
    list) in the stamp, the candidate image folders and their mtimes in ``extra``."""
    files = [stat_entry(annotation_file, root)]
    stamp = list(files) + [stat_entry(p, root) for p in extra_files]
    return Source(
        format=name,
        root=root,
        files=[files[0][0]],
        stamp=stamp,
        extra={
            "image_dirs": list(image_dirs),
            "image_dir_mtimes": [dir_mtime(root / d) for d in image_dirs],
            **(extra or {}),
        },
    )


def check_options(options: ReadOptions, reader: str, allowed: Sequence[str]) -> None:
    """Refuse format options the reader does not know (a typo would otherwise be ignored)."""
    unknown = sorted(k for k, _ in options.extra if k not in allowed)
    if unknown:
        valid = ", ".join(allowed) or "none"
        raise ValueError(f"format option(s) {', '.join(unknown)} not known to the {reader} reader; valid: {valid}")


def candidate_dirs(root: Path, names: Sequence[str], image_dir: str | None) -> list[str]:
    """Image folders relative to ``root``: ``image_dir`` when given, else those of ``names``
    that exist (``""`` is the root itself), in order; never empty."""
    if image_dir:
        return [os.path.relpath(image_dir, root)]
    found: list[str] = []
    for name in names:
        if name in found:
            continue
        if name == "" or (root / name).is_dir():
            found.append(name)
    return found or [""]


def _normalise(name: str) -> str:
    name = name.strip()
    if "\\" in name and "/" not in name:
        name = name.replace("\\", "/") if not ntpath.isabs(name) else ntpath.basename(name)
    while name.startswith("./"):
        name = name[2:]
    return name


class ImageLocator:
    """Finds the image file an annotation names.

    ``folders`` are tried in order (relative to ``root``), the folder of the last hit first, so
    that a dataset whose images all live in one place costs one ``stat`` per image. Each
    folder is tried with the name as written, then its base name, then the same stem with the
    usual image extensions. Absolute names are used as they are. With ``check=False`` nothing
    is looked up: the name is joined to the first folder.
    """

    def __init__(self, root: str | os.PathLike[str], folders: Sequence[str], check: bool) -> None:
        self.root = os.fspath(root)
        self.folders = list(folders) or [""]
        self.check = check
        self._last = 0

    def describe(self) -> str:
        return ", ".join(f or "." for f in self.folders)

    def _exists(self, rel: str) -> bool:
        return os.path.isfile(os.path.join(self.root, rel))

    def find(self, name: str, alternatives: Sequence[str] = ()) -> str | None:
        """Path of the image relative to the root, or None when no candidate exists."""
        names = [_normalise(n) for n in (name, *alternatives) if n and n.strip()]
        if not names:
            return None
        if os.path.isabs(names[0]):
            if not self.check or os.path.isfile(names[0]):
                return os.path.relpath(names[0], self.root)
            names = [os.path.basename(names[0])] + names[1:]
        if not self.check:
            return os.path.normpath(os.path.join(self.folders[0], names[0]))
        order = [self._last] + [i for i in range(len(self.folders)) if i != self._last]
        for i in order:
            folder = self.folders[i]
            for n in names:
                rel = os.path.normpath(os.path.join(folder, n))
                if self._exists(rel):
                    self._last = i
                    return rel
        for i in order:
            folder = self.folders[i]
            for n in names:
                base = os.path.basename(n)
                if base != n:
                    rel = os.path.normpath(os.path.join(folder, base))
                    if self._exists(rel):
                        self._last = i
                        return rel
                stem, _ = os.path.splitext(n)
                for ext in IMAGE_EXTENSIONS:
                    rel = os.path.normpath(os.path.join(folder, stem + ext))
                    if self._exists(rel):
                        self._last = i
                        return rel
        return None


def header_size(b: ChunkBuilder, root: str, rel: str, element: str, raw: str) -> tuple[int, int] | None:
    """Size from the image header when the annotation lacks it (a ``missing_size`` repair);
    None (and a ``missing_size`` error) when the image cannot be read."""
    try:
        width, height = image_header_size(os.path.join(root, rel))
    except (OSError, ValueError) as err:
        b.problem("missing_size", element, f"{raw}; image unreadable: {err}", "image skipped")
        return None
    b.problem("missing_size", element, raw, f"read {width}x{height} from the image header", "repaired")
    return width, height


def declared_size(
    b: ChunkBuilder, root: str, rel: str, element: str, width: str | None, height: str | None, raw: str | None = None
) -> tuple[int, int] | None:
    """``(width, height)`` as the annotation declares them (text such as ``"640"``), else (absent,
    zero or not an integer) from the image header: :func:`header_size`, whose problem shows
    ``raw`` (default ``width='..' height='..'``)."""
    w, h = int_or_none(width), int_or_none(height)
    if w and h and w > 0 and h > 0:
        return w, h
    return header_size(b, root, rel, element, raw if raw is not None else f"width={width!r} height={height!r}")


def image_size(b: ChunkBuilder, root: str, rel: str, element: str) -> tuple[int, int] | None:
    """Size of an image whose format stores none in its annotations (YOLO, txt lists); None
    and a problem when the image is missing or unreadable."""
    full = os.path.join(root, rel)
    try:
        return image_header_size(full)
    except FileNotFoundError:
        b.problem("missing_image", element, f"image {rel!r} not found", "image skipped")
    except (OSError, ValueError) as err:
        b.problem("missing_size", element, f"image {rel!r} unreadable: {err}", "image skipped")
    return None


def int_or_none(text: str | None) -> int | None:
    """Integer value of a size field ("640", "640.0"); None when absent, empty or not a number."""
    if text is None or not str(text).strip():
        return None
    try:
        value = float(text)
    except ValueError:
        return None
    return int(value) if value.is_integer() else None
