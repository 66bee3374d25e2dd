"""Pieces shared by the single-file readers (CVAT, imglab, COCO, txt) and YOLO.

* :class:`ImageLocator` finds the image an annotation names among candidate folders;
* :func:`header_size` reads a missing image size from the image header, as a problem;
* :func:`iter_xml` streams top-level records of a large XML file with bounded memory;
* :func:`file_source` builds the :class:`Source` of one annotation file, with its stat in the
  cache key;
* :func:`root_tag`, :func:`read_head` let ``sniff`` look at a file without parsing it.
"""

from __future__ import annotations

import ntpath
import os
import re
from pathlib import Path
from typing import Any, Iterator, Sequence

from lxml import etree

from detloader.formats._build import ChunkBuilder, ReadOptions
from detloader.formats._common import IMAGE_EXTENSIONS, Source, image_header_size, stat_entry
from detloader.formats._xml import iterparse_safe

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
    its line, :class:`~detloader.formats._xml.UnsafeXMLError`).
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
