"""Helpers shared by the readers.

* :class:`Source` (what a reader found) and :func:`scan_files` / :func:`stat_entry` (the files
  whose change rebuilds the index); :func:`file_source` for a one-file format;
* :func:`root_tag`, :func:`read_head`, :func:`sniff_xml` let ``sniff`` look at a file without
  parsing it; :func:`iter_xml` streams the records of a large XML file with bounded memory;
* :class:`ImageLocator` finds the image an annotation names among candidate folders;
  :func:`header_size` / :func:`image_size` read an image size from its header, as a problem;
* small parsers: :func:`parse_flag`, :func:`int_or_none`, :func:`syntax_message`.
"""

from __future__ import annotations

import ntpath
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Iterator, Sequence

from lxml import etree

from detloader.annotations.cache import CACHE_SUBDIR
from detloader.annotations.builder import ChunkBuilder, ReadOptions
from detloader.annotations.readers.safe_xml import iterparse_safe

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


_TAG = re.compile(rb"<([A-Za-z_][\w.-]*)[\s>/]")
_SKIP = re.compile(rb"<\?.*?\?>|<!--.*?-->|<!DOCTYPE[^>]*>", re.S)


def read_head(path: Path, n: int = 4096) -> bytes:
    """The first ``n`` bytes of a file (empty when it cannot be read)."""
    try:
        with open(path, "rb") as fh:
            return fh.read(n)
    except OSError:
        return b""


def root_tag(path: Path) -> str | None:
    """Name of the root element of an XML file, from its first bytes (no parse)."""
    head = _SKIP.sub(b"", read_head(path, 8192))
    match = _TAG.search(head)
    return match.group(1).decode("ascii", "replace") if match else None


def xml_files_with_root(folder: Path, tag: str, *, recursive: bool = False) -> list[Path]:
    """``.xml`` files in ``folder`` (sorted) whose root element is ``tag``."""
    if recursive:
        candidates = sorted(p for p in folder.rglob("*.xml") if p.is_file())
    else:
        candidates = sorted(p for p in folder.glob("*.xml") if p.is_file())
    return [p for p in candidates if root_tag(p) == tag]


def sniff_xml(path: Path, tag: str) -> bool:
    """An ``.xml`` file whose root element is ``tag``, or a folder holding one at its top."""
    if path.is_file():
        return path.suffix.lower() == ".xml" and root_tag(path) == tag
    return path.is_dir() and bool(xml_files_with_root(path, tag))


def annotation_xml(path: Path, tag: str, kind: str, preferred: str | None = None) -> Path:
    """The annotation file of a one-file format: ``path`` itself, or the one ``.xml`` file at
    the top of folder ``path`` whose root element is ``tag`` (``preferred`` names the file
    that wins when there are several); a ValueError naming what was found otherwise."""
    if path.is_file():
        return path
    found = xml_files_with_root(path, tag)
    if len(found) != 1 and preferred is not None:
        found = [p for p in found if p.name == preferred] or found
    if len(found) != 1:
        names = ", ".join(p.name for p in found) or "none"
        raise ValueError(f"path={str(path)!r} holds {len(found)} {kind} files ({names}); pass one of them")
    return found[0]


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


def iter_xml(path: str, tags: str | tuple[str, ...]) -> Iterator[etree._Element]:
    """Yield each complete element named ``tags`` of a (large) XML file, in document order.

    After the caller is done with an element it is cleared and every earlier sibling is
    removed from the partial tree, so memory stays bounded by one record, not the file: a
    few hundred MB stream in constant space. Errors propagate (``etree.XMLSyntaxError`` with
    its line, :class:`~detloader.annotations.readers.safe_xml.UnsafeXMLError`).
    """
    for _event, element in iterparse_safe(path, tags, events=("end",)):
        yield element
        element.clear(keep_tail=False)
        parent = element.getparent()
        if parent is not None:
            while element.getprevious() is not None:
                del parent[0]


def syntax_message(err: etree.XMLSyntaxError) -> str:
    msg = str(err.msg if getattr(err, "msg", None) else err)
    return msg.split(", line ")[0]
