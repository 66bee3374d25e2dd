"""``read_annotations``: find the format, use the cached index when it is current, otherwise
parse (:mod:`detloader.annotations.parse`), cache (:mod:`detloader.annotations.cache`) and
apply the error policy (:mod:`detloader.annotations.problems`).
"""

from __future__ import annotations

import contextlib
import gc
import hashlib
import json
import os
import warnings
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from detloader._system.files import file_kind
from detloader.annotations import cache as _cache
from detloader.annotations import refresh as _refresh
from detloader.annotations.checks import ReadOptions
from detloader.annotations.image_search import find_image_folder, search_message, should_search
from detloader.annotations.index import AnnotationIndex
from detloader.annotations.landmarks import LandmarkSchema
from detloader.annotations.pack import is_pack, read_pack
from detloader.annotations.parse import ProgressFn, build_index
from detloader.annotations.problems import OnError, Problem, ProblemReport, apply_policy, check_choice, check_on_error
from detloader.annotations.readers import READERS
from detloader.annotations.readers.common import Reader, Source, StampTable, stat_entry
from detloader.annotations.splits import SPLITS_JSON
from detloader.errors import (
    DetloaderFileNotFoundError,
    DetloaderRuntimeWarning,
    DetloaderTypeError,
    DetloaderValueError,
    ImageFolderWarning,
)

VERIFY_CHOICES = ("stat", "content")
#: What format detection looks for, for the message when it finds nothing.
_LOOKED_FOR = (
    "COCO .json, an Open Images boxes .csv, a VOC Annotations/ folder or <annotation> .xml files, a CVAT "
    "<annotations> .xml, an imglab <dataset> .xml, a YOLO data.yaml or labels/ folder, a txt list (label.txt, "
    "train.txt)"
)


def available_formats() -> list[str]:
    return list(READERS)


def _sniff(path: Path) -> str | None:
    return next((name for name, reader in READERS.items() if reader.sniff(path)), None)


def find_dataset(path: str | os.PathLike[str]) -> tuple[str, Path]:
    """``(format, path)``: the first reader that recognises ``path``, else the one folder
    right below it that a reader recognises (an export unpacked into a folder of its own).
    ValueError naming the folder, what was looked for and how to choose a format, or the
    sub-folders when several are datasets."""
    p = Path(path)
    name = _sniff(p)
    if name is not None:
        return name, p
    kind = file_kind(p.stat().st_mode) if p.exists() else None
    if kind is not None and kind != "a folder":
        raise DetloaderValueError(f"path={str(path)!r} is {kind}, not an annotation file or dataset folder")
    below: list[tuple[str, Path]] = []
    for child in sorted(p.iterdir()) if p.is_dir() else ():
        hit = _sniff(child) if child.is_dir() and not child.name.startswith(".") else None
        if hit is not None:
            below.append((hit, child))
    if len(below) == 1:
        return below[0]
    if below:
        found = ", ".join(f"{c.name}/ ({n})" for n, c in below)
        raise DetloaderValueError(
            f"path={str(path)!r}: no annotation format recognised here; one folder down: {found}; pass one of them"
        )
    raise DetloaderValueError(
        f"path={str(path)!r}: no annotation format recognised here or one folder down (looked for {_LOOKED_FOR}); "
        f"pass format='NAME' (command line: --format NAME), NAME one of {', '.join(READERS)}{_special_files(p)}"
    )


def _special_files(folder: Path) -> str:
    """``"; not read: data.yaml (a FIFO, not a regular file)"`` for the FIFOs, sockets and devices
    right in ``folder`` (never opened: they would block), ``""`` when there are none."""
    found = []
    try:
        with os.scandir(folder) as entries:
            for entry in entries:
                try:
                    kind = None if entry.is_dir() else file_kind(entry.stat().st_mode)
                except OSError:  # a dangling link
                    continue
                if kind is not None:
                    found.append(f"{entry.name} ({kind}, not a regular file)")
    except OSError:
        return ""
    return f"; not read: {', '.join(sorted(found)[:5])}" if found else ""


