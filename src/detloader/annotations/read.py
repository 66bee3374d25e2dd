"""``read_annotations``: find the format, use the cached index when it is current, otherwise
parse (:mod:`detloader.annotations.parse`), cache (:mod:`detloader.annotations.cache`) and
apply the error policy (:mod:`detloader.annotations.problems`).
"""

from __future__ import annotations

import hashlib
import json
import os
import warnings
from pathlib import Path
from typing import Any, Mapping, Sequence

from detloader.annotations import cache as _cache
from detloader.annotations.builder import ReadOptions
from detloader.annotations.index import AnnotationIndex
from detloader.annotations.landmarks import LandmarkSchema
from detloader.annotations.parse import ProgressFn, build_index
from detloader.annotations.problems import OnError, apply_policy, check_on_error
from detloader.annotations.readers import READERS
from detloader.annotations.readers.common import Source

#: Bumped when what a reader produces changes, so that old caches are rebuilt.
READER_VERSION = 2


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
    allow_outside_images: bool = False,
    boxes_from_points: str = "enclose",
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
        on_error: ``"raise"`` | ``"skip"`` | ``"warn"``; see :mod:`detloader.annotations.problems`.
        classes: fixed class list (id order); other classes become ``unknown_class`` errors.
        class_map: ``{name_in_file: new_name}`` to rename or merge, ``{name: None}`` to drop;
            a key that matches no class of any file is refused (:class:`ClassMapError`).
        landmark_schema: a :class:`LandmarkSchema` or ordered names (flip pairs inferred).
        one_based: convert VOC's 1-based pixel indices (xmin, ymin minus 1).
        clip_boxes: clip partly-outside boxes (reported) instead of dropping them.
        check_images: check that image files exist.
        image_class_attribute: the image attribute that holds the image-level class.
        image_dir: image folder, when it is not where the layout says.
        allow_outside_images: follow image names that leave the dataset (``../``, absolute);
            by default they are ``outside_dataset`` problems (docs/reliability.md).
        boxes_from_points: what an object with landmarks but no box becomes: ``"enclose"``
            (boxed by its labelled points), ``"image"`` (boxed by the whole image) or
            ``"skip"``; reported once per file (``box_from_points``, docs/formats.md).
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
        allow_outside_images=bool(allow_outside_images),
        boxes_from_points=boxes_from_points,
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
        try:
            cache_file = _cache.cache_dir_for(source.root) / f"{name}-{options_tag}.dlindex"
        except OSError as err:  # neither the dataset folder nor the user cache can be written
            warnings.warn(f"{source.root}: reading without an index cache ({err})", RuntimeWarning, stacklevel=2)
        if cache_file is not None and cache != "rebuild" and cache_file.exists():
            index = None
            try:
                if _cache.read_key(cache_file, strict=True) == key:
                    index = _cache.load_index_file(cache_file, root=source.root)
            except (OSError, _cache.CacheError) as err:  # damaged: never used, rebuilt
                warnings.warn(f"{err}; rebuilding the index cache", RuntimeWarning, stacklevel=2)
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

__all__ = ["READER_VERSION", "available_formats", "detect_format", "read_annotations"]
