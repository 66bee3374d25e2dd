"""What a reader is (:class:`Reader`, :class:`Source`) and the helpers readers share: the file scan
whose stamps key the cache, capped reads that never open a FIFO or device, value parsers. XML
helpers live in ``safe_xml``, finding images and their sizes in ``locate``.
"""

from __future__ import annotations

import errno
import functools
import itertools
import os
import stat
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field, fields
from operator import attrgetter, itemgetter
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple, Protocol, TypeVar

import numpy as np

from detloader._system.files import file_kind, open_regular
from detloader._system.files import find_child_dir as find_child_dir  # the readers' folder lookup, kept here for them
from detloader.annotations.builder import ChunkBuilder
from detloader.annotations.checks import MAX_SIDE, ReadOptions
from detloader.annotations.landmarks import LandmarkSchema
from detloader.annotations.problems import Problem, Severity
from detloader.errors import DetloaderValueError

if TYPE_CHECKING:
    from detloader.annotations.index import AnnotationIndex

#: ``(path relative to the root, mtime_ns, size, ctime_ns, inode)`` of a file: an edit that
#: keeps the size and puts the mtime back (``touch -r``) still changes the ctime, and a copy
#: (``cp -a``) the inode.
Stamp = tuple[str, int, int, int, int]
S = TypeVar("S", bound="Source")


@dataclass(kw_only=True)
class Source:
    """What a reader found at the user's path, before parsing anything.

    Attributes:
        root: the dataset root; paths in the index are relative to it.
        files: annotation files relative to ``root``, sorted: the units of (parallel) work.
        stamp: the :data:`Stamp` of every file whose change must rebuild the index.
        image_dirs: the folders (relative to ``root``) images are looked for in, in order; None
            when the files are the images (YOLO).
        labelled: False when the files are images of which not one has a label file (YOLO).
        problems: what the reader found before parsing; they join the index's problems.
        image_listing: the image folder's listing where the reader lists it (VOC's unannotated
            images): kept with a refreshable cache and used again while its folders are unchanged.
        file_listing: the listing of the annotation files where a refreshed reader made it and it
            named no problem (``problems`` empty): kept with the cache, it is ``known`` to the next
            read, which then states the same files without listing their folders while those are
            unchanged.

    A subclass adds its format's facts as JSON values; with ``image_dirs`` and ``labelled`` they
    are :meth:`facts`, part of the cache key and of ``index.meta["source"]``.
    """

    root: Path
    files: list[str]
    stamp: list[Stamp] = field(default_factory=list)
    image_dirs: list[str] | None = None
    labelled: bool = True
    problems: list[Problem] = field(default_factory=list)
    image_listing: FolderListing | None = None
    file_listing: FolderListing | None = None

    def facts(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self) if f.name not in _NOT_FACTS}

    def stamp_table(self) -> StampTable:
        """``stamp`` as columns, made once per read: the cache key and the refresh's stamps both
        take it (100,000 rows in a few ms, not a tuple each)."""
        if not self.stamp:
            return StampTable([], np.zeros((0, 4), dtype=np.int64), False)
        names = list(map(itemgetter(0), self.stamp))
        try:  # one pass over every number, taken as uint64 (the inode may need its 64th bit)
            numbers_of = map(itemgetter(slice(1, None)), self.stamp)
            flat = np.fromiter(itertools.chain.from_iterable(numbers_of), np.uint64, 4 * len(names))
            numbers = flat.view(np.int64).reshape(-1, 4)
        except OverflowError:  # an mtime before 1970
            numbers = np.empty((len(names), 4), dtype=np.int64)
            for k in range(3):
                numbers[:, k] = np.fromiter((s[k + 1] for s in self.stamp), np.int64, len(names))
            numbers[:, 3] = np.fromiter((s[4] for s in self.stamp), np.uint64, len(names)).view(np.int64)
        n = len(self.files)
        return StampTable(names, numbers, names[:n] == self.files)


class StampTable(NamedTuple):
    """:attr:`Source.stamp` as columns: ``names``; ``numbers`` int64 ``[n, 4]`` (mtime, size,
    ctime, the inode's bits); ``files_first``: whether the first rows are the annotation files,
    in their order (a reader that stamps its files first, then the other files it read)."""

    names: list[str]
    numbers: np.ndarray
    files_first: bool


_NOT_FACTS = ("root", "files", "stamp", "problems", "image_listing", "file_listing")


