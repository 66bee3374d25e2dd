"""The rules every format shares, as pure functions: a value in, a repaired value or a finding
out; and :class:`ReadOptions`, the options of ``read_annotations`` that tune them.

:class:`~detloader.annotations.builder.ChunkBuilder` applies them to each record and turns a
:class:`Finding` into a :class:`~detloader.annotations.problems.Problem` by adding the file and
the element. Boxes are xyxy in pixels (see :mod:`detloader.annotations.index`); landmark
visibility is 0 absent, 1 hidden, 2 visible.
"""

from __future__ import annotations

import dataclasses
import math
from array import array
from collections.abc import Sequence
from dataclasses import dataclass
from numbers import Integral
from typing import Any, NamedTuple

from detloader.annotations.landmarks import LandmarkSchema
from detloader.annotations.problems import Severity, check_choice
from detloader.errors import DetloaderValueError

#: The largest image side stored (the index keeps sizes as int32).
MAX_SIDE = 2**31 - 1

Box = tuple[float, float, float, float]
Point = tuple[float, float, int]

#: What an object with landmarks but no box becomes (``read_annotations(boxes_from_points=)``):
#: boxed by its points' extent, boxed by the whole image, or skipped.
BOXES_FROM_POINTS: tuple[str, ...] = ("enclose", "image", "skip")
#: The smallest side, in pixels, of a box made from points: one point, or points on a line,
#: get this side (centred on them, kept inside the image) where their extent is shorter.
POINTS_BOX_MIN_SIDE = 1.0


class Finding(NamedTuple):
    """What a rule found: problem kind, message (``field=value``), action taken, severity."""

    kind: str
    message: str
    action: str
    severity: Severity = "error"


def fmt(v: float) -> str:
    """A coordinate as messages show it (``%g``)."""
    return f"{v:g}"


def parse_number(value: Any, fieldname: str, action: str, *, text: bool = True) -> float | Finding:
    """``value`` as a float, or a ``missing_field`` / ``bad_value`` finding.

    ``text=True``: ``value`` is text from XML or a txt line (``None`` or blank is missing; the
    message shows it stripped). ``text=False``: a JSON value (``None`` is missing; booleans,
    lists, objects and blank strings are bad values, shown as given).
    """
    if value is None or (text and not value.strip()):
        return Finding("missing_field", f"{fieldname} is missing", action)
    if not text and (isinstance(value, bool) or not isinstance(value, (int, float, str))):
        return Finding("bad_value", f"{fieldname}={value!r} is not a number", action)
    try:
        return float(value)
    except (ValueError, OverflowError):  # OverflowError: an int beyond float range
        shown = value.strip() if text else value
        return Finding("bad_value", f"{fieldname}={shown!r} is not a number", action)


def check_size(width: Any, height: Any) -> Finding | None:
    """An image needs integer ``0 < width, height <= MAX_SIDE`` (else it is skipped)."""
    if all(isinstance(v, Integral) and not isinstance(v, bool) and 0 < v <= MAX_SIDE for v in (width, height)):
        return None
    return Finding("bad_value", f"width={width!r} height={height!r}", "image skipped")


def check_box(box: Any, width: int, height: int, *, one_based: bool, clip: bool) -> tuple[Box | None, Finding | None]:
    """The box to store (float32, inside the image) or None when it is rejected, and what was found.

    ``one_based`` subtracts 1 from xmin and ymin first. Checked as float32 (two close float64 values
    can round to one). A box partly outside the image is clipped (``box_clipped``) when ``clip``,
    else rejected (``box_outside_image``).
    """
    try:
        x1, y1, x2, y2 = (float(v) for v in box)
    except (TypeError, ValueError, OverflowError):
        return None, Finding("bad_value", f"box={tuple(box)!r} is not four numbers", "object skipped")
    if one_based:
        x1, y1 = x1 - 1.0, y1 - 1.0
    x1, y1, x2, y2 = array("f", (x1, y1, x2, y2))
    if not all(math.isfinite(v) for v in (x1, y1, x2, y2)):
        msg = f"xmin={fmt(x1)} ymin={fmt(y1)} xmax={fmt(x2)} ymax={fmt(y2)}"
        return None, Finding("non_finite", msg, "object skipped")
    if x2 <= x1 or y2 <= y1:
        msg = f"xmax={fmt(x2)} <= xmin={fmt(x1)}" if x2 <= x1 else f"ymax={fmt(y2)} <= ymin={fmt(y1)}"
        return None, Finding("empty_box", msg, "object skipped")
    if x1 < 0 or y1 < 0 or x2 > width or y2 > height:
        desc = f"box ({fmt(x1)}, {fmt(y1)}, {fmt(x2)}, {fmt(y2)}) outside image width={width} height={height}"
        cx1, cy1, cx2, cy2 = max(x1, 0.0), max(y1, 0.0), min(x2, float(width)), min(y2, float(height))
        if cx2 <= cx1 or cy2 <= cy1 or not clip:
            return None, Finding("box_outside_image", desc, "object skipped")
        return (cx1, cy1, cx2, cy2), Finding("box_clipped", desc, "clipped to the image", "repaired")
    return (x1, y1, x2, y2), None


