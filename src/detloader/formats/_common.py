"""Helpers shared by the readers: file discovery, the Source record, small parsers."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable

from detloader.cache import CACHE_SUBDIR

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


def image_header_size(path: str) -> tuple[int, int]:
    """(width, height) as stored in the image file, read from its header only."""
    from PIL import Image

    with Image.open(path) as im:
        return int(im.width), int(im.height)


def read_capped(path: str, cap: int) -> bytes:
    """The file's bytes; ValueError naming the size when it exceeds ``cap``."""
    with open(path, "rb") as fh:
        data = fh.read(cap + 1)
    if len(data) > cap:
        size = os.path.getsize(path)
        raise ValueError(f"size={size} bytes exceeds max_file_bytes={cap}")
    return data