@dataclass(frozen=True)
class FolderListing:
    """What :func:`scan_files` found below a folder: the files, relative to the root, the
    problems it named, and ``folders``: the identity (``[mtime_ns, ctime_ns, inode]``, links
    followed) of every folder it listed, relative to the root, taken before listing it. It holds
    while no such folder changed: a file added, removed or renamed in a folder changes its mtime
    and ctime, a folder replaced its inode. A folder changed too shortly before it was listed
    (:data:`RACY_NS`) has the identity ``UNSURE``, which no folder has: it is listed again."""

    files: list[str]
    problems: list[Problem]
    folders: dict[str, list[int]]

    def current(self, root: str | os.PathLike[str]) -> bool:
        """Whether every folder listed is still what it was (one ``stat`` each)."""
        return all(dir_identity(os.path.join(root, rel)) == ident for rel, ident in self.folders.items())


#: What a read may know of the annotation files from its last read: given the dataset root, the
#: listing kept with the cache, None when there is none (``Reader.discover``'s ``known``).
KnownFiles = Callable[[Path], "FolderListing | None"]
#: The identity of a folder that changed too shortly before it was listed to vouch for the listing.
UNSURE = [-1, -1, -1]
#: How long before a listing its folder must have last changed for its identity to vouch for it
#: (a file added in the same tick of the file system's clock right after the listing would leave
#: the folder's times as they were): ten ticks of the kernel's coarse clock, or, for a file system
#: that keeps whole seconds (FAT keeps two), ``RACY_COARSE_NS``.
RACY_NS = 100_000_000
RACY_COARSE_NS = 2_100_000_000


def dir_identity(path: str | os.PathLike[str]) -> list[int]:
    """``[mtime_ns, ctime_ns, inode]`` of a folder (zeros when absent): they change when files
    are added, removed or renamed in it, or when the folder is replaced."""
    try:
        st = os.stat(path)
    except OSError:
        return [0, 0, 0]
    return [st.st_mtime_ns, st.st_ctime_ns, st.st_ino]


def _vouching(st: os.stat_result, listed_ns: int) -> list[int]:
    """A folder's identity (:func:`dir_identity`) taken when it is about to be listed at
    ``listed_ns`` (wall clock), or ``UNSURE`` when it changed within ``RACY_NS`` of that."""
    changed = max(st.st_mtime_ns, st.st_ctime_ns)
    coarse = st.st_mtime_ns % 1_000_000_000 == 0 and st.st_ctime_ns % 1_000_000_000 == 0
    if changed > listed_ns - (RACY_COARSE_NS if coarse else RACY_NS):
        return list(UNSURE)
    return [st.st_mtime_ns, st.st_ctime_ns, st.st_ino]


class Reader(Protocol):
    """An annotation format. ``read_annotations`` asks each reader in turn whether it
    recognises the path (:meth:`sniff`), has the chosen one :meth:`discover` what is there, gives
    every file to :meth:`parse_file` (in worker processes unless not ``parallel``), then asks for
    the images without annotations, the splits the layout keeps and the landmark schema. A new
    format: a module here with a subclass of this, and one line in ``READERS``."""

    #: The format's name (``format="voc"``).
    name: str
    #: Whether files can be parsed in parallel chunks (False: one file, or files read together).
    parallel: bool = True
    #: Whether each file gives its own images alone (no image ids, no declared classes, nothing
    #: another file reads), so that a cached index is refreshed by parsing only the files that
    #: changed (:mod:`detloader.annotations.refresh`); its ``Source.stamp`` begins with the
    #: files' stamps, in the order of ``Source.files``.
    per_file: bool = False

    def sniff(self, path: Path) -> bool:
        """Whether ``path`` (a file or folder) looks like this format; cheap, never raises."""
        ...

    def discover(self, path: Path, options: ReadOptions) -> Source:
        """The layout at ``path``: root, annotation files, image folders, the format's facts. A
        ``per_file`` reader also takes ``known`` (:data:`KnownFiles`, None by default): the
        annotation files' listing kept with the cache, stated again instead of listing their
        folders while those are unchanged (:func:`scan_files`); it leaves its own listing in
        ``Source.file_listing``."""
        ...

    def parse_file(self, source: Source, rel: str, builder: ChunkBuilder) -> None:
        """Parse the file ``rel`` (relative to the root; ``builder.begin_file(rel)`` is done). In a
        worker process ``source`` comes without its ``files`` and ``stamp`` (not read here)."""
        ...

    def unannotated(self, source: Source, index: AnnotationIndex, options: ReadOptions) -> list[Problem]:
        """Problems for images in the image folder without annotations."""
        return []

    def splits(self, source: Source, index: AnnotationIndex) -> dict[str, np.ndarray]:
        """The splits the layout keeps, as image positions (sources in ``index.meta["split_sources"]``)."""
        return {}

    def default_landmarks(self, source: Source, names: Sequence[str]) -> LandmarkSchema | None:
        """The schema to use when the landmark names found (in order of first appearance) fit it."""
        return None


