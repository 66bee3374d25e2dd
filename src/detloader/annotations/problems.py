"""Problems found while reading annotations, and what to do about them.

A :class:`Problem` names the file, the element and the bad value; it is an *error* (the item is
dropped, or the read fails under ``on_error="raise"``) or a *repair* (the item was fixed and
kept). The policies and the report: docs/index.md ("Validation").
"""

from __future__ import annotations

import difflib
import warnings
from collections import Counter
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import asdict, dataclass
from typing import Any, Literal

import numpy as np

from detloader.errors import AnnotationError, AnnotationWarning, DetloaderValueError

OnError = Literal["raise", "skip", "warn"]
ON_ERROR_CHOICES: tuple[str, ...] = ("raise", "skip", "warn")

Severity = Literal["error", "repaired"]


@dataclass(frozen=True)
class Problem:
    """One thing wrong with the input.

    Attributes:
        kind: a short stable name (``empty_box``, ``missing_image``, ...), see :data:`KINDS`.
        file: the annotation file, relative to the dataset root when possible.
        element: where in the file (``object[2]/bndbox``, ``size``, ``line 14``); may be empty.
        message: what is wrong, with the bad value (``xmax=10 <= xmin=12``).
        action: what was done (``object skipped``, ``image skipped``, ``clipped to the image``).
        severity: ``"error"`` (dropped or fatal) or ``"repaired"`` (fixed and kept).
    """

    kind: str
    file: str
    element: str
    message: str
    action: str = ""
    severity: Severity = "error"

    def __str__(self) -> str:
        where = f"{self.file}: {self.element}: " if self.element else f"{self.file}: "
        tail = f" ({self.action})" if self.action else ""
        return f"{where}{self.message}{tail}"

    def to_dict(self) -> dict[str, str]:
        return asdict(self)


#: The kinds of problem the readers (and ``detloader validate``'s image checks) report, with
#: a one-line description.
KINDS: dict[str, str] = {
    "unreadable_file": "the annotation file cannot be read",
    "not_a_regular_file": "a FIFO, socket or device where an annotation or image file was expected; never opened",
    "symlink_loop": "a link to a folder already read (or one that loops); not followed",
    "link_outside_dataset": "a folder link that leads out of the dataset; not followed (nothing below it read) "
    "unless allow_outside_images=True (--allow-outside-images)",
    "file_too_large": "the annotation or image file is larger than its size cap, refused before reading",
    "unsafe_xml": "DTD, entity declaration or external reference refused",
    "unparseable": "the file is not well-formed XML / JSON / text",
    "bad_value": "a field holds a value of the wrong type or out of range",
    "missing_field": "a required element or field is absent",
    "missing_size": "image size missing or zero in the annotation; read from the image header",
    "size_mismatch": "image size in the annotation differs from the image file",
    "missing_image": "the image file named by the annotation does not exist",
    "unannotated_image": "an image in the image folder without an annotation file (VOC: left out; YOLO: background)",
    "unreadable_image": "the image file cannot be read, is 0 bytes, is not an image or does not decode",
    "too_many_pixels": "the image header declares more pixels than the cap (max_pixels)",
    "images_found_elsewhere": "the layout's image folder lacks the images; they were read from the folder found",
    "duplicate_image": "the same image is annotated by more than one file or record",
    "duplicate_object": "a COCO annotation id repeats an earlier one's: a copy of that object is skipped, another "
    "object kept",
    "non_finite": "a coordinate is NaN or infinite",
    "empty_box": "box with xmax <= xmin or ymax <= ymin",
    "box_outside_image": "box lies (partly) outside the image",
    "box_clipped": "box partly outside the image, clipped to it",
    "box_from_points": "object with landmarks and no box: boxed by its points, by the image, or "
    "skipped (boxes_from_points=); reported once per file",
    "box_from_segment": "YOLO lines of x y pairs without kpt_shape (segments, or keypoints whose kpt_shape is "
    "missing): boxed by the extent of their points; reported once per file",
    "unknown_class": "class not in the given class list",
    "landmark_outside_image": "landmark outside the image; kept with visibility 0",
    "unknown_landmark": "landmark name not in the landmark schema",
    "landmark_count": "number of landmark coordinates does not match the schema",
    "unsupported": "a construct this reader does not understand",
    "split_mismatch": "a split file (or splits.json) names an image that is not in the index; left out",
    "split_bad_line": "a split file line that is not one image id (it holds whitespace); skipped",
    "split_duplicate": "a split file names the same image twice; counted once",
    "split_overlap": "images in two of the train / val / test splits; kept in the first of test, train, val, "
    "removed from the other (one problem per pair of splits, with the count)",
    "split_unassigned": "images outside the train/ val/ test/ folders that split the others; in no split",
    "split_nested": "images below two split folders of different roles (train/test/); in the shallowest one's split",
    "outside_dataset": "an image path leaves the dataset (absolute or ../); not followed",
    "reader_error": "a value the reader did not foresee; the rest of that file is skipped",
}


#: What to try, shown under a kind in :meth:`ProblemReport.summary` (and in an
#: :class:`AnnotationError`) once it occurs :data:`HINT_MIN` times.
HINTS: dict[str, str] = {
    "missing_image": "images elsewhere? pass image_dir= (detloader --image-dir DIR, relative to the "
    "dataset root); CVAT images renamed to their id? images_by='id' (--images-by id)",
}
HINT_MIN = 3