def check_point(
    name: str, x: float, y: float, v: int, width: int, height: int, *, one_based: bool
) -> tuple[Point | None, Finding | None]:
    """The landmark to store as ``(x, y, visibility)`` or None when it is skipped, and what was
    found. Visibility 0 stores ``(0, 0, 0)``; a point outside ``[0, width] x [0, height]`` is
    kept with visibility 0 (``landmark_outside_image``); ``one_based`` subtracts 1 from x, y."""
    if v not in (0, 1, 2):
        return None, Finding("bad_value", f"visibility={v} is not 0, 1 or 2", "point skipped")
    v = int(v)
    if v == 0:
        return (0.0, 0.0, 0), None
    if not (math.isfinite(x) and math.isfinite(y)):
        return None, Finding("non_finite", f"{name}: x={fmt(x)} y={fmt(y)}", "point skipped")
    if one_based:
        x, y = x - 1.0, y - 1.0
    if not (0.0 <= x <= width and 0.0 <= y <= height):
        msg = f"{name}: x={fmt(x)} y={fmt(y)} outside image width={width} height={height}"
        return (0.0, 0.0, 0), Finding("landmark_outside_image", msg, "point kept with visibility 0")
    return (float(x), float(y), v), None


def _span(lo: float, hi: float, limit: float) -> tuple[float, float]:
    """``[lo, hi]`` widened to at least ``POINTS_BOX_MIN_SIDE`` about its centre, inside ``[0, limit]``."""
    if hi - lo >= POINTS_BOX_MIN_SIDE:
        return lo, hi
    side = min(POINTS_BOX_MIN_SIDE, limit)
    start = min(max((lo + hi) / 2 - side / 2, 0.0), limit - side)
    return start, start + side


def box_from_points(points: Sequence[tuple[float, float]], width: int, height: int, mode: str) -> Box | None:
    """The box of an object that has landmarks but no box, or None when there is nothing to box.

    ``points`` are its labelled points (already inside the image). ``mode="enclose"``: their
    enclosing box, each side at least :data:`POINTS_BOX_MIN_SIDE`, inside the image;
    ``mode="image"``: the whole image (docs/formats.md, "Points without boxes").
    """
    if mode == "image":
        return (0.0, 0.0, float(width), float(height))
    if mode != "enclose":
        raise DetloaderValueError(f"boxes_from_points={mode!r} is not one of {', '.join(BOXES_FROM_POINTS)}")
    if not points:
        return None
    xs, ys = zip(*points)
    x1, x2 = _span(min(xs), max(xs), float(width))
    y1, y2 = _span(min(ys), max(ys), float(height))
    return (x1, y1, x2, y2)


#: Size cap of one annotation file (``max_file_bytes``), against files made to exhaust memory.
MAX_FILE_BYTES = 16 * 1024 * 1024


@dataclass(frozen=True)
class ReadOptions:
    """The options of :func:`~detloader.annotations.read.read_annotations` of the same names, as
    hashable values (``image_dir`` absolute); ``extra`` holds the format options (:meth:`option`).
    Every field takes part in the cache key (:meth:`to_json`)."""

    classes: tuple[str, ...] | None = None
    class_map: tuple[tuple[str, str | None], ...] = ()
    landmark_schema: LandmarkSchema | None = None
    one_based: bool = False
    clip_boxes: bool = True
    check_images: bool = True
    image_class_attribute: str = "class"
    max_file_bytes: int = MAX_FILE_BYTES
    image_dir: str | None = None
    allow_outside_images: bool = False
    boxes_from_points: str = "enclose"
    extra: tuple[tuple[str, Any], ...] = ()

    def __post_init__(self) -> None:
        check_choice("boxes_from_points", self.boxes_from_points, BOXES_FROM_POINTS)

    def option(self, name: str, default: Any = None) -> Any:
        """A format-specific option passed through ``read_annotations(..., **format_options)``."""
        return dict(self.extra).get(name, default)

    def to_json(self) -> dict[str, Any]:
        """Every field as JSON (the cache key holds it); format options by their ``repr``."""
        return {**dataclasses.asdict(self), "extra": [[k, repr(v)] for k, v in self.extra]}
