"""Merge chunks (:class:`~detloader.annotations.builder.Partial`) in file order into one index.

The global vocabularies are fixed here (classes, image classes, attribute tables, landmark
schema), each chunk's local ids are remapped to them, field by field as
:data:`~detloader.annotations.fields.FIELDS` says (``Field.vocab``), and images annotated
more than once keep their first annotation.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from detloader.annotations.chunk import Partial
from detloader.annotations.fields import FIELDS, MISSING, OFFSETS, Field, pack_strings
from detloader.annotations.index import AnnotationIndex
from detloader.annotations.landmarks import LandmarkSchema, infer_flip_pairs
from detloader.annotations.options import ReadOptions
from detloader.annotations.problems import Problem, ProblemReport
from detloader.annotations.vocabulary import Vocabulary
from detloader.errors import ClassMapError

AttributeVocab = tuple[tuple[str, tuple[str, ...]], ...]


def natural_key(name: str) -> tuple[int, int, str]:
    """Sort key: numeric names by value ("2" before "10"), then the others by text."""
    return (0, int(name), "") if name.isdigit() else (1, 0, name)


def _lut(local: Sequence[str], global_ids: Mapping[str, int]) -> np.ndarray:
    """Lookup table local id -> global id, with a last slot so that MISSING maps to MISSING."""
    return np.asarray([global_ids[s] for s in local] + [MISSING], dtype=np.int32)


def _remap(values: np.ndarray, lut: np.ndarray) -> np.ndarray:
    return lut[values] if len(values) else values.astype(np.int32)


def _merge_attr_tables(
    parts: Sequence[tuple[np.ndarray, list[tuple[str, list[str]]]]], n_rows: int
) -> tuple[np.ndarray, AttributeVocab]:
    """One int32 ``[n_rows, A]`` table over the union of attributes (sorted) and values."""
    values: dict[str, set[str]] = {}
    for _, vocab in parts:
        for name, vals in vocab:
            values.setdefault(name, set()).update(vals)
    names = sorted(values)
    vocab = tuple((n, tuple(sorted(values[n]))) for n in names)
    col_of = {n: i for i, n in enumerate(names)}
    value_ids = {n: {v: i for i, v in enumerate(vals)} for n, vals in vocab}
    out = np.full((n_rows, len(names)), MISSING, dtype=np.int32)
    start = 0
    for table, local_vocab in parts:
        rows = len(table)
        for j, (name, vals) in enumerate(local_vocab):
            lut = _lut(vals, value_ids[name])
            out[start : start + rows, col_of[name]] = lut[table[:, j]]
        start += rows
    return out, vocab


def _classes(partials: Sequence[Partial], options: ReadOptions) -> tuple[str, ...]:
    if options.classes is not None:
        return tuple(options.classes)
    declared: dict[str, None] = {}
    for part in partials:
        for name in part.declared_classes:
            declared.setdefault(name, None)
    found = {c for part in partials for c in part.vocabs["classes"]}
    return tuple(declared) + tuple(sorted(found - set(declared), key=natural_key))


def check_class_map(partials: Sequence[Partial], options: ReadOptions) -> None:
    """Refuse ``class_map`` keys that match no class of any file (:class:`ClassMapError`).

    Checked once every file is read (a key may match a class of any file). A cached index
    needs no check of its own: it exists only for a class_map that passed here (the options,
    class_map included, are part of its key).
    """
    if not options.class_map:
        return
    found = {name for part in partials for name in part.file_classes}
    unmatched = [key for key, _ in options.class_map if key not in found]
    if unmatched:
        raise ClassMapError(unmatched, sorted(found, key=natural_key))


def _landmark_schema(
    partials: Sequence[Partial], options: ReadOptions, default: LandmarkSchema | None
) -> LandmarkSchema:
    if options.landmark_schema is not None:
        return options.landmark_schema
    seen: dict[str, None] = {}
    for part in partials:
        for name in part.landmark_names:
            seen.setdefault(name, None)
    names = tuple(seen)
    if default is not None and set(names) <= set(default.names) and names:
        return default
    return LandmarkSchema(names, infer_flip_pairs(names))


def _offsets(partials: Sequence[Partial], n: int) -> np.ndarray:
    offsets = np.zeros(n + 1, dtype=np.int64)
    img_start, obj_start = 0, 0
    for p in partials:
        count = len(p.arrays["width"])
        offsets[img_start + 1 : img_start + count + 1] = p.arrays[OFFSETS][1:] + obj_start
        img_start += count
        obj_start += len(p.arrays["boxes"])
    return offsets


def _concat(f: Field, parts: list[np.ndarray]) -> np.ndarray:
    if not parts:
        return np.zeros(f.shape(0, {}), dtype=f.dtype)
    return np.concatenate(parts).astype(f.dtype, copy=False)


def _landmark_field(f: Field, partials: Sequence[Partial], schema: LandmarkSchema, m: int) -> np.ndarray:
    """A per-point field (landmarks, visibility) with each chunk's slots moved to the schema's."""
    lm_ids = {name: i for i, name in enumerate(schema.names)}
    out = np.full(f.shape(m, {"landmarks": len(schema.names)}), f.fill, dtype=f.dtype)
    start = 0
    for p in partials:
        rows = len(p.arrays["boxes"])
        if p.landmark_names:
            cols = np.asarray([lm_ids[name] for name in p.landmark_names], dtype=np.int64)
            out[start : start + rows][:, cols] = p.arrays[f.name]
        start += rows
    return out


def _drop_duplicates(
    index: AnnotationIndex, problems: list[Problem], strings: Mapping[str, list[str]]
) -> AnnotationIndex:
    """Images annotated more than once keep their first annotation; the others are reported."""
    first_seen: dict[str, int] = {}
    duplicates: list[Problem] = []
    keep: list[int] = []
    annotation_paths = strings["annotation_paths"]
    for i, path in enumerate(strings["image_paths"]):
        j = first_seen.setdefault(path, i)
        if j == i:
            keep.append(i)
        else:
            duplicates.append(
                Problem(
                    "duplicate_image",
                    annotation_paths[i],
                    "filename",
                    f"image {path!r} is already annotated by {annotation_paths[j]}",
                    "annotation skipped",
                )
            )
    if duplicates:
        index = index.subset(keep)
        index.problems = ProblemReport(problems + duplicates)
    return index


def merge(
    partials: Sequence[Partial],
    options: ReadOptions,
    *,
    root: str,
    meta: Mapping[str, Any],
    default_landmarks: LandmarkSchema | None = None,
) -> AnnotationIndex:
    """Concatenate chunks (in file order) into one index with global vocabularies.

    Classes: ``options.classes`` when given; else the classes the files declare, in their
    order, then the other names found, sorted (numbers by value). Landmarks: ``options.landmark_schema``; else
    ``default_landmarks`` when every name found belongs to it (readers pass a declared or
    preset schema); else the names in order of first appearance, flip pairs by spelling.
    Images annotated more than once keep their first annotation; the others are reported as
    ``duplicate_image`` errors and dropped. ``class_map`` keys that match no class of any file
    are refused (:func:`check_class_map`).
    """
    check_class_map(partials, options)
    problems = [p for part in partials for p in part.problems]
    stats: dict[str, int] = {}
    for part in partials:
        for key, value in part.stats.items():
            stats[key] = stats.get(key, 0) + value
    schema = _landmark_schema(partials, options, default_landmarks)
    names: dict[str, Any] = {
        "classes": _classes(partials, options),
        "image_classes": tuple(
            sorted({c for part in partials for c in part.vocabs["image_classes"]}, key=natural_key)
        ),
    }
    n = sum(len(p.arrays["width"]) for p in partials)
    rows = {"image": n, "object": sum(len(p.arrays["boxes"]) for p in partials)}
    arrays: dict[str, np.ndarray] = {OFFSETS: _offsets(partials, n)}
    strings: dict[str, list[str]] = {}
    for f in FIELDS:
        if f.level == "string":
            strings[f.name] = [s for p in partials for s in p.strings[f.name]]
            arrays[f"{f.name}_blob"], arrays[f"{f.name}_offsets"] = pack_strings(strings[f.name])
        elif f.vocab == "landmarks":
            arrays[f.name] = _landmark_field(f, partials, schema, rows["object"])
        elif f.vocab in ("image_attributes", "object_attributes"):
            arrays[f.name], names[f.vocab] = _merge_attr_tables(
                [(p.arrays[f.name], p.vocabs[f.vocab]) for p in partials], rows[f.level]
            )
        elif f.vocab is not None:
            ids = {c: i for i, c in enumerate(names[f.vocab])}
            parts = [_remap(p.arrays[f.name], _lut(p.vocabs[f.vocab], ids)) for p in partials]
            arrays[f.name] = _concat(f, parts)
        else:
            arrays[f.name] = _concat(f, [p.arrays[f.name] for p in partials])
    vocab = Vocabulary(
        classes=names["classes"],
        image_classes=names["image_classes"],
        object_attributes=names["object_attributes"],
        image_attributes=names["image_attributes"],
        landmarks=schema,
    )
    index = AnnotationIndex(
        root=root,
        arrays=arrays,
        vocab=vocab,
        problems=ProblemReport(problems),
        meta={**meta, "stats": stats},
    )
    return _drop_duplicates(index, problems, strings)