def detect_format(path: str | os.PathLike[str]) -> str:
    """The name of the first reader that recognises ``path`` (or the one folder right below
    it that holds a dataset: :func:`find_dataset`); ValueError if none does."""
    return find_dataset(path)[0]


def _make_options(
    classes: Sequence[str] | None,
    class_map: Mapping[str, str | None] | None,
    landmark_schema: LandmarkSchema | Sequence[str] | None,
    **kwargs: Any,
) -> ReadOptions:
    if isinstance(classes, str):
        raise DetloaderTypeError(f"classes={classes!r} must be a sequence of names, not one string")
    if classes is not None and len(set(classes)) != len(classes):
        raise DetloaderValueError(f"classes={list(classes)} holds a name twice")
    schema: LandmarkSchema | None
    if landmark_schema is None or isinstance(landmark_schema, LandmarkSchema):
        schema = landmark_schema
    else:
        schema = LandmarkSchema.from_names(list(landmark_schema))
    extra = tuple(sorted(kwargs.pop("format_options", {}).items()))
    return ReadOptions(
        classes=tuple(classes) if classes is not None else None,
        class_map=tuple(sorted((str(k), v) for k, v in (class_map or {}).items())),
        landmark_schema=schema,
        extra=extra,
        **kwargs,
    )


