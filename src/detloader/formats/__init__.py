"""Annotation readers. Every format produces the same :class:`~detloader.index.AnnotationIndex`.

A reader is a module with ``NAME``, ``sniff(path) -> bool``, ``discover(path, options) ->
Source``, ``parse(source, files, builder)`` and optionally ``splits(source, index)``,
``PARALLEL = False`` (single-file formats), ``DEFAULT_LANDMARKS`` or
``default_landmarks(source, names)`` (the schema to use when the landmark names found, in
order of first appearance, fit it). :func:`read_annotations` finds the format, looks for a cached index,
and otherwise parses the files (in parallel for many-file formats), merges, caches and applies
the error policy.
"""

from __future__ import annotations

import hashlib
import json
import multiprocessing
import os
import warnings
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from types import ModuleType
from typing import Any, Callable, Mapping, Sequence

from detloader import cache as _cache
from detloader._system import usable_cpus
from detloader.formats import coco, cvat, imglab, txt, voc, yolo
from detloader.formats._build import ChunkBuilder, Partial, ReadOptions, merge
from detloader.formats._common import Source
from detloader.index import AnnotationIndex, LandmarkSchema
from detloader.validate import OnError, apply_policy, check_on_error

#: Readers by name, in the order ``format="auto"`` tries them: a COCO folder has an
#: ``annotations/`` folder too, so COCO (JSON only) goes before VOC; an XML file is told by
#: its root element (``<annotation>`` VOC, ``<annotations>`` CVAT, ``<dataset>`` imglab).
READERS: dict[str, ModuleType] = {
    "coco": coco,
    "voc": voc,
    "cvat": cvat,
    "imglab": imglab,
    "yolo": yolo,
    "txt": txt,
}

#: Below this many files the index is built in this process (a pool costs more than it saves).
PARALLEL_MIN_FILES = 512
#: Bumped when what a reader produces changes, so that old caches are rebuilt.
READER_VERSION = 1

ProgressFn = Callable[[int, int], None]


def available_formats() -> list[str]:
    return list(READERS)


def detect_format(path: str | os.PathLike[str]) -> str:
    """The name of the first reader that recognises ``path``; ValueError if none does."""
    p = Path(path)
    for name, module in READERS.items():
        if module.sniff(p):
            return name
    raise ValueError(
        f"path={str(path)!r}: no annotation format recognised; pass format= one of "
        f"{', '.join(READERS)}"
    )


def _make_options(
    classes: Sequence[str] | None,
    class_map: Mapping[str, str | None] | None,
    landmark_schema: LandmarkSchema | Sequence[str] | None,
    **kwargs: Any,
) -> ReadOptions:
    if isinstance(classes, str):
        raise TypeError(f"classes={classes!r} must be a sequence of names, not one string")
    if classes is not None and len(set(classes)) != len(classes):
        raise ValueError(f"classes={list(classes)} holds a name twice")
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
    max_file_bytes: int = 16 * 1024 * 1024,
    workers: int | None = None,
    cache: bool | str = True,
    progress: ProgressFn | None = None,
    **format_options: Any,
) -> AnnotationIndex:
    """Read a dataset's annotations into an :class:`AnnotationIndex` (cached on disk).

    Args:
        path: a dataset folder (VOCdevkit, annotations/ + images/, XML beside images) or file.
        format: ``"auto"`` or a reader name (see :func:`available_formats`).
        on_error: ``"raise"`` | ``"skip"`` | ``"warn"``; see :mod:`detloader.validate`.
        classes: fixed class list (id order); other classes become ``unknown_class`` errors.
        class_map: ``{name_in_file: new_name}`` to rename or merge, ``{name: None}`` to drop.
        landmark_schema: a :class:`LandmarkSchema` or ordered names (flip pairs inferred).
        one_based: convert VOC's 1-based pixel indices (xmin, ymin minus 1).
        clip_boxes: clip partly-outside boxes (reported) instead of dropping them.
        check_images: check that image files exist.
        image_class_attribute: the image attribute that holds the image-level class.
        image_dir: image folder, when it is not where the layout says.
        max_file_bytes: size cap of one annotation file.
        workers: processes for the cold build (default: the usable CPUs).
        cache: True (use and write the cache), False (neither) or ``"rebuild"``.
        progress: ``progress(done_files, total_files)`` during a cold build.
        **format_options: options of one reader (see its module docstring).
    """
    check_on_error(on_error)
    if cache not in (True, False, "rebuild"):
        raise ValueError(f"cache={cache!r} is not one of True, False, 'rebuild'")
    p = Path(path)
    if not p.exists():
        raise FileNotFoundError(f"path={str(path)!r} does not exist")
    options = _make_options(
        classes,
        class_map,
        landmark_schema,
        one_based=one_based,
        clip_boxes=clip_boxes,
        check_images=check_images,
        image_class_attribute=image_class_attribute,
        image_dir=os.fspath(Path(image_dir).resolve()) if image_dir is not None else None,
        max_file_bytes=max_file_bytes,
        format_options=format_options,
    )
    name = detect_format(p) if format == "auto" else format
    if name not in READERS:
        raise ValueError(f"format={format!r} is not one of auto, {', '.join(READERS)}")
    reader = READERS[name]
    source: Source = reader.discover(p, options)
    options_json = json.dumps(options.to_json(), sort_keys=True)
    key = _content_key(name, options_json, source)

    cache_file = None
    if cache:
        # files beside each other in one folder (training.xml, testing.xml) get their own cache
        tag_text = options_json + (f"\0{p.name}" if p.is_file() else "")
        options_tag = hashlib.blake2b(tag_text.encode(), digest_size=8).hexdigest()
        cache_file = _cache.cache_dir_for(source.root) / f"{name}-{options_tag}.dlindex"
        if cache != "rebuild" and _cache.read_key(cache_file) == key:
            try:
                index = _cache.load_index_file(cache_file, root=source.root)
            except (OSError, _cache.CacheError):
                index = None
            if index is not None:
                apply_policy(index.problems, on_error, str(source.root))
                return index

    index = build_index(reader, source, options, workers=workers, progress=progress)
    if cache_file is not None:
        try:
            _cache.save_index(index, cache_file, key)
            index = _cache.load_index_file(cache_file, root=source.root)
        except OSError as err:
            warnings.warn(f"index cache not written to {cache_file}: {err}", RuntimeWarning, stacklevel=2)
    apply_policy(index.problems, on_error, str(source.root))
    return index


