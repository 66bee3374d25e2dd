"""Every error and warning detloader raises, in one family.

``except detloader.DetloaderError`` catches anything the library raises on purpose; each error
also keeps the builtin base callers caught before (``ValueError``, ``KeyError``, ``OSError``, ...),
so ``except ValueError`` still works. Warnings derive from :class:`DetloaderWarning`, so one
``warnings.filterwarnings("ignore", category=DetloaderWarning)`` silences them all.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable
from typing import Any, Protocol


class _Problem(Protocol):
    """What :class:`AnnotationError` reads of a ``detloader.annotations.problems.Problem`` (the
    error family sits below the stages and imports none of them)."""

    kind: str


class _Report(Protocol):
    """What :class:`AnnotationError` reads of a ``ProblemReport``."""

    @property
    def errors(self) -> list[Any]: ...

    def summary_line(self) -> str: ...

    def hints(self) -> dict[str, str]: ...

__all__ = [
    "DetloaderError", "DetloaderWarning", "DetloaderRuntimeWarning", "DetloaderValueError",
    "DetloaderTypeError", "DetloaderIndexError", "DetloaderKeyError",
    "DetloaderFileNotFoundError", "MissingExtraError", "AnnotationError", "ClassMapError",
    "UnsafeXMLError", "YoloConfigError", "CacheError", "SplitNotFoundError", "SplitsExistError",
    "EmptyIndexError", "AnnotationWarning", "ImageFolderWarning", "FlipPairWarning",
    "YoloExportWarning", "NotRegularFileError", "FileTooLargeError", "DiskFullError",
    "ImageDecodeError", "StoreTooLargeError", "TuneWarning", "StaleTuneWarning", "RunDirError",
    "DataMismatchError", "CheckpointError", "NonFiniteError", "NonFiniteLossError", "NonFiniteWeightsError",
    "PredictionError", "RectBatchError", "ModelLabelsError", "ResumeSettingsError", "LoaderWorkerError", "PackError",
    "StreamError", "StreamCacheLimitError",
]


class DetloaderError(Exception):
    """The base of every error detloader raises."""


class DetloaderWarning(UserWarning):
    """The base of every warning detloader gives."""


class DetloaderRuntimeWarning(DetloaderWarning, RuntimeWarning):
    """Something at run time went a slower or weaker way (a cache rebuilt or not written, a
    damaged image decoded anyway, a store rebuilt); the work goes on."""


class DetloaderValueError(DetloaderError, ValueError):
    """An argument or a value read from a file that detloader cannot use; the message names it."""


class DetloaderTypeError(DetloaderError, TypeError):
    """An argument of the wrong type; the message names it and the type given."""


class DetloaderIndexError(DetloaderError, IndexError):
    """An image or object index out of range."""


class DetloaderKeyError(DetloaderError, KeyError):
    """A name (split, attribute) the dataset lacks. Its text is the sentence itself, not
    KeyError's quoted repr."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""


class DetloaderFileNotFoundError(DetloaderError, FileNotFoundError):
    """A path given to detloader that does not exist."""


class MissingExtraError(DetloaderError, ImportError):
    """An optional dependency is not installed; the message names the extra that brings it."""


# -- annotations ----------------------------------------------------------------------------


class AnnotationError(DetloaderValueError):
    """Bad annotation input. ``str(err)`` names the file, the element or field and the value.

    ``err.problem`` is the problem that raised, ``err.report`` all problems found in the read
    (when the error comes from a whole read, otherwise ``None``).
    """

    def __init__(self, problem: _Problem, report: _Report | None = None) -> None:
        message = str(problem)
        if report is not None and len(report.errors) > 1:
            message += f" (and {len(report.errors) - 1} more errors: {report.summary_line()})"
        if report is not None and problem.kind in report.hints():
            message += f"; hint: {report.hints()[problem.kind]}"
        super().__init__(message)
        self.problem = problem
        self.report = report

    def __reduce__(self) -> tuple[Any, ...]:  # keep it picklable across worker processes
        return (AnnotationError, (self.problem, self.report))


