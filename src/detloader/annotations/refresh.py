"""Refresh a cached index after some annotation files were added, removed or changed: parse only
those, keep the rows and problems of the others from the old index, and assemble the result as a
full build does, so that it equals a build from scratch (docs/index.md, "The cache").

Only readers whose files are independent of each other (``Reader.per_file``: one file gives its
own images, without image ids, declared classes or anything another file reads) are refreshed.
Beside each such cache file lies ``NAME.dlindex.stamps``: the cache key it belongs to, the key
of everything but the annotation files (:func:`base_key`) and each annotation file's stamp.
Whenever anything else changed, or the old index holds what cannot be taken apart per file
(landmarks, a class map, reader counts, images found elsewhere), the caller builds in full.
"""

from __future__ import annotations

import bisect
import contextlib
import hashlib
import json
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

from detloader.annotations.builder import Partial
from detloader.annotations.cache import (
    CACHE_VERSION,
    READER_VERSION,
    key_matches,
    load_index_file,
    read_arrays,
    read_key,
    write_arrays,
)
from detloader.annotations.checks import ReadOptions
from detloader.annotations.distinct import unique_sorted
from detloader.annotations.fields import (
    CLASS_LISTS,
    FIELDS,
    MISSING,
    OFFSETS,
    pack_strings,
    packed_names,
    unpack_strings,
)
from detloader.annotations.image_search import should_search
from detloader.annotations.index import AnnotationIndex
from detloader.annotations.parse import _parse_chunk, assemble
from detloader.annotations.problems import Problem, ProblemReport
from detloader.annotations.readers.common import FolderListing, Reader, Source, StampTable, dir_identity
from detloader.errors import CacheError

STAMPS_SUFFIX = ".stamps"
#: A stamps file: the index cache's layout (``cache.write_arrays``) under its own magic.
STAMPS_MAGIC = b"DLSTAMP\n"
#: More changed files than this share of all (and than ``MIN_CHANGED``): the full, parallel build.
MAX_CHANGED_SHARE = 0.25
MIN_CHANGED = 256


@dataclass(frozen=True)
class FileStamps:
    """Each annotation file's stamp, as columns: ``names`` (in the source's order), ``numbers``
    int64 ``[n, 4]`` (mtime, size and ctime in ns or bytes, the inode's bits) and ``digests``
    (each file's content digest in hex, ``""`` with ``verify="stat"``). Compared as arrays: a
    refresh of 100,000 files makes no tuple per file."""

    names: list[str]
    numbers: np.ndarray
    digests: list[str]

    def changed(self, before: FileStamps, rows: np.ndarray) -> np.ndarray:
        """bool ``[n]``: whether each file of ``self`` is new or its stamp differs from ``before``'s;
        ``rows``: each file's position among ``before``'s (-1: new), :func:`_positions`."""
        if not before.names:
            return np.ones(len(self.names), dtype=np.bool_)
        out = (rows < 0) | (before.numbers[rows] != self.numbers).any(axis=1)
        if any(self.digests) or any(before.digests):
            old = [before.digests[i] if i >= 0 else None for i in rows.tolist()]
            out |= np.fromiter((a != b for a, b in zip(self.digests, old)), np.bool_, len(self.names))
        return out


def stamps_file(cache_file: Path) -> Path:
    """Where the annotation file stamps of ``cache_file`` are kept."""
    return cache_file.with_name(cache_file.name + STAMPS_SUFFIX)


def base_key(name: str, options_json: str, source: Source, verify: str, digests: dict[str, bytes] | None = None) -> str:
    """What :func:`~detloader.annotations.cache.content_key` hashes, but the annotation files'
    stamps: the reader, the options, the root's and the image folders' identities, the format's
    facts and every other stamped file (split lists), with its digest under ``verify="content"``.
    For a source whose stamps begin with its files (:func:`file_stamps` is not None)."""
    others = [[*s, (digests or {}).get(s[0], b"").hex()] for s in source.stamp[len(source.files) :]]
    root = os.stat(source.root)
    image_dirs = [dir_identity(source.root / d) for d in source.image_dirs or ()]
    parts = [READER_VERSION, CACHE_VERSION, name, options_json, root.st_dev, root.st_ino, verify]
    text = json.dumps([parts, source.facts(), image_dirs, others], sort_keys=True)
    return hashlib.blake2b(text.encode("utf-8", "surrogateescape"), digest_size=16).hexdigest()


def file_stamps(
    reader: Reader, source: Source, digests: dict[str, bytes] | None, table: StampTable | None = None
) -> FileStamps | None:
    """Each annotation file's stamp, in the order of ``source.files`` (what :func:`refresh_index`
    compares and :func:`save_stamps` writes); None for a reader that is not refreshed, or whose
    stamps do not begin with its files in their order (then it builds in full)."""
    names, numbers, files_first = source.stamp_table() if table is None else table
    if not reader.per_file or not files_first:
        return None
    n = len(source.files)
    hexed = [digests.get(name, b"").hex() for name in names[:n]] if digests else [""] * n
    return FileStamps(names[:n], numbers[:n], hexed)


