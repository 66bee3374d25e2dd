"""Where the image an annotation names lies (:class:`ImageLocator`), and its size in pixels from
the annotation or, when it has none, the image header (:func:`declared_size`,
:func:`size_from_header`).
"""

from __future__ import annotations

import ntpath
import os
from collections.abc import Sequence
from typing import Any

from detloader._system.files import file_kind, open_regular
from detloader.annotations.builder import ChunkBuilder
from detloader.annotations.readers.common import int_or_none
from detloader.errors import DetloaderValueError
from detloader.images import header_size as _header_bytes_size

#: Image file extensions tried when an annotation names an image without one (or wrongly).
IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".bmp", ".tif", ".tiff", ".webp", ".JPG", ".JPEG", ".PNG")
#: The same, lower case: image file name endings (``name.lower().endswith(IMAGE_SUFFIXES)``).
IMAGE_SUFFIXES = tuple(sorted({e.lower() for e in IMAGE_EXTENSIONS}))


#: Lookups an :class:`ImageLocator` with ``listed=True`` makes by ``stat`` before it lists its folders.
LIST_AFTER = 256

#: Bytes read for an image header; a file whose header lies further (a large EXIF block) is read whole.
_HEAD_BYTES = 64 * 1024


def image_header_size(path: str) -> tuple[int, int]:
    """(width, height) as stored in the image file (:func:`detloader.images.header_size` of its
    first bytes); ValueError when it holds no readable header."""
    with open_regular(path) as fh:  # never a FIFO: it would block
        data = fh.read(_HEAD_BYTES)
        size = _header_bytes_size(data)
        if size is None and len(data) == _HEAD_BYTES:
            size = _header_bytes_size(data + fh.read())
    if size is None:
        raise DetloaderValueError("not an image (no readable header)")
    return size


def _normalise(name: str) -> str:
    name = name.strip()
    if "\\" in name and "/" not in name:
        name = name.replace("\\", "/") if not ntpath.isabs(name) else ntpath.basename(name)
    while name.startswith("./"):
        name = name[2:]
    return name


def _forms(name: str) -> tuple[str, ...]:
    """``name`` as written, then tidied (:func:`_normalise`), when tidying changes more than a
    leading ``./`` (a relative name only: an absolute one is judged tidied)."""
    tidy = _normalise(name)
    return (name, tidy) if (name != name.strip() or "\\" in name) and not os.path.isabs(tidy) else (tidy,)


def inside(rel: str) -> bool:
    """Whether ``rel`` (relative to the dataset root) stays inside it, by its text alone:
    not absolute, and no ``..`` climbs above the root once normalised."""
    if os.path.isabs(rel) or ntpath.isabs(rel):
        return False
    norm = os.path.normpath(rel)
    return norm != ".." and not norm.startswith(".." + os.sep)


def stays_inside(folder: str, name: str) -> bool:
    """Whether ``name`` joined to ``folder`` stays in the dataset (or, for an image folder the
    user put outside it, in that folder)."""
    return inside(os.path.join(folder, name)) if inside(folder) else inside(name)