class ClassMapError(DetloaderValueError):
    """``class_map`` keys that match no class found in the files (a typo would rename or drop
    nothing). ``str(err)`` names each key, a close match when there is one, and the classes
    found; ``err.keys`` holds the keys, ``err.classes`` the classes found."""

    #: classes named in the message at most (the count of the rest follows)
    SHOWN = 40

    def __init__(self, keys: Iterable[str], classes: Iterable[str]) -> None:
        self.keys = tuple(keys)
        self.classes = tuple(classes)
        parts = []
        for key in self.keys:
            close = difflib.get_close_matches(key, self.classes, n=1)
            parts.append(f"{key!r} (did you mean {close[0]!r}?)" if close else repr(key))
        shown = ", ".join(repr(c) for c in self.classes[: self.SHOWN]) or "none"
        if len(self.classes) > self.SHOWN:
            shown += f", ... ({len(self.classes)} in all)"
        super().__init__(f"class_map: {', '.join(parts)} matches no class in the files; classes found: {shown}")

    def __reduce__(self) -> tuple[Any, ...]:
        return (ClassMapError, (self.keys, self.classes))


class UnsafeXMLError(DetloaderValueError):
    """The document declares entities or references external resources."""


class YoloConfigError(DetloaderValueError):
    """A ``data.yaml`` that cannot be used; names the file, the key and the value."""


class RectBatchError(DetloaderValueError):
    """``rect=True`` (one letterbox shape per batch of the dataset's own order) asked of a loader
    whose sampler reorders the images, so that a batch would mix shapes; names the shapes."""


class ModelLabelsError(DetloaderValueError):
    """A model whose classes (``config.num_labels``, named ``config.id2label``) are not the
    dataset's: names both and the config that fits."""


class CacheError(DetloaderValueError):
    """A cache file that cannot be used (wrong magic, version, checksum, or truncated)."""


class SplitNotFoundError(DetloaderKeyError):
    """A split the dataset lacks (still a KeyError: callers that catch one still do)."""


class SplitsExistError(DetloaderValueError):
    """:func:`make_splits` refused: the dataset has train / val / test splits already."""


class EmptyIndexError(DetloaderValueError):
    """The index holds no images: there is nothing to count or balance."""


class AnnotationWarning(DetloaderWarning):
    """Problems in the annotations that were skipped or repaired (``on_error="warn"``)."""


class ImageFolderWarning(AnnotationWarning):
    """The images were not where the layout says; they were read from the folder found."""


class FlipPairWarning(DetloaderWarning):
    """A doubtful left/right flip pair; ``kind`` is a key of ``landmarks.FLIP_PROBLEMS``."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(f"{message} [{kind}]")
        self.kind = kind


class YoloExportWarning(DetloaderWarning):
    """data.yaml lacks a key Ultralytics needs (``train``, ``val``: the index has no such split),
    or leaves out a split it cannot name (``trainval``)."""


# -- files and images -----------------------------------------------------------------------


class NotRegularFileError(DetloaderError, OSError):
    """A path that is a FIFO, socket, device or folder where a file was expected."""


class FileTooLargeError(DetloaderValueError):
    """A file over its size cap; the message names its size and the cap."""


class DiskFullError(DetloaderError, OSError):
    """A write that failed for want of space (``ENOSPC``) or quota (``EDQUOT``); the message
    names the file and the space left. ``errno`` is the original one."""


class ImageDecodeError(DetloaderValueError):
    """An image file that cannot be decoded; the message names the file and the reason (and,
    from a dataset, its index and :attr:`HINT`). Raised in a loader worker, it reaches the main
    process as itself, with the worker's message and without its traceback."""

    #: What to do, as a dataset's decode errors end.
    HINT = (
        'skip such images with on_decode_error="skip" (detloader train --on-decode-error skip), '
        "or list them all with detloader validate PATH --decode"
    )


class RankLostError(DetloaderError, RuntimeError):
    """Another process of a distributed training run ended (killed, out of memory) while this
    one waited on it in a collective: ``str(err)`` names this rank, the lost one (with two
    ranks; "another rank" with more), what the backend said, and the last checkpoint saved.
    ``err.rank``, ``err.world_size``."""

    def __init__(self, message: str, rank: int, world_size: int) -> None:
        super().__init__(message)
        self.rank, self.world_size = rank, world_size

    def __reduce__(self) -> tuple[Any, ...]:
        return (RankLostError, (str(self), self.rank, self.world_size))


class LoaderWorkerError(DetloaderError, RuntimeError):
    """A DataLoader worker process died: killed by a signal (SIGKILL from the out-of-memory
    killer, SIGBUS for want of shared memory) or exited without a word. ``str(err)`` names the
    worker, its pid, the signal or exit code and what to try; every other worker of the loader
    has been ended. ``err.worker_id`` (torch's 0-based id, None when unknown), ``err.pid``,
    ``err.signal`` (a number, or None) and ``err.exitcode`` (None when killed by a signal)."""

    def __init__(self, message: str, worker_id: int | None, pid: int, signal: int | None, exitcode: int | None) -> None:
        super().__init__(message)
        self.worker_id, self.pid, self.signal, self.exitcode = worker_id, pid, signal, exitcode

    def __reduce__(self) -> tuple[Any, ...]:
        return (LoaderWorkerError, (str(self), self.worker_id, self.pid, self.signal, self.exitcode))


