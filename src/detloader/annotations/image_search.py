"""Finding the image folder when the place the layout gives holds (almost) none of the images.

:func:`find_image_folder` compares file names below the dataset root (no image is opened) and
returns the folder holding the most of the names not found; :func:`detloader.read_annotations`
rereads with it as ``image_dir``. When it runs and what it reports: docs/formats.md ("Where the
images are").
"""

from __future__ import annotations

import os
from collections import deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from detloader.annotations.cache import CACHE_SUBDIR
from detloader.annotations.problems import Problem
from detloader.annotations.readers.common import outside_link, within
from detloader.annotations.readers.locate import IMAGE_SUFFIXES

#: Levels of folders below the dataset root that are looked at (the root is level 0).
SEARCH_DEPTH = 4
#: Folders looked at, at most (breadth first: the shallow ones first).
SEARCH_MAX_FOLDERS = 2000
#: The search runs when fewer than this share of the named images were found.
FEW_FOUND = 0.1


@dataclass(frozen=True)
class FolderHit:
    """The folder found: ``folder`` relative to the root, holding ``hits`` of ``names``."""

    folder: str
    hits: int
    names: int


def should_search(found: int, missing: int) -> bool:
    """Whether ``found`` images of ``found + missing`` named are few enough to look elsewhere."""
    return missing > 0 and found < FEW_FOUND * (found + missing)


def _wanted(names: Iterable[str]) -> dict[str, str]:
    """Base name -> stem of each name (``img/0012.jpg`` -> ``0012.jpg`` -> ``0012``)."""
    out: dict[str, str] = {}
    for name in names:
        base = os.path.basename(name.replace("\\", "/").strip())
        if base:
            out[base] = os.path.splitext(base)[0]
    return out


def _score(files: set[str], wanted: Mapping[str, str]) -> int:
    """How many wanted names the folder holds: by base name, else by stem with an image
    extension (the readers try those too)."""
    stems = {os.path.splitext(f)[0] for f in files if os.path.splitext(f)[1].lower() in IMAGE_SUFFIXES}
    return sum(1 for base, stem in wanted.items() if base in files or stem in stems)


def find_image_folder(
    root: str | os.PathLike[str],
    names: Iterable[str],
    *,
    skip: Iterable[str] = (),
    max_depth: int = SEARCH_DEPTH,
    max_folders: int = SEARCH_MAX_FOLDERS,
    follow: Iterable[str] = (),
    follow_outside: bool = False,
    links: list[Problem] | None = None,
) -> FolderHit | None:
    """The folder below ``root`` (or ``root`` itself, ``""``) holding the most of ``names``;
    None when none holds any. Folders in ``skip`` (relative to ``root``: where the reader
    already looked) are walked but not chosen; hidden folders and the index cache are not
    walked. A folder link that leads out of ``root`` is walked only when it is in ``skip`` or
    ``follow`` (the layout's own folders) or ``follow_outside``; otherwise it goes, as a
    repaired ``link_outside_dataset`` problem, into ``links``. Ties go to the shallower
    folder, then to the first in name order."""
    wanted = _wanted(names)
    if not wanted:
        return None
    top = Path(root).resolve()
    skipped = {os.path.normpath(s) for s in skip}
    layout = skipped | {os.path.normpath(f) for f in follow}
    bases = () if follow_outside else (str(top),)
    seen: set[str] = set()
    queue: deque[tuple[Path, int]] = deque([(top, 0)])
    best: FolderHit | None = None
    visited = 0
    while queue and visited < max_folders:
        folder, depth = queue.popleft()
        real = os.path.realpath(folder)
        if real in seen:  # a link back up the tree
            continue
        seen.add(real)
        visited += 1
        files: set[str] = set()
        children: list[Path] = []
        try:
            with os.scandir(folder) as entries:
                for entry in entries:
                    try:
                        if entry.is_dir():
                            if not entry.name.startswith(".") and entry.name != CACHE_SUBDIR:
                                if bases and entry.is_symlink() and not _may_follow(entry.path, top, bases, layout):
                                    _name_link(entry.path, top, links)
                                    continue
                                children.append(Path(entry.path))
                        else:
                            files.add(entry.name)
                    except OSError:
                        continue
        except OSError:
            continue
        if depth < max_depth:
            queue.extend((child, depth + 1) for child in sorted(children))
        rel = os.path.relpath(folder, top)
        rel = "" if rel == "." else rel
        if os.path.normpath(rel) in skipped or not files:
            continue
        hits = _score(files, wanted)
        if hits and (best is None or hits > best.hits):
            best = FolderHit(rel, hits, len(wanted))
    return best


_NOT_SEARCHED = "not searched for images"


def _may_follow(link: str, top: Path, bases: tuple[str, ...], layout: set[str]) -> bool:
    """Whether the folder link ``link`` stays inside ``bases`` or is one of the ``layout``
    folders (relative to ``top``), which the reader reads wherever they lead."""
    return within(os.path.realpath(link), bases) or os.path.relpath(link, top) in layout


def _name_link(link: str, top: Path, links: list[Problem] | None) -> None:
    """Add the repaired ``link_outside_dataset`` problem of ``link`` to ``links`` (when given)."""
    if links is not None:
        target = os.path.realpath(link)
        links.append(outside_link(os.path.relpath(link, top), link, target, _NOT_SEARCHED, "repaired"))


def search_message(found: Mapping[str, Any]) -> str:
    """One line for ``index.meta["image_search"]``: where the images were not, and where
    they were found."""
    looked = ", ".join(d or "." for d in found["looked_in"]) or "."
    return (
        f"{found['missing']} of {found['missing'] + found['found']} images not found in {looked}; "
        f"{found['hits']} of {found['names']} names looked for are in {found['folder'] or '.'}/"
    )