class ProblemReport:
    """All problems of one read, in file order, with counts per kind and first examples."""

    def __init__(self, problems: Iterable[Problem] = ()) -> None:
        self._problems: list[Problem] = list(problems)

    def __len__(self) -> int:
        return len(self._problems)

    def add(self, problem: Problem) -> None:
        self._problems.append(problem)

    def __iter__(self) -> Iterator[Problem]:
        return iter(self._problems)

    def __bool__(self) -> bool:
        return bool(self._problems)

    def __repr__(self) -> str:
        return f"ProblemReport({self.summary_line() or 'no problems'})"

    @property
    def errors(self) -> list[Problem]:
        return [p for p in self._problems if p.severity == "error"]

    @property
    def repairs(self) -> list[Problem]:
        return [p for p in self._problems if p.severity == "repaired"]

    def counts(self) -> dict[str, int]:
        """Problem kind -> number of occurrences, most frequent first."""
        return dict(Counter(p.kind for p in self._problems).most_common())

    def examples(self, per_kind: int = 3) -> dict[str, list[str]]:
        """Problem kind -> the first ``per_kind`` problems as text."""
        out: dict[str, list[str]] = {}
        for p in self._problems:
            bucket = out.setdefault(p.kind, [])
            if len(bucket) < per_kind:
                bucket.append(str(p))
        return out

    def summary_line(self) -> str:
        return ", ".join(f"{kind}: {n}" for kind, n in self.counts().items())

    def summary(self, per_kind: int = 3) -> str:
        """Several lines: counts per kind, the first ``per_kind`` examples of each, and how many
        more of it there are."""
        if not self._problems:
            return "no problems"
        lines = [f"{len(self._problems)} problems ({len(self.errors)} errors): {self.summary_line()}"]
        hints, counts = self.hints(), self.counts()
        for kind, examples in self.examples(per_kind).items():
            lines.append(f"  {kind}:")
            lines.extend(f"    {e}" for e in examples)
            if counts[kind] > len(examples):
                lines.append(f"    ... and {counts[kind] - len(examples)} more ({counts[kind]} in all)")
            if kind in hints:
                lines.append(f"    hint: {hints[kind]}")
        return "\n".join(lines)

    def hints(self) -> dict[str, str]:
        """Problem kind -> what to try (:data:`HINTS`), for the kinds found often enough."""
        counts = self.counts()
        return {kind: hint for kind, hint in HINTS.items() if counts.get(kind, 0) >= HINT_MIN}

    def to_list(self) -> list[dict[str, str]]:
        return [p.to_dict() for p in self._problems]

    @classmethod
    def from_list(cls, items: Iterable[dict[str, str]]) -> ProblemReport:
        return cls(Problem(**item) for item in items)  # type: ignore[arg-type]


def problems_of(
    kind: str, found: list[tuple[str, str, str]], action: str, severity: Severity = "repaired"
) -> list[Problem]:
    """``found`` (file, element, message) as problems of ``kind``, every one of them (a report
    counts what it holds, so it holds all; the CLI shortens what it prints)."""
    return [Problem(kind, file, element, message, action, severity) for file, element, message in found]


def check_int(name: str, value: Any, minimum: int, hint: str = "") -> int:
    """``int(value)``; raises ``"{name}={value!r} must be an int >= {minimum}"`` (plus ``hint``)
    for a bool, a non-integer or a value below ``minimum``."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < minimum:
        raise DetloaderValueError(f"{name}={value!r} must be an int >= {minimum}{hint}")
    return int(value)


def check_choice(name: str, value: Any, choices: Sequence[Any]) -> None:
    """ValueError echoing ``name=value``, the valid ``choices`` and the closest of them:
    ``--balance='sqr' is not one of inverse, sqrt, ...; did you mean 'sqrt'?``."""
    if value not in choices:
        raise DetloaderValueError(
            f"{name}={value!r} is not one of {', '.join(map(str, choices))}{did_you_mean(value, choices)}"
        )


def did_you_mean(value: Any, choices: Sequence[Any]) -> str:
    """``"; did you mean 'sqrt'?"`` for the closest of ``choices`` to ``value``, or ``""``."""
    close = difflib.get_close_matches(str(value), [str(c) for c in choices], n=1)
    return f"; did you mean {close[0]!r}?" if close else ""


def check_on_error(on_error: str) -> OnError:
    """Return ``on_error`` if it is a valid policy, else raise a ValueError naming the choices."""
    check_choice("on_error", on_error, ON_ERROR_CHOICES)
    return on_error  # type: ignore[return-value]


def apply_policy(report: ProblemReport, on_error: OnError, what: str = "annotations", stacklevel: int = 3) -> None:
    """Raise or warn about ``report`` according to ``on_error``; see the module docstring.
    ``stacklevel``: as ``warnings.warn`` takes it, from here (3: the caller of this one's caller)."""
    check_on_error(on_error)
    errors = report.errors
    if on_error == "raise" and errors:
        raise AnnotationError(errors[0], report)
    if on_error == "warn" and report:
        warnings.warn(f"{what}: {report.summary(per_kind=2)}", AnnotationWarning, stacklevel=stacklevel)