class ImageLocator:
    """Finds the image file an annotation names.

    ``folders`` are tried in order, the folder of the last hit first (one ``stat`` per image when
    they all live in one place), each with the name as written, tidied, its base name, then the
    same stem with the usual extensions. A name that leaves the dataset is not followed; then
    :attr:`escaped` holds it, :attr:`followed` the path as written when it exists. :attr:`special`
    is a FIFO, socket or device met on the way (never opened). With ``check=False`` the name is
    joined to the first folder.

    With ``listed=True`` (a file that names many images: COCO), after :data:`LIST_AFTER`
    lookups each folder is listed once and a plain name (``0001.jpg``, ``train/0001.jpg``: no
    ``.``, ``..`` or empty part, nothing to tidy) is looked up in the listing of its folder: a
    set lookup instead of a path join, a normalisation and a ``stat``. A folder that
    cannot be listed, or whose file system ignores case (``stat`` would find ``A.JPG`` for
    ``a.jpg``), is looked in by ``stat``; so is every candidate again when the listings hold
    none, so the result is the same as without them.
    """

    def __init__(
        self, root: str | os.PathLike[str], folders: Sequence[str], check: bool, *, listed: bool = False
    ) -> None:
        self.root = os.fspath(root)
        self.folders = list(folders) or [""]
        self.check = check
        self.listed = listed
        self._listings: dict[tuple[int, str], _Listing | None] = {}
        self._finds = 0
        self._last = 0
        self.escaped: str | None = None
        self.followed: str | None = None
        self.special: tuple[str, str] | None = None

    def describe(self) -> str:
        return ", ".join(f or "." for f in self.folders)

    def _exists(self, rel: str) -> bool:
        try:
            kind = file_kind(os.stat(os.path.join(self.root, rel)).st_mode)
        except (OSError, ValueError):
            return False
        if kind is not None and kind != "a folder":
            self.special = (rel, kind)
        return kind is None

    def _listing(self, i: int, sub: str) -> _Listing | None:
        """The listing of ``sub`` in folder ``i`` (made on first use); None when it is not to be used."""
        key = (i, sub)
        if key not in self._listings:
            self._listings[key] = _list_folder(os.path.join(self.root, self.folders[i], sub))
        return self._listings[key]

    def _in(self, i: int, name: str, listings: bool) -> str | None:
        """The path of ``name`` in folder ``i``, relative to the root, when a regular file is
        there (from the folder's listing when ``listings`` and ``name`` is plain), else None."""
        sub, _, base = name.rpartition("/")
        listing = self._listing(i, sub) if listings and _plain(name) else None
        if listing is None:
            rel = os.path.normpath(os.path.join(self.folders[i], name))
            return rel if self._exists(rel) else None
        files, special = listing
        if base in files:
            return os.path.normpath(os.path.join(self.folders[i], name))
        if base in special:
            self.special = (os.path.normpath(os.path.join(self.folders[i], name)), special[base])
        return None

    def _first(self, names: Sequence[str]) -> str | None:
        """The first of ``names``, joined to a folder, that exists (no check: the first)."""
        for folder in self.folders:
            for n in names:
                rel = os.path.normpath(os.path.join(folder, n))
                if not self.check or self._exists(rel):
                    return rel
        return None

    def find(self, name: str, alternatives: Sequence[str] = ()) -> str | None:
        """Path of the image relative to the root, or None when no candidate exists."""
        self.escaped = self.followed = self.special = None
        self._finds += 1
        if self.check and not alternatives and _plain(name):  # stays in every folder: no path checks
            return self._search([name])
        given = [n for n in (name, *alternatives) if n and n.strip()]
        names = list(dict.fromkeys(form for n in given for form in _forms(n)))
        if not names:
            return None
        if os.path.isabs(names[0]):
            rel = os.path.relpath(names[0], self.root)
            if not self.check or os.path.isfile(names[0]):
                if inside(rel):
                    return rel
                self.followed = rel
            names = [os.path.basename(names[0])] + names[1:]
            if not inside(rel):
                self.escaped = name
        kept = [n for n in names if all(stays_inside(f, n) for f in self.folders)]
        if len(kept) < len(names):
            self.escaped = self.escaped or name
            if self.followed is None:
                self.followed = self._first([n for n in names if n not in kept])
            names = kept + [
                os.path.basename(n) for n in names if n not in kept and os.path.basename(n) not in ("", "..")
            ]
        if not names:
            return None
        if not self.check:
            return os.path.normpath(os.path.join(self.folders[0], names[0]))
        return self._search(names)

    def _search(self, names: Sequence[str]) -> str | None:
        """Every folder (the last hit's first) with ``names`` as written, then every folder with
        base names and other extensions; through the listings first when :attr:`listed`."""
        order = [self._last] + [i for i in range(len(self.folders)) if i != self._last]
        listed = self.listed and self._finds > LIST_AFTER  # a few images: a stat each costs less
        for listings in (True, False) if listed else (False,):
            for fallback in (False, True):
                for i in order:
                    for n in names:
                        for c in _fallbacks(n) if fallback else (n,):
                            rel = self._in(i, c, listings)
                            if rel is not None:
                                self._last = i
                                return rel
        return None


_UNPLAIN_PARTS = frozenset(("", ".", ".."))
#: A folder's regular files (links followed) and its FIFOs, sockets and devices (name -> kind).
_Listing = tuple[frozenset[str], dict[str, str]]


def _plain(name: str) -> bool:
    """Whether ``name`` is a plain relative name: parts split by ``/``, none empty, ``.`` or
    ``..``, no ``\\`` or ``:`` (a drive), nothing to strip; joined to a folder it stays below
    that folder (told from the text, without a path call)."""
    if "\\" in name or ":" in name or name != name.strip():
        return False
    return not _UNPLAIN_PARTS.intersection(name.split("/"))


def _list_folder(folder: str) -> _Listing | None:
    """The :data:`_Listing` of ``folder``; None when it cannot be listed or its file system
    ignores case (a listed name in the other case is found by ``stat``)."""
    files: set[str] = set()
    special: dict[str, str] = {}
    try:
        with os.scandir(folder) as entries:
            for entry in entries:
                try:
                    if entry.is_file():
                        files.add(entry.name)
                    elif not entry.is_dir():
                        kind = file_kind(entry.stat().st_mode)
                        if kind is not None:
                            special[entry.name] = kind
                except OSError:  # a dangling link: nothing there, as for stat
                    continue
    except OSError:
        return None
    probe = next((f for f in files if f.swapcase() != f), None)
    if probe is not None and probe.swapcase() not in files and os.path.exists(os.path.join(folder, probe.swapcase())):
        return None
    return frozenset(files), special