def _content_key(name: str, options_json: str, source: Source) -> str:
    h = hashlib.blake2b(digest_size=16)
    h.update(f"{READER_VERSION}\0{_cache.CACHE_VERSION}\0{name}\0{options_json}\0".encode())
    h.update(json.dumps(source.extra, sort_keys=True).encode())
    h.update("\n".join(f"{rel}\0{mtime}\0{size}" for rel, mtime, size in source.stamp).encode())
    return h.hexdigest()


def _parse_chunk(reader_name: str, source: Source, files: Sequence[str], options: ReadOptions) -> Partial:
    builder = ChunkBuilder(options)
    READERS[reader_name].parse(source, files, builder)
    return builder.finish()


def _chunks(files: Sequence[str], n_chunks: int) -> list[list[str]]:
    size = max(1, -(-len(files) // max(1, n_chunks)))
    return [list(files[i : i + size]) for i in range(0, len(files), size)]


def _default_landmarks(reader: ModuleType, source: Source, partials: Sequence[Partial]) -> LandmarkSchema | None:
    """The reader's ``default_landmarks(source, names)`` for the names found, else its
    ``DEFAULT_LANDMARKS``; :func:`merge` uses it when the names found fit it."""
    choose = getattr(reader, "default_landmarks", None)
    if choose is None:
        return getattr(reader, "DEFAULT_LANDMARKS", None)
    seen: dict[str, None] = {}
    for part in partials:
        for name in part.landmark_names:
            seen.setdefault(name, None)
    return choose(source, tuple(seen))


def build_index(
    reader: ModuleType,
    source: Source,
    options: ReadOptions,
    *,
    workers: int | None = None,
    progress: ProgressFn | None = None,
) -> AnnotationIndex:
    """Parse every file of ``source`` (in parallel when worthwhile) and merge, in file order."""
    files = source.files
    total = len(files)
    n_workers = usable_cpus() if workers is None else max(1, int(workers))
    parallel = getattr(reader, "PARALLEL", True)
    partials: list[Partial]
    if n_workers > 1 and parallel and total >= PARALLEL_MIN_FILES:
        chunks = _chunks(files, n_workers * 8)
        partials = [None] * len(chunks)  # type: ignore[list-item]
        done = 0
        methods = multiprocessing.get_all_start_methods()
        ctx = multiprocessing.get_context("forkserver" if "forkserver" in methods else "spawn")
        with ProcessPoolExecutor(max_workers=n_workers, mp_context=ctx) as pool:
            futures = {
                pool.submit(_parse_chunk, reader.NAME, source, chunk, options): i
                for i, chunk in enumerate(chunks)
            }
            from concurrent.futures import as_completed

            for fut in as_completed(futures):
                i = futures[fut]
                partials[i] = fut.result()
                done += len(chunks[i])
                if progress is not None:
                    progress(done, total)
    else:
        partials = []
        step = max(1, min(256, total // 20 or 1))
        for start in range(0, total, step):
            partials.append(_parse_chunk(reader.NAME, source, files[start : start + step], options))
            if progress is not None:
                progress(min(start + step, total), total)
    index = merge(
        partials,
        options,
        root=str(source.root),
        meta={"format": reader.NAME, "source": source.extra, "files": total},
        default_landmarks=_default_landmarks(reader, source, partials),
    )
    split_fn = getattr(reader, "splits", None)
    if split_fn is not None:
        index.splits = split_fn(source, index)
    return index