def save_stamps(cache_file: Path, key: str, base: str | None, stamps: FileStamps | None, source: Source) -> None:
    """Write the stamps of ``cache_file`` (whose key is ``key``) for a later refresh, with the
    source's listings: the image folder's (``image_listing``) and its annotation folders'
    identities (``file_listing``: its files are ``stamps.names``) when the reader made them;
    nothing for a reader that is not refreshed (``base`` and ``stamps`` None), and a stale file
    is removed when there is nothing to write. ``OSError`` when it cannot be written."""
    path = stamps_file(cache_file)
    if stamps is None or base is None:
        with contextlib.suppress(OSError):
            path.unlink()
        return
    names_blob, names_offsets = pack_strings(stamps.names)
    digests_blob, digests_offsets = pack_strings(stamps.digests)
    arrays = {"names_blob": names_blob, "names_offsets": names_offsets, "numbers": stamps.numbers,
              "digests_blob": digests_blob, "digests_offsets": digests_offsets}
    facts = None
    listing = source.image_listing
    if listing is not None:
        arrays["listing_files_blob"], arrays["listing_files_offsets"] = pack_strings(listing.files)
        facts = {"folders": listing.folders, "problems": ProblemReport(listing.problems).to_list()}
    files_folders = source.file_listing.folders if source.file_listing is not None else None
    header = {"key": key, "base": base, "listing": facts, "files_folders": files_folders}
    write_arrays(path, header, arrays, magic=STAMPS_MAGIC)


class Stored(NamedTuple):
    """A stamps file read: the cache key and :func:`base_key` it was written with, the
    annotation files' ``stamps``, the image folder's ``listing`` and ``files_listing``: the
    annotation files' listing (their names and folders' identities), None when not kept."""

    key: str
    base: str
    stamps: FileStamps
    listing: FolderListing | None
    files_listing: FolderListing | None


def _folders(value: Any) -> dict[str, list[int]]:
    return {str(k): [int(n) for n in v] for k, v in value.items()}


def _load_stamps(path: Path) -> tuple[Stored | None, os.stat_result | None]:
    """The stamps file at ``path`` (None when it is absent or not usable) and its stat."""
    listing = files_listing = None
    try:
        header, data, st = read_arrays(path, magic=STAMPS_MAGIC)
        key, base, facts = str(header["key"]), str(header["base"]), header["listing"]
        names = unpack_strings(data["names_blob"], data["names_offsets"])
        numbers = np.array(data["numbers"], dtype=np.int64)
        digests = unpack_strings(data["digests_blob"], data["digests_offsets"])
        if facts is not None:
            files = unpack_strings(data["listing_files_blob"], data["listing_files_offsets"])
            problems = list(ProblemReport.from_list(facts["problems"]))
            listing = FolderListing(files, problems, _folders(facts["folders"]))
        if header.get("files_folders") is not None:
            files_listing = FolderListing(names, [], _folders(header["files_folders"]))
    except (OSError, CacheError, ValueError, KeyError, TypeError, IndexError, AttributeError, UnicodeDecodeError):
        return None, None
    if numbers.ndim != 2 or numbers.shape[1] != 4 or not len(names) == len(numbers) == len(digests):
        return None, st
    return Stored(key, base, FileStamps(names, numbers, digests), listing, files_listing), st


class StoredStamps:
    """The stamps file of the cache a read will use, read once for both of its uses: the
    annotation files' last listing, which the reader states again instead of listing their
    folders (:meth:`files_listing`, ``Reader.discover``'s ``known``), and the stamps
    :func:`refresh_index` compares. ``locate``: the cache file of the dataset at a root, found
    (never made) before the reader has said where the root is; None where there is none."""

    def __init__(self, locate: Callable[[Path], Path | None]) -> None:
        self._locate = locate
        self._read: tuple[Path, os.stat_result | None, Stored | None] | None = None

    def load(self, cache_file: Path) -> Stored | None:
        """What the stamps file of ``cache_file`` holds, read again when it changed since."""
        path = stamps_file(cache_file)
        if self._read is not None and self._read[0] == path and self._read[1] is not None:
            with contextlib.suppress(OSError):
                st, before = os.stat(path), self._read[1]
                if (st.st_mtime_ns, st.st_size, st.st_ino) == (before.st_mtime_ns, before.st_size, before.st_ino):
                    return self._read[2]
        stored, st = _load_stamps(path)
        self._read = (path, st, stored)
        return stored

    def files_listing(self, root: Path) -> FolderListing | None:
        """The annotation files' listing kept with the cache of the dataset at ``root``."""
        cache_file = self._locate(root)
        stored = self.load(cache_file) if cache_file is not None else None
        return stored.files_listing if stored is not None else None