#: Whether a folder is listed and its files stated through a descriptor (a third less CPU per
#: ``stat`` of 100,000 files than by their paths, where the platform allows it).
_BY_FD = os.scandir in os.supports_fd and os.stat in os.supports_dir_fd
_DIR_FLAGS = os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | getattr(os, "O_CLOEXEC", 0)


def scan_files(
    top: str | os.PathLike[str],
    suffixes: Iterable[str],
    *,
    root: str | os.PathLike[str],
    recursive: bool = True,
    problems: list[Problem] | None = None,
    follow_outside: bool = False,
    stamps: bool = True,
    folders: dict[str, list[int]] | None = None,
    known: FolderListing | None = None,
) -> list[Stamp]:
    """:data:`Stamp` of the regular files under ``top`` whose name ends with one of
    ``suffixes`` (case-insensitive), sorted by path. Hidden folders and detloader's cache
    folder are skipped; so are (and, into ``problems``, named) FIFOs, sockets and devices
    (``not_a_regular_file``), links to a folder already read (``symlink_loop``) and, unless
    ``follow_outside``, links to a folder outside both ``root`` and ``top``
    (``link_outside_dataset``: a link to ``/`` would list the whole machine). ``top`` itself
    is taken as it is, link or not: it is the layout's folder or the user's. ``stamps=False``
    (the names are all the caller needs): a regular file is told by its folder entry's type, with
    no ``stat`` per file (one per file was 99 % of listing a folder of 300,000 images), and its
    stamp numbers are 0. ``folders``, when given, receives the identity of every folder listed
    (:class:`FolderListing`). ``known``: the listing of an earlier scan of ``top`` with the same
    arguments; while its folders are unchanged, its files are stated again and no folder is
    listed (:func:`_restated`)."""
    suffixes = tuple(s.lower() for s in suffixes)
    root = os.fspath(root)
    if known is not None and stamps:
        again = _restated(known, os.path.relpath(top, root), root)
        if again is not None:
            if folders is not None:
                folders.update(known.folders)
            return again
    listed_ns = time.time_ns()
    bases = () if follow_outside else (os.path.realpath(root), os.path.realpath(top))
    is_regular = stat.S_ISREG
    out: list[Stamp] = []
    found = problems if problems is not None else []
    stack = [os.fspath(top)]
    try:
        st = os.stat(stack[0])
    except OSError:
        return out
    seen = {(st.st_dev, st.st_ino)}
    if folders is not None:
        folders[os.path.relpath(stack[0], root)] = _vouching(st, listed_ns)
    while stack:
        folder = stack.pop()
        try:  # names resolved in the folder by its descriptor: each stat walks one name, not the whole path
            fd = os.open(folder, _DIR_FLAGS) if _BY_FD else None
        except OSError:
            continue
        try:
            entries = list(os.scandir(folder if fd is None else fd))
        except OSError:
            entries = []
        prefix = os.path.relpath(folder, root)  # once per folder: relpath per file is slow
        prefix = "" if prefix == "." else prefix + os.sep
        try:
            for entry in entries:
                name = entry.name
                try:
                    if entry.is_dir(follow_symlinks=True):
                        if recursive and not name.startswith("."):  # hidden folders: .git, the index cache
                            path = os.path.join(folder, name)
                            if bases and entry.is_symlink():
                                target = os.path.realpath(path)
                                if not within(target, bases):
                                    found.append(outside_link(prefix + name, path, target))
                                    continue
                            st = entry.stat()
                            folder_id = (st.st_dev, st.st_ino)
                            if folder_id in seen:
                                target = os.path.relpath(os.path.realpath(path), root)
                                message = f"links to {target}, a folder already read"
                                found.append(
                                    Problem("symlink_loop", prefix + name, "", message, "not followed", "repaired")
                                )
                            else:
                                seen.add(folder_id)
                                stack.append(path)
                                if folders is not None:
                                    folders[prefix + name] = _vouching(st, listed_ns)
                    elif name.lower().endswith(suffixes):
                        if not stamps and entry.is_file():
                            out.append((prefix + name, 0, 0, 0, 0))
                            continue
                        st = entry.stat() if fd is None else os.stat(name, dir_fd=fd)  # links followed
                        if is_regular(st.st_mode):
                            out.append((prefix + name, st.st_mtime_ns, st.st_size, st.st_ctime_ns, st.st_ino))
                        else:
                            message = f"{file_kind(st.st_mode)}, not a regular file"
                            found.append(Problem("not_a_regular_file", prefix + name, "", message, "skipped"))
                except OSError as err:  # a link loop the kernel refuses (ELOOP), a dangling link
                    loop = err.errno == errno.ELOOP
                    kind, severity = ("symlink_loop", "repaired") if loop else ("unreadable_file", "error")
                    message = f"cannot be followed: {err.strerror or err}"
                    found.append(Problem(kind, prefix + name, "", message, "skipped", severity))
        finally:
            if fd is not None:
                os.close(fd)
    out.sort(key=itemgetter(0))  # names are unique; comparing them alone is twice as fast
    return out