def _fallbacks(name: str) -> list[str]:
    """The base name (when ``name`` has folders), then the same stem with each image extension."""
    base = os.path.basename(name)
    stem = os.path.splitext(name)[0]
    return ([base] if base != name else []) + [stem + ext for ext in IMAGE_EXTENSIONS]


def find_image(
    locator: ImageLocator, b: ChunkBuilder, name: str, where: str, shown: str, alternatives: Sequence[str] = ()
) -> str | None:
    """:meth:`ImageLocator.find` with its problems: ``outside_dataset`` when the name leaves
    the dataset (repaired when its base name is found inside), ``missing_image`` when nothing
    is found; ``shown`` is how the messages name the value (``file_name='a.jpg'``). With
    ``allow_outside_images`` such a name is followed as written when it exists."""
    rel = locator.find(name, alternatives)
    if locator.escaped is not None and b.options.allow_outside_images and locator.followed is not None:
        return locator.followed
    if locator.escaped is not None:
        message = f"{shown} leaves the dataset; not followed"
        if rel is None:
            b.problem("outside_dataset", where, message, "image skipped")
            return None
        b.problem("outside_dataset", where, message, f"found {rel!r} inside it", "repaired")
        return rel
    if rel is None and locator.special is not None:
        rel_special, kind = locator.special
        b.problem("not_a_regular_file", where, f"{shown}: {rel_special} is {kind}, not a regular file", "image skipped")
    elif rel is None:
        b.missing_image(where, f"{shown} not found in {locator.describe()}", name)
    return rel


def size_from_header(
    b: ChunkBuilder, root: str, rel: str, element: str, raw: str | None = None
) -> tuple[int, int] | None:
    """Size from the image header: where the annotation lacks it (``raw``, what it holds: a
    ``missing_size`` repair), or where the format stores none (``raw=None``). None, with a
    ``missing_image`` / ``missing_size`` error, when the image is missing or unreadable."""
    try:
        width, height = image_header_size(os.path.join(root, rel))
    except (OSError, ValueError) as err:
        if raw is None and isinstance(err, FileNotFoundError):
            b.missing_image(element, f"image {rel!r} not found", rel)
        else:
            shown = f"image {rel!r} unreadable: {err}" if raw is None else f"{raw}; image unreadable: {err}"
            b.problem("missing_size", element, shown, "image skipped")
        return None
    if raw is not None:
        b.problem("missing_size", element, raw, f"read {width}x{height} from the image header", "repaired")
    return width, height


def declared_size(
    b: ChunkBuilder, root: str, rel: str, element: str, width: str | None, height: str | None, raw: str | None = None
) -> tuple[int, int] | None:
    """``(width, height)`` as the annotation declares them (text such as ``"640"``), else (absent,
    zero or not an integer) from the image header: :func:`size_from_header`, whose problem
    shows ``raw`` (default ``width='..' height='..'``)."""
    w, h = int_or_none(width), int_or_none(height)
    if w and h and w > 0 and h > 0:
        return w, h
    return size_from_header(b, root, rel, element, raw if raw is not None else f"width={width!r} height={height!r}")


def locate_image(
    locator: ImageLocator, b: ChunkBuilder, name: str, where: str, shown: str, width: str | None,
    height: str | None, *, name_where: str | None = None, alternatives: Sequence[str] = (), raw: str | None = None,
) -> tuple[str, int, int] | None:
    """:func:`find_image` (its problems at ``name_where``, default ``where``), then
    :func:`declared_size`: ``(path relative to the root, width, height)``, or None with the
    problem reported."""
    rel = find_image(locator, b, name, name_where or where, shown, alternatives)
    if rel is None:
        return None
    size = declared_size(b, locator.root, rel, where, width, height, raw)
    return None if size is None else (rel, *size)


def add_listed_image(
    locator: ImageLocator, name: str, where: str, b: ChunkBuilder, size: tuple[int, int] | None = None, **kwargs: Any
) -> bool:
    """Find image ``name`` and add it to ``b`` (size from the image header unless ``size`` is
    given); False, with a ``missing_image`` / ``missing_size`` problem, when that fails."""
    rel = find_image(locator, b, name, where, repr(name))
    if rel is None:
        return False
    if size is None:
        size = size_from_header(b, locator.root, rel, where)
        if size is None:
            return False
    return b.add_image(rel, size[0], size[1], record=name, **kwargs)
