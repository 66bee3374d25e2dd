"""Parse every annotation file of a source, in parallel when worthwhile, and merge in file order.

Many-file formats are cut into chunks, each parsed by a :class:`ChunkBuilder` in a worker
process; the chunks (:class:`~detloader.annotations.builder.Partial`) are merged in file order
(:func:`merge`), so the result does not depend on the number of workers. Merging fixes the
global vocabularies (classes, image classes, attribute tables, landmark schema), remaps each
chunk's local ids to them, field by field as :data:`~detloader.annotations.fields.FIELDS` says
(``Field.vocab``), and keeps the first annotation of an image annotated more than once.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from detloader._system import usable_cpus
from detloader._system.pool import run_in_processes
from detloader.annotations.builder import ChunkBuilder, Partial
from detloader.annotations.checks import ReadOptions
from detloader.annotations.fields import FIELDS, MISSING, OFFSETS, Field, Vocabulary, packed_names
from detloader.annotations.index import AnnotationIndex
from detloader.annotations.landmarks import LandmarkSchema, infer_flip_pairs
from detloader.annotations.problems import Problem, ProblemReport
from detloader.annotations.readers import READERS
from detloader.annotations.readers.common import Reader, Source
from detloader.annotations.splits import settle_splits
from detloader.errors import ClassMapError

#: Below this many files the index is built in this process (a pool costs more than it saves).
PARALLEL_MIN_FILES = 512
ProgressFn = Callable[[int, int], None]


def _parse_chunk(reader_name: str, source: Source, files: Sequence[str], options: ReadOptions) -> Partial:
    builder = ChunkBuilder(options)
    reader = READERS[reader_name]
    for rel in files:
        builder.begin_file(rel)
        try:
            reader.parse_file(source, rel, builder)
        except Exception as err:  # last resort: a reader gap costs one file, never the read
            message = f"{type(err).__name__}: {err}"
            builder.problem("reader_error", "", message, "rest of the file skipped", file=builder.file or rel)
    return builder.finish()


def _chunks(files: Sequence[str], n_chunks: int) -> list[list[str]]:
    size = max(1, -(-len(files) // max(1, n_chunks)))
    return [list(files[i : i + size]) for i in range(0, len(files), size)]


def _landmark_names(partials: Sequence[Partial]) -> tuple[str, ...]:
    """The landmark names found, in order of first appearance."""
    return tuple(dict.fromkeys(name for part in partials for name in part.landmark_names))


def build_index(
    reader: Reader,
    source: Source,
    options: ReadOptions,
    *,
    workers: int | None = None,
    progress: ProgressFn | None = None,
    missing_names: list[str] | None = None,
) -> AnnotationIndex:
    """Parse every file of ``source`` (in parallel when worthwhile) and merge, in file order;
    the problems found before parsing (``source.problems``, the reader's ``unannotated``)
    go first; then settle the splits (:func:`~detloader.annotations.splits.settle_splits`).
    ``missing_names``, when given, receives the first names of images not found (per chunk)."""
    files = source.files
    total = len(files)
    n_workers = usable_cpus() if workers is None else max(1, int(workers))
    partials: list[Partial]
    if n_workers > 1 and reader.parallel and total >= PARALLEL_MIN_FILES:
        chunks = _chunks(files, n_workers * 8)
        partials = [None] * len(chunks)  # type: ignore[list-item]
        done = 0
        # each call carries the source without its file list and stamps (no parse reads them):
        # 100,000 stamps pickled per chunk were a fifth of a full build's CPU
        slim = dataclasses.replace(source, files=[], stamp=[], image_listing=None, file_listing=None)
        calls = [(reader.name, slim, chunk, options) for chunk in chunks]
        for i, partial in run_in_processes(_parse_chunk, calls, n_workers):
            partials[i] = partial
            done += len(chunks[i])
            if progress is not None:
                progress(done, total)
    else:
        partials = []
        step = max(1, min(256, total // 20 or 1))
        for start in range(0, total, step):
            partials.append(_parse_chunk(reader.name, source, files[start : start + step], options))
            if progress is not None:
                progress(min(start + step, total), total)
    if missing_names is not None:
        missing_names.extend(name for part in partials for name in part.missing_names)
    return assemble(reader, source, options, partials)


def assemble(reader: Reader, source: Source, options: ReadOptions, partials: Sequence[Partial]) -> AnnotationIndex:
    """The index of ``partials`` (every file of ``source``, in file order): merged, with the problems
    found before parsing first, then the splits settled. ``meta["parsed_problems"]``: the slice of
    ``index.problems`` that the files' parsing gave (what a refresh keeps of unchanged files)."""
    index = merge(
        partials,
        options,
        root=str(source.root),
        meta={"format": reader.name, "source": source.facts(), "files": len(source.files)},
        default_landmarks=reader.default_landmarks(source, _landmark_names(partials)),
    )
    found = dict.fromkeys([*source.problems, *reader.unannotated(source, index, options)])  # once each
    index.problems = ProblemReport([*found, *index.problems])
    index.meta["parsed_problems"] = [len(found), len(found) + sum(len(part.problems) for part in partials)]
    settle_splits(index, reader.splits(source, index), source.files[0] if len(source.files) == 1 else reader.name)
    return index


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
    declared = dict.fromkeys(name for part in partials for name in part.declared_classes)
    found = {c for part in partials for c in part.vocabs["classes"]}
    return tuple(declared) + tuple(sorted(found - set(declared), key=natural_key))


def check_class_map(partials: Sequence[Partial], options: ReadOptions) -> None:
    """Refuse ``class_map`` keys that match no class of any file (:class:`ClassMapError`). A cached
    index needs no check: its key holds the class_map that passed here.
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
    names = _landmark_names(partials)
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


def _class_list(f: Field, partials: Sequence[Partial], class_ids: Mapping[str, int], n: int) -> dict[str, np.ndarray]:
    """A class list field's two arrays over every chunk: class ids remapped to the global
    classes, each image's sorted again (the chunks' order was by local id)."""
    data_name, offsets_name = packed_names(f)
    values = [_remap(p.arrays[data_name], _lut(p.vocabs["classes"], class_ids)) for p in partials]
    offsets = np.zeros(n + 1, dtype=np.int64)
    start = 0
    for p in partials:
        local = p.arrays[offsets_name]
        offsets[start + 1 : start + len(local)] = local[1:] + offsets[start]
        start += len(local) - 1
    classes = _concat(f, values)
    rows = np.repeat(np.arange(n, dtype=np.int64), np.diff(offsets))
    return {data_name: classes[np.lexsort((classes, rows))], offsets_name: offsets}


def _frequency(partials: Sequence[Partial], classes: Sequence[str], problems: list[Problem]) -> dict[str, str | None]:
    """Class name -> LVIS frequency group as the files declare it (None: not declared); a class
    given two different groups gets none, with a ``bad_value`` problem naming both files."""
    first: dict[str, tuple[str | None, str]] = {}
    clashing: set[str] = set()
    for part in partials:
        for name, letter, file in part.class_frequency:
            seen = first.setdefault(name, (letter, file))
            if seen[0] != letter and name not in clashing:
                clashing.add(name)
                message = f"class {name!r}: frequency={letter!r}, but {seen[1]} gives frequency={seen[0]!r}"
                problem = Problem("bad_value", file, "categories/frequency", message, "class in no frequency group")
                problems.append(problem)
    return {c: None if c in clashing else first.get(c, (None, ""))[0] for c in classes}


def _drop_duplicates(index: AnnotationIndex, problems: list[Problem]) -> AnnotationIndex:
    """Images annotated more than once keep their first annotation; the others are reported."""
    paths = index.image_paths()
    if len(set(paths)) == len(paths):  # none: one set, no loop
        return index
    first_seen: dict[str, int] = {}
    duplicates: list[Problem] = []
    keep: list[int] = []
    annotation_paths = index.annotation_paths()
    for i, path in enumerate(paths):
        j = first_seen.setdefault(path, i)
        if j == i:
            keep.append(i)
        else:
            message = f"image {path!r} is already annotated by {annotation_paths[j]}"
            problem = Problem("duplicate_image", annotation_paths[i], "filename", message, "annotation skipped")
            duplicates.append(problem)
    index = index.subset(keep)
    index.problems = ProblemReport(problems + duplicates)
    return index


def _concat_strings(f: Field, partials: Sequence[Partial]) -> dict[str, np.ndarray]:
    """A string field's blob and offsets over every chunk (the chunks' blobs joined, no string unpacked)."""
    data_name, offsets_name = packed_names(f)
    offsets = np.zeros(sum(len(p.arrays[offsets_name]) - 1 for p in partials) + 1, dtype=np.int64)
    start, size = 0, 0
    for p in partials:
        local = p.arrays[offsets_name]
        offsets[start + 1 : start + len(local)] = local[1:] + size
        start, size = start + len(local) - 1, size + int(local[-1])
    blobs = [p.arrays[data_name] for p in partials]
    return {data_name: np.concatenate(blobs) if blobs else np.zeros(0, np.uint8), offsets_name: offsets}


def merge(
    partials: Sequence[Partial],
    options: ReadOptions,
    *,
    root: str,
    meta: Mapping[str, Any],
    default_landmarks: LandmarkSchema | None = None,
) -> AnnotationIndex:
    """Concatenate chunks (in file order) into one index with global vocabularies.

    Classes: ``options.classes`` when given; else the classes the files declare, in their order,
    then the other names found, sorted (numbers by value); their ids: the files' own when every
    class has one (COCO), else 1..C. Image ids: the files' own, else the 1-based row. Landmarks:
    ``options.landmark_schema``, else ``default_landmarks`` when every name found belongs to it,
    else the names in order of first appearance. An image annotated again is a ``duplicate_image``
    error, the first kept. Class lists: remapped to the global classes; ``meta["frequency"]``
    (class -> LVIS frequency group) when a file declares one.
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
    for f in FIELDS:
        if f.level == "string":
            arrays.update(_concat_strings(f, partials))
        elif f.level == "list":
            arrays.update(_class_list(f, partials, {c: i for i, c in enumerate(names["classes"])}, n))
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
        class_ids=_class_ids(partials, names["classes"]),
    )
    extra = {}
    if any(part.class_frequency for part in partials):
        extra["frequency"] = _frequency(partials, names["classes"], problems)
    index = AnnotationIndex(
        root=root, arrays=arrays, vocab=vocab, problems=ProblemReport(problems), meta={**meta, "stats": stats, **extra}
    )
    index = _drop_duplicates(index, problems)
    ids = index.image_ids
    unnumbered = ids == MISSING
    if unnumbered.any():  # a format without image ids: the 1-based row
        ids[unnumbered] = np.flatnonzero(unnumbered) + 1
    return index


def _class_ids(partials: Sequence[Partial], classes: Sequence[str]) -> tuple[int, ...]:
    """The files' own id of each class (COCO category ids) when every class has one and no two
    share one; else 1..C."""
    declared: dict[str, int] = {}
    for part in partials:
        for name, cid in part.declared_class_ids.items():
            declared.setdefault(name, cid)
    ids = tuple(declared.get(name, MISSING) for name in classes)
    return ids if MISSING not in ids and len(set(ids)) == len(ids) else tuple(range(1, len(classes) + 1))