def _refreshable(old: AnnotationIndex, options: ReadOptions) -> bool:
    """Whether the old index can be taken apart per file: no landmarks (their slots follow the
    order names first appear in), no class map (checked over every file), no reader counts
    (not kept per file), no images found elsewhere, no image ids of the files' own."""
    meta = old.meta
    if options.class_map or meta.get("stats") or "image_search" in meta or old.vocab.landmarks.names:
        return False
    span = meta.get("parsed_problems")
    if not (isinstance(span, list) and len(span) == 2 and 0 <= span[0] <= span[1] <= len(old.problems)):
        return False
    return bool(np.array_equal(old.image_ids, np.arange(1, len(old) + 1)))


def _used(values: np.ndarray, names: Sequence[Any]) -> tuple[np.ndarray, list[Any]]:
    """``values`` (ids into ``names``, MISSING allowed) renumbered over the names they use, and those names."""
    ids = unique_sorted(values[values != MISSING]).tolist()  # np.unique imports numpy.ma: 30 ms a refresh
    lut = np.full(len(names) + 1, MISSING, dtype=np.int32)  # the last slot: MISSING stays MISSING
    lut[ids] = np.arange(len(ids), dtype=np.int32)
    return lut[values].astype(np.int32), [names[i] for i in ids]


def _attributes(table: np.ndarray, vocab: Sequence[tuple[str, Sequence[str]]]) -> tuple[np.ndarray, list[Any]]:
    """An attribute table reduced to the attributes and values its rows use (a chunk's view)."""
    columns, local = [], []
    for j, (name, values) in enumerate(vocab):
        column, used = _used(table[:, j], values)
        if used:
            columns.append(column)
            local.append((name, used))
    out = np.stack(columns, axis=1) if columns else np.zeros((len(table), 0), dtype=np.int32)
    return out, local


def _kept_partial(old: AnnotationIndex, rows: np.ndarray, problems: list[Problem]) -> Partial:
    """The old index's ``rows`` as the chunk their files would parse to, with their ``problems``."""
    sub = old.subset(rows)
    packed = sub.arrays()
    arrays: dict[str, np.ndarray] = {OFFSETS: sub.object_offsets}
    vocabs: dict[str, Any] = {"landmarks": []}
    vocab = old.vocab
    # the classes of the objects and of the class lists, renumbered over those used, as a parse does
    lists = [sub.class_lists(name) for name in CLASS_LISTS]
    class_ids, vocabs["classes"] = _used(np.concatenate([sub.labels, *(v for v, _ in lists)]), vocab.classes)
    cuts = np.cumsum([len(sub.labels), *(len(v) for v, _ in lists)])
    for f in FIELDS:
        if f.level == "string":
            arrays.update({name: packed[name] for name in packed_names(f)})
        elif f.level == "list":
            k = CLASS_LISTS.index(f.name)
            data_name, offsets_name = packed_names(f)
            arrays[data_name], arrays[offsets_name] = class_ids[cuts[k] : cuts[k + 1]], lists[k][1]
        elif f.name == "labels":
            arrays[f.name] = class_ids[: cuts[0]]
        elif f.name == "image_ids":
            arrays[f.name] = np.full(len(sub), MISSING, dtype=f.dtype)
        elif f.vocab == "image_classes":
            arrays[f.name], vocabs[f.vocab] = _used(getattr(sub, f.name), getattr(vocab, f.vocab))
        elif f.vocab in ("image_attributes", "object_attributes"):
            arrays[f.name], vocabs[f.vocab] = _attributes(getattr(sub, f.name), getattr(vocab, f.vocab))
        else:
            arrays[f.name] = getattr(sub, f.name)
    return Partial(arrays=arrays, vocabs=vocabs, problems=problems)


def _positions(names: Sequence[str], among: Sequence[str]) -> np.ndarray:
    """int64: the position of each of ``names`` in ``among`` (each list's names distinct; -1
    when absent). No lookup per name when the two lists are equal (one file edited among
    100,000: every list is the same); a few names in a long sorted list are bisected each (the
    files of problems); else the two lists are lined up from both ends, where they agree (a
    file added or removed leaves them equal before and after it: compared as object arrays, in
    C), and only the names between are looked up in a dict."""
    if names == among:
        return np.arange(len(names), dtype=np.int64)
    n, m = len(names), len(among)
    if not n:
        return np.zeros(0, dtype=np.int64)
    if 8 * n < m and list(among) == sorted(among):
        at = [bisect.bisect_left(among, name) for name in names]
        return np.array([k if k < m and among[k] == name else -1 for k, name in zip(at, names)], dtype=np.int64)
    a, b = np.array(names, dtype=object), np.array(among, dtype=object)
    k = min(n, m)
    head = _agreeing(a[:k] == b[:k])
    tail = _agreeing(a[n - k + head :][::-1] == b[m - k + head :][::-1])  # never past the head
    out = np.empty(n, dtype=np.int64)
    out[:head] = np.arange(head)
    out[n - tail :] = np.arange(m - tail, m)
    where = {rel: j for j, rel in enumerate(among[head : m - tail], head)}
    out[head : n - tail] = [where.get(rel, -1) for rel in names[head : n - tail]]
    return out


