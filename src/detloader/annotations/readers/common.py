"""Helpers shared by the readers (XML ones live in
:mod:`~detloader.annotations.readers.safe_xml`, finding images and their sizes in
:mod:`~detloader.annotations.readers.locate`).

* :class:`Source` (what a reader found) and :func:`scan_files` / :func:`stat_entry` (the files
  whose change rebuilds the index); :func:`file_source` for a one-file format;
* :func:`read_head` lets ``sniff`` look at a file without reading it whole; :func:`read_capped`
  reads one under a size cap (:class:`FileTooLargeError`);
* :func:`parse_each` is the ``parse`` of a reader that reads its files one by one;
* value parsers: :func:`parse_flag` / :func:`flag_value` (0/1 flags), :func:`int_or_none`
  (sizes), :func:`is_number` / :func:`parse_floats` (coordinate lists, a ``bad_value``
  problem naming the first token that is not a number).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Sequence

from detloader.annotations.cache import CACHE_SUBDIR
from detloader.annotations.builder import ChunkBuilder
from detloader.annotations.options import ReadOptions
from detloader.annotations.checks import MAX_SIDE

__all__ = [
    "FileTooLargeError", "Source", "candidate_dirs", "check_options", "dir_mtime", "file_source",
    "find_child_dir", "flag_value", "int_or_none", "is_number", "parse_each", "parse_flag",
    "parse_floats", "read_capped", "read_head", "scan_files", "stat_entry",
]



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
    except (ValueError, OverflowError):
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
    except (ValueError, OverflowError):
        return False
    return True


def parse_floats(tokens: Sequence[str], where: str, b: ChunkBuilder, action: str) -> list[float] | None:
    """``tokens`` as floats; None and a ``bad_value`` problem naming the first token that is
    not a number (``'abc' is not a number``, then ``action``)."""
    try:
        return [float(t) for t in tokens]
    except (ValueError, OverflowError):
        bad = next(t for t in tokens if not is_number(t))
        b.problem("bad_value", where, f"{bad!r} is not a number", action)
        return None


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
    annotation_file: Path | Sequence[Path],
    root: Path,
    image_dirs: Sequence[str],
    *,
    extra_files: Sequence[Path] = (),
    extra: dict[str, Any] | None = None,
) -> Source:
    """The Source of a single-file format (or of several such files, one split each): the
    file(s) (and ``extra_files``, such as a class list) in the stamp, the candidate image
    folders and their mtimes in ``extra``."""
    files = [stat_entry(p, root) for p in ([annotation_file] if isinstance(annotation_file, Path) else annotation_file)]
    stamp = list(files) + [stat_entry(p, root) for p in extra_files]
    return Source(
        format=name,
        root=root,
        files=[f[0] for f in files],
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


def parse_each(
    source: Source, files: Sequence[str], builder: ChunkBuilder, parse_file: Callable[[str, str, Source, ChunkBuilder], None]
) -> None:
    """The ``parse`` of a reader that reads its files one by one: begin each of ``files``
    in ``builder``, then ``parse_file(root, rel, source, builder)``."""
    root = str(source.root)
    for rel in files:
        builder.begin_file(rel)
        parse_file(root, rel, source, builder)


def int_or_none(text: str | None) -> int | None:
    """Integer value of a size field ("640", "640.0"); None when absent, empty, not a number,
    not finite, fractional or beyond ``MAX_SIDE`` (``inf``, ``1e309``, ``2**31``)."""
    if text is None or not str(text).strip():
        return None
    try:
        value = float(text)
    except (ValueError, OverflowError):
        return None
    if not value.is_integer() or abs(value) > MAX_SIDE:  # is_integer() is False for inf and nan
        return None
    return int(value)