def _restated(known: FolderListing, top: str, root: str) -> list[Stamp] | None:
    """The :data:`Stamp` of each of ``known.files`` (relative to ``root``, sorted), stated again
    through the root's descriptor, when ``known`` is a listing of ``top`` (relative to ``root``)
    that named no problem and none of its folders changed: then the same files are there, and a
    folder listing is saved (a third of a warm read of 100,000 files: the listing, a folder
    entry's test each and the sort). None (list them again) when a folder changed, or a file can
    no longer be stated or is no longer a regular file (a link whose target changed)."""
    if known.problems or next(iter(known.folders), None) != top or not known.current(root):
        return None
    try:
        fd = os.open(root, _DIR_FLAGS) if _BY_FD else None
    except OSError:
        return None
    try:
        if fd is not None:
            found = list(map(functools.partial(os.stat, dir_fd=fd), known.files))
        else:
            found = [os.stat(os.path.join(root, rel)) for rel in known.files]
    except OSError:
        return None
    finally:
        if fd is not None:
            os.close(fd)
    if not all(map(stat.S_ISREG, map(attrgetter("st_mode"), found))):
        return None
    return [(rel, st.st_mtime_ns, st.st_size, st.st_ctime_ns, st.st_ino) for rel, st in zip(known.files, found)]


def holds_xml(folder: str | os.PathLike[str]) -> bool:
    """Whether ``folder`` holds an ``.xml`` file (a VOC ``Annotations/`` folder): the readers of
    other formats skip such a folder, and it stops at the first one, where a listing of
    100,000 names would cost more than the read."""
    with os.scandir(folder) as entries:
        return any(e.name.lower().endswith(".xml") for e in entries)


def within(path: str, folders: Iterable[str]) -> bool:
    """Whether the resolved ``path`` is one of ``folders`` (resolved too) or lies below one."""
    return any(path == f or path.startswith(f.rstrip(os.sep) + os.sep) for f in folders)


def outside_link(
    rel: str, link: str, target: str, action: str = "not followed: nothing below it read", severity: Severity = "error"
) -> Problem:
    """The ``link_outside_dataset`` problem of the folder link ``link`` (``rel`` relative to the
    root), whose resolved ``target`` lies outside the dataset: the link as written, where it
    leads, and how to follow it anyway."""
    try:
        written = os.readlink(link)
    except OSError:
        written = target
    shown = written if os.path.normpath(written) == target else f"{written} ({target})"
    message = (
        f"a folder link to {shown} leaves the dataset; remove it, or pass allow_outside_images=True "
        "(--allow-outside-images) to follow it"
    )
    return Problem("link_outside_dataset", rel, "", message, action, severity)


def stat_entry(path: str | os.PathLike[str], root: str | os.PathLike[str]) -> Stamp:
    """The :data:`Stamp` of one file (``OSError`` when absent)."""
    st = os.stat(path)
    return (os.path.relpath(path, root), st.st_mtime_ns, st.st_size, st.st_ctime_ns, st.st_ino)


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


def read_head(path: Path, n: int = 4096) -> bytes:
    """The first ``n`` bytes of a file (empty when it cannot be read)."""
    try:
        with open_regular(path) as fh:
            return fh.read(n)
    except OSError:
        return b""


def file_source(
    source_type: type[S], annotation_file: Path | Sequence[Path], root: Path, image_dirs: Sequence[str], **facts: Any
) -> S:
    """The Source of a single-file format (or of several such files, one split each): the
    file(s) in the stamp, the candidate image folders, the format's ``facts``."""
    files = [stat_entry(p, root) for p in ([annotation_file] if isinstance(annotation_file, Path) else annotation_file)]
    return source_type(root=root, files=[f[0] for f in files], stamp=files, image_dirs=list(image_dirs), **facts)


def check_options(options: ReadOptions, reader: str, allowed: Sequence[str]) -> None:
    """Refuse format options the reader does not know (a typo would otherwise be ignored)."""
    unknown = sorted(k for k, _ in options.extra if k not in allowed)
    if unknown:
        valid = ", ".join(allowed) or "none"
        raise DetloaderValueError(
            f"format option(s) {', '.join(unknown)} not known to the {reader} reader; valid: {valid}"
        )


def candidate_dirs(root: Path, names: Sequence[str], image_dir: str | None) -> list[str]:
    """Image folders relative to ``root``: ``image_dir`` when given, else those of ``names``
    that exist (``""`` is the root itself), in order; never empty."""
    if image_dir:
        return [os.path.relpath(image_dir, root)]
    return [name for name in dict.fromkeys(names) if name == "" or (root / name).is_dir()] or [""]


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