class StoreTooLargeError(DetloaderValueError):
    """The store would not fit in the free disk space or memory; names both figures."""


# -- packs on an object store ---------------------------------------------------------------


class PackError(DetloaderValueError):
    """A pack that cannot be written or read: an image that cannot be read while packing, a
    manifest written by another pack version (``str(err)`` names the detloader that wrote it),
    a damaged manifest or packed index; the message names the file, the field and the value."""


class StreamError(DetloaderError, OSError):
    """A file of a pack (a shard, the packed index, the manifest) that cannot be had whole: its
    download failed after every retry (the server gone, a timeout, a refused request), or its
    bytes do not match the size and hash the manifest records. Nothing of it is served or left
    in the cache. ``str(err)`` names the URL, the file and what to try; ``err.url`` (the pack's
    URL or folder) and ``err.file`` (the file's name in the pack) hold them."""

    def __init__(self, message: str, url: str = "", file: str = "") -> None:
        super().__init__(message)
        self.url, self.file = url, file

    def __str__(self) -> str:  # OSError's own text would be its errno fields
        return str(self.args[0]) if self.args else ""

    def __reduce__(self) -> tuple[Any, ...]:
        return (StreamError, (str(self), self.url, self.file))


class StreamCacheLimitError(DetloaderValueError):
    """A pack's shard cache whose byte limit cannot hold what it must: a shard bigger than the
    limit, or the shard asked for beside those other processes of the node are reading.
    ``str(err)`` names the limit, the bytes needed and what to try."""


# -- tuning and training --------------------------------------------------------------------


class TuneWarning(DetloaderWarning):
    """Loader settings come from the heuristic, not from a measurement."""


class StaleTuneWarning(TuneWarning):
    """The cached tuning result was measured under another load than the machine has now
    (see :mod:`detloader.tune.saved`)."""


class RunDirError(DetloaderValueError):
    """``out`` holds another run, or another training is writing it."""


class DataMismatchError(DetloaderValueError):
    """A checkpoint is resumed (or evaluated) on data other than its own."""


class ResumeSettingsError(DetloaderValueError):
    """A resume with settings other than the checkpoint's that would change the run (batch size,
    input size, sampling, augmentation...) or cannot change (the model's width): the message names
    each setting, both values and how to proceed (``--allow-setting-change`` where it may)."""


class CheckpointError(DetloaderValueError):
    """A checkpoint file that cannot be read: ``str(err)`` names the file, what is wrong, and
    the previous checkpoint when one beside it loads."""


class NonFiniteError(DetloaderError, RuntimeError):
    """Training produced a NaN or an infinity; the run stops (``detloader train`` exits with 3)
    and nothing non-finite is written: the last checkpoint saved before stays as it was."""


class NonFiniteLossError(NonFiniteError):
    """A loss term went NaN or infinite: ``str(err)`` names the step, the epoch, each such term
    with its value, and what to try (a lower learning rate, more warm-up, AMP off, the data).
    ``err.step`` is the step that failed (1-based, as ``StepInfo.global_step``), ``err.terms``
    the non-finite terms and their values (``{"rank 1: heatmap": nan}`` under DDP when another
    rank found them)."""

    def __init__(self, message: str, step: int, terms: dict[str, float]) -> None:
        super().__init__(message)
        self.step = step
        self.terms = dict(terms)

    def __reduce__(self) -> tuple[Any, ...]:
        return (NonFiniteLossError, (str(self), self.step, self.terms))


class NonFiniteWeightsError(NonFiniteError):
    """A checkpoint would hold NaN or infinite weights (model or optimiser state): it is not
    written. ``str(err)`` names the tensors and the step; ``err.tensors`` lists their names."""

    def __init__(self, message: str, tensors: list[str]) -> None:
        super().__init__(message)
        self.tensors = list(tensors)

    def __reduce__(self) -> tuple[Any, ...]:
        return (NonFiniteWeightsError, (str(self), self.tensors))


class PredictionError(DetloaderValueError):
    """A prediction that cannot be scored: ``str(err)`` names the image, the value (a class or
    image id the dataset does not have, a box with NaN, a score outside [0, 1]) and what to do."""
