"""Parse every annotation file of a source, in parallel when worthwhile, and merge in file order.

Many-file formats are cut into chunks, each parsed by a :class:`ChunkBuilder` in a worker
process; the partial indexes are merged in file order, so the result does not depend on the
number of workers.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from types import ModuleType

from detloader._pool import run_in_processes
from detloader._system import usable_cpus
from detloader.annotations.builder import ChunkBuilder
from detloader.annotations.chunk import Partial
from detloader.annotations.index import AnnotationIndex
from detloader.annotations.landmarks import LandmarkSchema
from detloader.annotations.merge import merge
from detloader.annotations.options import ReadOptions
from detloader.annotations.problems import ProblemReport
from detloader.annotations.readers import READERS
from detloader.annotations.readers.common import Source
from detloader.annotations.splits import settle_splits

#: Below this many files the index is built in this process (a pool costs more than it saves).
PARALLEL_MIN_FILES = 512
ProgressFn = Callable[[int, int], None]


def _parse_chunk(reader_name: str, source: Source, files: Sequence[str], options: ReadOptions) -> Partial:
    builder = ChunkBuilder(options)
    reader = READERS[reader_name]
    for rel in files:
        try:
            reader.parse(source, [rel], builder)
        except Exception as err:  # last resort: a reader gap costs one file, never the read
            builder.problem(
                "reader_error", "", f"{type(err).__name__}: {err}", "rest of the file skipped", file=builder.file or rel
            )
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
    missing_names: list[str] | None = None,
) -> AnnotationIndex:
    """Parse every file of ``source`` (in parallel when worthwhile) and merge, in file order;
    the problems found before parsing (``source.problems``, the reader's ``unannotated``)
    go first; then settle the splits (:func:`~detloader.annotations.splits.settle_splits`).
    ``missing_names``, when given, receives the first names of images not found (per chunk)."""
    files = source.files
    total = len(files)
    n_workers = usable_cpus() if workers is None else max(1, int(workers))
    parallel = getattr(reader, "PARALLEL", True)
    partials: list[Partial]
    if n_workers > 1 and parallel and total >= PARALLEL_MIN_FILES:
        chunks = _chunks(files, n_workers * 8)
        partials = [None] * len(chunks)  # type: ignore[list-item]
        done = 0
        calls = [(reader.NAME, source, chunk, options) for chunk in chunks]
        for i, partial in run_in_processes(_parse_chunk, calls, n_workers):
            partials[i] = partial
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
    if missing_names is not None:
        for part in partials:
            missing_names.extend(part.missing_names)
    index = merge(
        partials,
        options,
        root=str(source.root),
        meta={"format": reader.NAME, "source": source.extra, "files": total},
        default_landmarks=_default_landmarks(reader, source, partials),
    )
    listed = getattr(reader, "unannotated", None)  # an image folder apart: its images without annotations
    found = dict.fromkeys([*source.problems, *(listed(source, index, options) if listed else ())])  # once each
    index.problems = ProblemReport([*found, *index.problems])
    split_fn = getattr(reader, "splits", None)
    found = split_fn(source, index) if split_fn is not None else {}
    settle_splits(index, found, source.files[0] if len(source.files) == 1 else reader.NAME)
    return index