def _agreeing(equal: np.ndarray) -> int:
    """How many leading values of ``equal`` (an elementwise ``==`` of object arrays) are True."""
    miss = np.flatnonzero(~np.asarray(equal, dtype=np.bool_))
    return int(miss[0]) if len(miss) else len(equal)


def refresh_index(
    reader: Reader,
    source: Source,
    options: ReadOptions,
    cache_file: Path,
    base: str,
    stamps: FileStamps,
    stored: StoredStamps,
) -> AnnotationIndex | None:
    """The index of ``source`` from the cached one, parsing only the annotation files added or
    changed since (and those whose images were dropped as duplicates); None when it cannot be
    refreshed (then build in full). ``base``: :func:`base_key` now; ``stamps``: :func:`file_stamps`
    now; ``stored``: the read's stamps file (read here unless read already)."""
    if not source.files:
        return None
    found = stored.load(cache_file)
    if found is None or found.base != base:
        return None
    stored_key, before, listing = found.key, found.stamps, found.listing
    try:
        if read_key(cache_file) != stored_key or not key_matches(stored_key, stored_key.split(" ", 1)[0], source.root):
            return None  # another cache file, or images added or removed in an image folder
        old = load_index_file(cache_file, root=source.root)
    except (OSError, CacheError):
        return None
    if not _refreshable(old, options):
        return None
    start, stop = old.meta["parsed_problems"]
    parsed = list(old.problems)[start:stop]
    files = source.files  # stamps.names (file_stamps)
    old_at = _positions(before.names, files)  # each stored file's position now (-1: removed)
    rows = np.full(len(files), -1, dtype=np.int64)  # each file's position among the stored (-1: new)
    rows[old_at[old_at >= 0]] = np.flatnonzero(old_at >= 0)
    keep = ~stamps.changed(before, rows)
    redo = sorted({p.file for p in old.problems if p.kind == "duplicate_image"})  # their rows were dropped
    if redo:
        at = _positions(redo, files)
        keep[at[at >= 0]] = False
    if len(files) - int(keep.sum()) > max(MIN_CHANGED, MAX_CHANGED_SHARE * len(files)):
        return None
    arrays = old.arrays()
    row_files = unpack_strings(arrays["annotation_paths_blob"], arrays["annotation_paths_offsets"])
    row_old = _positions(row_files, before.names)  # each old row's file among the stored stamps
    problems_of: dict[str, list[Problem]] = {}
    for problem in parsed:
        problems_of.setdefault(problem.file, []).append(problem)
    problem_files = list(problems_of)
    if (row_old < 0).any() or (_positions(problem_files, before.names) < 0).any():
        return None  # a row or problem of no stamped file: it could not be kept or dropped with its file
    file_of_row = np.append(old_at, -1)[row_old]  # the file's position now
    # the old rows grouped by the position of their file now (a stable sort: file order, then row order)
    by_file = np.argsort(file_of_row, kind="stable")
    sorted_files = file_of_row[by_file]
    problem_at = _positions(problem_files, files)
    edges = [0, *(np.flatnonzero(keep[1:] != keep[:-1]) + 1).tolist(), len(files)]  # runs of kept or not
    partials: list[Partial] = []
    for start, stop in zip(edges[:-1], edges[1:]):
        if keep[start]:
            lo, hi = np.searchsorted(sorted_files, [start, stop])
            inside = np.flatnonzero((problem_at >= start) & (problem_at < stop))
            inside = inside[np.argsort(problem_at[inside], kind="stable")]  # in file order
            problems = [p for k in inside.tolist() for p in problems_of[problem_files[k]]]
            partials.append(_kept_partial(old, by_file[lo:hi], problems))
        else:
            partials.append(_parse_chunk(reader.name, source, files[start:stop], options))
    if source.image_listing is None:
        source.image_listing = listing  # the reader lists the image folder again only if it changed
    index = assemble(reader, source, options, partials)
    searched = options.image_dir is None and options.check_images and source.image_dirs is not None
    if searched and should_search(len(index), index.problems.counts().get("missing_image", 0)):
        return None  # the full build looks for the images elsewhere
    index.meta["refreshed"] = len(files) - int(keep.sum())
    return index