@contextlib.contextmanager
def _gc_paused() -> Iterator[None]:
    """The cyclic garbage collector paused (as it was before, after): a read makes a tuple or
    more per file and no cycle; with 100,000 files the collections it set off were 8 % of a refresh."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def read_annotations(
    path: str | os.PathLike[str],
    format: str = "auto",
    *,
    on_error: OnError = "raise",
    classes: Sequence[str] | None = None,
    class_map: Mapping[str, str | None] | None = None,
    landmark_schema: LandmarkSchema | Sequence[str] | None = None,
    one_based: bool = False,
    clip_boxes: bool = True,
    check_images: bool = True,
    image_class_attribute: str = "class",
    image_dir: str | os.PathLike[str] | None = None,
    allow_outside_images: bool = False,
    boxes_from_points: str = "enclose",
    max_file_bytes: int = 16 * 1024 * 1024,
    workers: int | None = None,
    cache: bool | str = True,
    verify: str = "stat",
    progress: ProgressFn | None = None,
    stream_cache: str | os.PathLike[str] | None = None,
    stream_cache_limit: int | None = None,
    storage_options: Mapping[str, Any] | None = None,
    **format_options: Any,
) -> AnnotationIndex:
    """Read a dataset's annotations into an :class:`AnnotationIndex` (cached on disk).

    Args:
        path: a dataset folder (VOCdevkit, annotations/ + images/, XML beside images) or file;
            with ``format="auto"``, also the folder right above a dataset (:func:`find_dataset`).
        format: ``"auto"`` or a reader name (see :func:`available_formats`).
        on_error: ``"raise"`` | ``"skip"`` | ``"warn"`` (docs/index.md, "Validation").
        classes: fixed class list (id order); other classes become ``unknown_class`` errors.
        class_map: ``{name_in_file: new_name}`` to rename or merge, ``{name: None}`` to drop;
            a key that matches no class of any file is refused (:class:`ClassMapError`).
        landmark_schema: a :class:`LandmarkSchema` or ordered names (flip pairs inferred).
        one_based: convert VOC's 1-based pixel indices (xmin, ymin minus 1).
        clip_boxes: clip partly-outside boxes (reported) instead of dropping them.
        check_images: check that image files exist.
        image_class_attribute: the image attribute that holds the image-level class.
        image_dir: image folder, when it is not where the layout says; relative to the dataset
            root (else the working directory). Without it, missing images are searched for below
            the root (docs/formats.md, "Where the images are").
        allow_outside_images: follow image names that leave the dataset (``../``, absolute) and
            folder links met while listing its folders that lead out of it; by default they are
            ``outside_dataset`` / ``link_outside_dataset`` problems (docs/reliability.md).
        boxes_from_points: ``"enclose"``, ``"image"`` or ``"skip"``: the box of an object with
            landmarks and no box (docs/formats.md, "Points without boxes").
        max_file_bytes: size cap of one annotation file.
        workers: processes for the cold build (default: the usable CPUs).
        cache: True (use and write the cache), False (neither) or ``"rebuild"``.
        verify: how the cache is known to be current: ``"stat"`` (file stamps and folder
            identities) or ``"content"`` (also a hash of every annotation file's bytes, read on
            every load); docs/index.md, "The cache".
        progress: ``progress(done_files, total_files)`` during a cold build.
        stream_cache, stream_cache_limit, storage_options: for a pack (``path`` an ``s3://``,
            ``gs://``, ``azure://`` prefix, or a folder holding ``detloader-pack.json``): the
            node's cache folder of its shards (default: the user cache folder's ``stream``), the
            bytes they may take there (default: :func:`~detloader.annotations.pack.default_cache_limit`)
            and the object store's options (endpoint, credentials; default: the environment's,
            ``AWS_ENDPOINT_URL``, profiles). Only the pack's index is fetched, no image; read
            options do not apply to it (it was read when packed): docs/loader.md, "Data on an
            object store".
        **format_options: options of one reader (the reader options table of docs/formats.md).
    """
    with _gc_paused():  # no frame of its own: warnings name the caller (stacklevel)
        if is_pack(path):
            given = {"format": format not in ("auto", "pack"), "class_map": bool(class_map),
                     "landmark_schema": landmark_schema is not None, "one_based": one_based,
                     "image_dir": image_dir is not None, "boxes_from_points": boxes_from_points != "enclose",
                     **{name: True for name in format_options}}
            check_on_error(on_error)
            index = read_pack(path, stream_cache, stream_cache_limit, storage_options,
                              [name for name, on in given.items() if on], classes)
            apply_policy(index.problems, on_error, str(path))
            return index
        p = _checked_path(path, on_error, cache, verify)
        options = _make_options(
            classes,
            class_map,
            landmark_schema,
            one_based=one_based,
            clip_boxes=clip_boxes,
            check_images=check_images,
            image_class_attribute=image_class_attribute,
            max_file_bytes=max_file_bytes,
            allow_outside_images=bool(allow_outside_images),
            boxes_from_points=boxes_from_points,
            format_options=format_options,
        )
        # the annotation files' last listing is trusted only where the cache is (verify="stat")
        plan = _plan(p, format, image_dir, options, workers, progress, known=cache is True and verify == "stat")
        cache_file = _cache_file(plan) if cache else None
        # taken once the cache folder exists: making `.detloader-cache` in a root that is also an image
        # folder changes that folder's identity, and a key taken before would not match on the next read
        digests: dict[str, bytes] | None = {} if verify == "content" else None
        table = plan.source.stamp_table()
        key = _cache.content_key(plan.name, plan.options_json, plan.source, verify, digests, table)
        if cache_file is None:
            index = plan.build()
        else:
            index = _read_cached(plan, cache_file, key, rebuild=cache == "rebuild", verify=verify, digests=digests,
                                 table=table)
        _finish(index, on_error, plan.source.root)
        # the read's tuple per file, freed while the collector is paused: a collection when it
        # resumes would walk them all (a tenth of a refresh of 100,000 files)
        del plan, table
        return index


def _checked_path(path: str | os.PathLike[str], on_error: OnError, cache: bool | str, verify: str) -> Path:
    """``path`` once ``on_error``, ``cache`` and ``verify`` are valid choices and it exists as
    a file or folder: FileNotFoundError when absent, ValueError for a FIFO, socket or device
    (whatever the format: it would block its reader)."""
    check_on_error(on_error)
    if cache not in (True, False, "rebuild"):
        raise DetloaderValueError(f"cache={cache!r} is not one of True, False, 'rebuild'")
    check_choice("verify", verify, VERIFY_CHOICES)
    p = Path(path)
    if not p.exists():
        raise DetloaderFileNotFoundError(f"path={str(path)!r} does not exist")
    kind = file_kind(p.stat().st_mode)
    if kind is not None and kind != "a folder":
        raise DetloaderValueError(f"path={str(path)!r} is {kind}, not an annotation file or dataset folder")
    return p


@dataclass(frozen=True)
class _Plan:
    """What one :func:`read_annotations` call reads: the format ``name`` and its ``reader``, the
    dataset ``path`` (one folder down from the one given, when found there), the files the
    reader discovered (``source``) and the options in effect (``options_json``: their cache
    key text); ``cache_name``: the index cache file's name (:func:`_cache_name`); ``stored``: the
    stamps file kept beside it, read at most once (for the reader, when it was given the
    annotation files' last listing, ``Reader.discover``'s ``known``, and for a refresh)."""

    name: str
    reader: Reader
    path: Path
    source: Source
    options: ReadOptions
    options_json: str
    workers: int | None
    progress: ProgressFn | None
    cache_name: str
    stored: _refresh.StoredStamps

    def build(self) -> AnnotationIndex:
        """Parse the files; the images searched for below the root when the layout's folders
        hold (almost) none of them (:func:`_search_images`)."""
        missing: list[str] = []
        index = build_index(
            self.reader, self.source, self.options, workers=self.workers, progress=self.progress, missing_names=missing
        )
        found = _search_images(self.reader, self.path, self.source, self.options, index, missing, self.workers)
        return found if found is not None else index


def _plan(
    p: Path,
    format: str,
    image_dir: str | os.PathLike[str] | None,
    options: ReadOptions,
    workers: int | None,
    progress: ProgressFn | None,
    known: bool = False,
) -> _Plan:
    """The format (detected for ``"auto"``, else checked), ``image_dir`` resolved into the
    options, and the reader's files; ``splits.json`` stamped with them whatever the format (its
    change rebuilds the index); a forced format that finds nothing to read is refused. ``known``:
    a reader that is refreshed is given the annotation files' listing kept with the cache
    (:class:`~detloader.annotations.refresh.StoredStamps`)."""
    name, p = find_dataset(p) if format == "auto" else (format, p)
    check_choice("format", name, ("auto", *READERS))
    reader = READERS[name]
    if image_dir is not None:
        options = replace(options, image_dir=_image_folder(image_dir, reader, p, options))
    options_json = json.dumps(options.to_json(), sort_keys=True)
    cache_name = _cache_name(name, options_json, p)
    stored = _refresh.StoredStamps(lambda root: _cache.cache_dir_for(root, create=False) / cache_name)
    if known and reader.per_file:
        source = reader.discover(p, options, known=stored.files_listing)  # a per_file reader takes it
    else:
        source = reader.discover(p, options)
    if os.path.exists(source.root / SPLITS_JSON):
        source.stamp.append(stat_entry(source.root / SPLITS_JSON, source.root))
    if format != "auto":
        _require_files(source, name, p)
    return _Plan(name, reader, p, source, options, options_json, workers, progress, cache_name, stored)


def _cache_name(name: str, options_json: str, path: Path) -> str:
    """The index cache file's name in its folder: the format and a tag of the options (and of
    the file's name, when a file was given: ``training.xml`` and ``testing.xml`` side by side
    get their own cache)."""
    tag_text = options_json + (f"\0{path.name}" if path.is_file() else "")
    options_tag = hashlib.blake2b(tag_text.encode("utf-8", "surrogateescape"), digest_size=8).hexdigest()
    return f"{name}-{options_tag}.dlindex"


def _cache_file(plan: _Plan) -> Path | None:
    """The index cache file for this read, its folder made; None, said in a warning, when no
    cache folder can be written or the file there is refused (a FIFO would hang the read: it
    is never opened, locked or replaced)."""
    root = plan.source.root
    try:
        cache_file = _cache.cache_dir_for(root) / plan.cache_name
    except OSError as err:  # neither the dataset folder nor the user cache can be written
        warnings.warn(f"{root}: reading without an index cache ({err})", DetloaderRuntimeWarning, stacklevel=3)
        return None
    refused = _cache.cache_file_refused(cache_file)
    if refused is not None:
        warnings.warn(
            f"{root}: reading without an index cache ({refused}; remove it to cache the index again)",
            DetloaderRuntimeWarning,
            stacklevel=3,
        )
        return None
    return cache_file


def _read_cached(
    plan: _Plan,
    cache_file: Path,
    key: str,
    *,
    rebuild: bool,
    verify: str,
    digests: dict[str, bytes] | None,
    table: StampTable,
) -> AnnotationIndex:
    """The index from ``cache_file`` when it is current (``key``), else refreshed from the
    changed annotation files alone or built, then saved and mapped from the file; a cache that
    cannot be written is said in a warning and the index read is returned as it is.

    One process per node builds (torchrun ranks, DataLoader workers): the others wait on the
    file's lock, then map its file; for a ``rebuild``, a file another process wrote while this
    one waited is that rebuild."""
    name, source = plan.name, plan.source
    before = _cache.file_stamp(cache_file)
    with _cache.build_lock(cache_file):
        current = not rebuild or _cache.file_stamp(cache_file) not in (None, before)
        index = _cache.load_current(cache_file, key, source.root) if current else None
        if index is not None:
            return index
        # only the annotation files changed: parse those alone (docs/index.md, "The cache")
        stamps = _refresh.file_stamps(plan.reader, source, digests, table)
        base = None  # the key of all but the annotation files: only for a reader that is refreshed
        if stamps is not None:
            base = _refresh.base_key(name, plan.options_json, source, verify, digests)
            if current:
                index = _refresh.refresh_index(plan.reader, source, plan.options, cache_file, base, stamps, plan.stored)
        index = plan.build() if index is None else index
        full_key = _cache.folders_key(key, source.root, _folders_of(index))
        try:
            _cache.save_index(index, cache_file, full_key)
            _refresh.save_stamps(cache_file, full_key, base, stamps, source)
            index = _cache.load_index_file(cache_file, root=source.root, check_data=False)  # written just now
        except OSError as err:
            warnings.warn(f"index cache not written to {cache_file}: {err}", DetloaderRuntimeWarning, stacklevel=3)
    return index


def _folders_of(index: AnnotationIndex) -> set[str]:
    """``{os.path.dirname(p) for p in index.image_paths()}``. When every image lies in one
    folder (VOC's JPEGImages/, COCO's train2017/) it is found on the packed paths, byte column
    by byte column, with no string per image; else from ``str.rpartition`` when that gives the
    same for every path (no path at the top or below a root, none with a doubled separator),
    else from ``dirname``. A refresh of 100,000 images spent a tenth of its time here."""
    arrays = index.arrays()
    blob, offsets = np.asarray(arrays["image_paths_blob"]), np.asarray(arrays["image_paths_offsets"])
    starts, seps = offsets[:-1], np.flatnonzero(blob == ord(os.sep))
    if len(starts) and len(seps):
        ends = seps[np.maximum(np.searchsorted(seps, offsets[1:]) - 1, 0)]  # each path's last separator
        width = int(ends[0] - starts[0])  # the first path's folder, in bytes
        same = width > 0 and bool((ends - starts == width).all()) and bool((ends < offsets[1:]).all())
        if same and all(bool((blob[starts + c] == blob[starts[0] + c]).all()) for c in range(width)):
            head = blob[starts[0] : ends[0]].tobytes().decode("utf-8", "surrogateescape")
            if not head.endswith(os.sep):
                return {head}
    paths = index.image_paths()
    heads = {p.rpartition(os.sep)[0] for p in paths}
    if "" in heads or any(h.endswith(os.sep) for h in heads):
        return {os.path.dirname(p) for p in paths}
    return heads


def _finish(index: AnnotationIndex, on_error: OnError, root: Path) -> None:
    """Apply the error policy; say where the images were found when they were searched for
    (the ``warn`` policy's summary says it already)."""
    found = index.meta.get("image_search")
    if found is not None and on_error != "warn":
        warnings.warn(
            f"{root}: {search_message(found)}; read from there (image_dir= chooses the folder)",
            ImageFolderWarning,
            stacklevel=3,
        )
    apply_policy(index.problems, on_error, str(root), stacklevel=4)  # the caller of read_annotations


def _image_folder(image_dir: str | os.PathLike[str], reader: Reader, path: Path, options: ReadOptions) -> str:
    """``image_dir`` as an absolute folder: a relative one is relative to the dataset root,
    else (when no such folder is there) to the working directory; FileNotFoundError when
    it is not a folder."""
    folder = Path(image_dir).expanduser()
    if folder.is_absolute():
        tried = [folder]
    else:
        tried = [reader.discover(path, options).root / folder, Path.cwd() / folder]
    for candidate in tried:
        if candidate.is_dir():
            return os.fspath(candidate.resolve())
    where = " or ".join(str(t) for t in tried)
    raise DetloaderFileNotFoundError(f"image_dir={os.fspath(image_dir)!r} is not a folder (looked for {where})")


def _require_files(source: Source, name: str, path: Path) -> None:
    """ValueError naming the folder and the format when a forced format finds nothing to read
    there: no annotation files, or (``source.labelled`` False: a reader whose files are the
    images) images without any label file."""
    if source.files and source.labelled:
        return
    try:
        detected = detect_format(path)
    except ValueError:
        detected = None
    hint = "" if detected in (None, name) else (
        f"; it looks like {detected} (format={detected!r} or 'auto'; command line: --format {detected})")
    what = f"{len(source.files)} images but no label files" if source.files else "no annotation files"
    folder = path if path.is_dir() else path.parent
    raise DetloaderValueError(f"{source.root}: format={name!r} found {what} there{hint}{_special_files(folder)}")


def _search_images(
    reader: Reader,
    path: Path,
    source: Source,
    options: ReadOptions,
    index: AnnotationIndex,
    missing: Sequence[str],
    workers: int | None,
) -> AnnotationIndex | None:
    """The index read with the image folder found below the root, when the layout's folders
    hold (almost) none of the images and that folder gives more; else None."""
    looked_in = source.image_dirs
    if options.image_dir is not None or not options.check_images or looked_in is None:
        return None
    found, n_missing = len(index), index.problems.counts().get("missing_image", 0)
    if not should_search(found, n_missing):
        return None
    layout = {f.split(os.sep, 1)[0] for f in source.files if os.sep in f}  # the annotation folder(s)
    links: list[Problem] = []
    hit = find_image_folder(
        source.root, missing, skip=looked_in, follow=layout, follow_outside=options.allow_outside_images, links=links
    )
    known = {p.file for p in index.problems if p.kind == "link_outside_dataset"}  # named by the reader's walk
    links = sorted((link for link in links if link.file not in known), key=lambda link: link.file)
    if hit is None:
        for link in links:
            index.problems.add(link)
        return None
    searched = replace(options, image_dir=os.fspath(source.root / hit.folder))
    again = reader.discover(path, searched)
    if again.root != source.root:
        return None
    result = build_index(reader, again, searched, workers=workers)
    if len(result) <= found:
        for link in links:
            index.problems.add(link)
        return None
    result.meta["image_search"] = {
        "folder": hit.folder,
        "looked_in": looked_in,
        "found": found,
        "missing": n_missing,
        "hits": hit.hits,
        "names": hit.names,
    }
    where = os.path.commonpath(source.files) if source.files else "."
    note = Problem(
        "images_found_elsewhere",
        where,
        "",
        search_message(result.meta["image_search"]),
        f"read with image_dir={hit.folder or '.'!r}",
        "repaired",
    )
    result.problems = ProblemReport([note, *result.problems, *links])
    return result


