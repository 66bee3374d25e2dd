"""The record transforms work on (:class:`Annotated`), the transform contract, composition,
and the parameter checks the transform classes share. Two optional attributes of a transform
tell the dataset how small a JPEG may be decoded: ``preserves_size = True`` (flips, colour:
look past it) and ``min_input_size(width, height)`` (a resize: decode at least this large).
A third, ``draws = False`` in a class's own body, says its transforms never draw from the
generator (:func:`draws`).
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

import numpy as np

from detloader.annotations.index import AnnotationIndex
from detloader.annotations.landmarks import ClassFlip, LandmarkSchema
from detloader.errors import DetloaderTypeError, DetloaderValueError, FlipPairWarning
from detloader.transforms.functional import (
    INTERPOLATIONS,
    Interpolation,
    affine_boxes,
    affine_points,
    clip_boxes,
    clip_points,
    compose_affine,
    crop_boxes,
    crop_image,
    invalidate_outside,
    resize_image,
)


@dataclass(eq=False)
class Annotated:
    """One image and its objects while transforms run (the caller owns every array).

    Attributes:
        image: uint8 ``[H, W, 3]`` RGB; any strides (a kernel may return a view).
        boxes: float32 ``[N, 4]`` xyxy pixels.
        labels: int64 ``[N]``.
        landmarks: float32 ``[N, K, 2]`` (x, y) pixels.
        visibility: uint8 ``[N, K]``: 0 absent, 1 hidden, 2 visible.
        object_ids: int64 ``[N]``: which input object each row is (rows are dropped by crops).
        affine: float64 ``[4]`` ``(sx, sy, ox, oy)``: annotation frame -> current image. After
            a map that is not axis-aligned (rotation, shear) ``ox, oy`` are NaN (no such map
            back) and ``sx, sy`` its overall scale ``sqrt|det|``, ``sx < 0`` when it mirrors.
        flip_permutation: int64 ``[K]`` from the landmark schema, or None when unknown.
        class_flip: what a mirror does to the labels (:class:`ClassFlip`: mirror classes swap,
            an image holding a one-sided class is not mirrored); None: labels have no side.
    """

    image: np.ndarray
    boxes: np.ndarray
    labels: np.ndarray
    landmarks: np.ndarray
    visibility: np.ndarray
    object_ids: np.ndarray
    affine: np.ndarray = field(default_factory=lambda: np.array([1.0, 1.0, 0.0, 0.0]))
    flip_permutation: np.ndarray | None = None
    class_flip: ClassFlip | None = None

    @classmethod
    def create(
        cls,
        image: np.ndarray,
        boxes: np.ndarray | Sequence[Sequence[float]] | None = None,
        labels: np.ndarray | Sequence[int] | None = None,
        landmarks: np.ndarray | None = None,
        visibility: np.ndarray | None = None,
        *,
        schema: LandmarkSchema | None = None,
        class_flip: ClassFlip | None = None,
    ) -> Annotated:
        """Build from loose arrays (copies them): the entry point when used without a
        :class:`~detloader.dataset.DetectionDataset`. Missing visibility means 2 (visible)."""
        image = np.asarray(image)
        if image.dtype != np.uint8 or image.ndim != 3 or image.shape[2] != 3:
            raise DetloaderValueError(f"image: dtype={image.dtype}, shape={image.shape}; expected uint8 [H, W, 3]")
        b = np.array(boxes if boxes is not None else np.zeros((0, 4)), dtype=np.float32)
        b = b.reshape(-1, 4)
        n = len(b)
        lab = np.array(labels if labels is not None else np.zeros(n), dtype=np.int64).reshape(-1)
        k = len(schema) if schema is not None else 0
        if landmarks is None:
            lm = np.zeros((n, k, 2), dtype=np.float32)
        else:
            lm = np.array(landmarks, dtype=np.float32)
            if lm.ndim != 3 or lm.shape[0] != n or lm.shape[2] != 2:
                raise DetloaderValueError(f"landmarks: shape {lm.shape}, expected [N={n}, K, 2]")
        k = lm.shape[1]
        if visibility is None:
            vis = np.full((n, k), 2, dtype=np.uint8)
        else:
            vis = np.array(visibility, dtype=np.uint8).reshape(n, k)
        if len(lab) != n:
            raise DetloaderValueError(f"labels: {len(lab)} values for {n} boxes")
        if schema is not None and len(schema) != k:
            raise DetloaderValueError(f"landmarks: K={k} points but the schema has {len(schema)} names")
        lm[vis == 0] = 0.0
        perm = schema.flip_permutation() if schema is not None else None
        return cls(image, b, lab, lm, vis, np.arange(n, dtype=np.int64), flip_permutation=perm, class_flip=class_flip)

    @property
    def width(self) -> int:
        return int(self.image.shape[1])

    @property
    def height(self) -> int:
        return int(self.image.shape[0])

    def mirrored_labels(self) -> np.ndarray | None:
        """The labels after a horizontal mirror (mirror classes swapped), or None when an object's
        class is one-sided and the image must not be mirrored (:class:`ClassFlip`)."""
        return self.labels if self.class_flip is None else self.class_flip.mirror(self.labels)

    def select(self, keep: np.ndarray) -> None:
        """Keep only the objects where ``keep`` (bool ``[N]``) is True, in place."""
        if keep.all():
            return
        self.boxes = self.boxes[keep]
        self.labels = self.labels[keep]
        self.landmarks = self.landmarks[keep]
        self.visibility = self.visibility[keep]
        self.object_ids = self.object_ids[keep]

    def crop(self, x0: int, y0: int, width: int, height: int, min_visibility: float, fill: int = 0) -> None:
        """Cut the ``width x height`` window at ``(x0, y0)`` out, in place (parts outside the
        image are ``fill``): boxes keeping less than ``min_visibility`` of their area are
        dropped with their labels and landmarks, kept boxes are clipped, landmarks outside get
        visibility 0 (never clipped onto the border)."""
        self.image = crop_image(self.image, x0, y0, width, height, fill)
        boxes, keep = crop_boxes(self.boxes, x0, y0, width, height, min_visibility)
        points = affine_points(self.landmarks, self.visibility, 1.0, 1.0, -float(x0), -float(y0))
        self.landmarks, self.visibility = invalidate_outside(points, self.visibility, width, height)
        self.boxes = boxes
        self.select(keep)
        self.affine = compose_affine(self.affine, 1.0, 1.0, -float(x0), -float(y0))

    def resize(self, width: int, height: int, interpolation: Interpolation = "bilinear") -> None:
        """Resize the image to ``width x height`` and map the annotations exactly, in place."""
        w, h = self.width, self.height
        self.image = resize_image(self.image, width, height, interpolation)
        self.map_annotations(width / w, height / h, 0.0, 0.0)

    def map_annotations(self, sx: float, sy: float, ox: float, oy: float) -> None:
        """Apply ``x' = x * sx + ox``, ``y' = y * sy + oy`` to boxes and landmarks (the image
        is the caller's business) and record it in :attr:`affine`. Clips the result into the
        current image size, which only corrects float rounding for maps that keep the image
        inside itself."""
        identity = sx == 1.0 and sy == 1.0 and ox == 0.0 and oy == 0.0
        if not identity:
            self.affine = compose_affine(self.affine, sx, sy, ox, oy)
        # the identity (a decode at the annotated size, the usual case) only clips, without the
        # float64 round trip of the map (same values for boxes with x1 <= x2, which an index
        # always holds); no boxes or no landmarks: nothing to map (a third of a sample's time)
        if len(self.boxes):
            boxes = self.boxes if identity else affine_boxes(self.boxes, sx, sy, ox, oy)
            self.boxes = clip_boxes(boxes, self.width, self.height)
        if self.landmarks.size:
            points = self.landmarks if identity else affine_points(self.landmarks, self.visibility, sx, sy, ox, oy)
            self.landmarks, self.visibility = clip_points(points, self.visibility, self.width, self.height)


@runtime_checkable
class Transform(Protocol):
    """What :class:`DetectionDataset` accepts as ``transform``."""

    def __call__(self, data: Annotated, rng: np.random.Generator) -> Annotated: ...


class Compose:
    """Apply ``transforms`` in order, all drawing from the same generator."""

    def __init__(self, transforms: Sequence[Callable[[Annotated, np.random.Generator], Annotated]]) -> None:
        self.transforms = tuple(transforms)
        for t in self.transforms:
            if not callable(t):
                raise DetloaderTypeError(f"transforms: {t!r} is not callable")

    @property
    def preserves_size(self) -> bool:
        return all(getattr(t, "preserves_size", False) for t in self.transforms)

    def __call__(self, data: Annotated, rng: np.random.Generator) -> Annotated:
        for t in self.transforms:
            data = t(data, rng)
        return data

    def min_input_size(self, width: int, height: int) -> tuple[int, int] | None:
        """The first size-changing transform's :meth:`Resize.min_input_size` (transforms that
        keep the size, such as flips and colour, are skipped); None when unknown."""
        return min_input_size(self.transforms, width, height)

    def __repr__(self) -> str:
        inner = ",\n    ".join(repr(t) for t in self.transforms)
        return f"Compose([\n    {inner}\n])"


def check_output(data: Any, transform: object) -> None:
    """ValueError / TypeError naming ``transform`` unless ``data`` is an :class:`Annotated` with a
    uint8 ``[H, W, 3]`` image and as many labels, landmark rows and object ids as boxes."""
    if not isinstance(data, Annotated):
        raise DetloaderTypeError(f"transform {transform!r} returned {type(data).__name__}, not Annotated")
    image = data.image
    if not (isinstance(image, np.ndarray) and image.dtype == np.uint8 and image.ndim == 3 and image.shape[2] == 3):
        raise DetloaderValueError(
            f"transform {transform!r} returned an image of type {type(image).__name__}, "
            f"dtype={getattr(image, 'dtype', None)}, shape={getattr(image, 'shape', None)}; "
            "expected numpy uint8 [H, W, 3]"
        )
    n = len(data.boxes)
    if not (len(data.labels) == len(data.landmarks) == len(data.visibility) == len(data.object_ids) == n):
        raise DetloaderValueError(
            f"transform {transform!r} returned {n} boxes but {len(data.labels)} labels, "
            f"{len(data.landmarks)} landmark rows, {len(data.object_ids)} object ids"
        )


def draws(transform: object) -> bool:
    """Whether ``transform`` may draw from the generator it is given: False only for a
    :class:`Compose` of such transforms or a transform whose own class (not a parent) says
    ``draws = False`` (:class:`~detloader.transforms.Resize`: a subclass may draw). The dataset
    then makes no generator for it (``default_rng`` is a tenth of a sample's Python work) and
    passes None."""
    if type(transform) is Compose:
        return any(draws(t) for t in transform.transforms)
    return vars(type(transform)).get("draws", True) is not False


def may_mirror(transform: object) -> bool:
    """Whether ``transform`` (a :class:`Compose` looked into) can mirror an image: a transform
    says so with a true ``mirrors`` attribute (flips with ``p > 0``, ``RandomAffine(mirror > 0)``,
    an albumentations pipeline holding a flip)."""
    if isinstance(transform, Compose):
        return any(may_mirror(t) for t in transform.transforms)
    return bool(getattr(transform, "mirrors", False))


def mirror_maps(
    index: AnnotationIndex,
    transform: object,
    flip_pairs: Sequence[tuple[str | int, str | int]] | None = None,
    class_flip_pairs: Sequence[tuple[str | int, str | int]] | None = None,
) -> tuple[np.ndarray, ClassFlip]:
    """What a mirror of ``index``'s images does (:attr:`Annotated.flip_permutation`,
    :attr:`Annotated.class_flip`): the landmark slot permutation (``flip_pairs`` in place of the
    schema's) and the class map (``class_flip_pairs`` in place of the pairs in the names). When
    ``transform`` can mirror (:func:`may_mirror`), doubtful pairs, points without any pair and
    one-sided classes are each warned once (:class:`~detloader.errors.FlipPairWarning`)."""
    schema = index.landmark_schema
    if flip_pairs is not None:
        schema = LandmarkSchema.from_names(schema.names, flip_pairs)
    class_flip = ClassFlip.resolve(index.classes, class_flip_pairs)
    mirrors = may_mirror(transform)
    permutation = schema.flip_permutation(warn=mirrors)
    problem = class_flip.problem(index.labels, index.object_image, len(index)) if mirrors else None
    if problem is not None:
        warnings.warn(FlipPairWarning("class_partner_missing", problem), stacklevel=3)
    return permutation, class_flip


def min_input_size(transforms: Sequence[object], width: int, height: int) -> tuple[int, int] | None:
    """How small an image of ``width x height`` may be decoded for ``transforms`` without
    losing output detail; None when no transform says (decode at full size)."""
    for t in transforms:
        if getattr(t, "preserves_size", False):
            continue
        hint = getattr(t, "min_input_size", None)
        return hint(width, height) if hint is not None else None
    return None


# -- parameter checks shared by the transform classes ----------------------------------------
def size_pair(name: str, size: int | Sequence[int]) -> tuple[int, int]:
    """``size`` (an int or (width, height)) as a positive (width, height); ValueError names
    ``name``."""
    if isinstance(size, (int, np.integer)):
        w = h = int(size)
    else:
        if len(size) != 2:
            raise DetloaderValueError(f"{name}={size!r} must be an int or (width, height)")
        w, h = int(size[0]), int(size[1])
    if w < 1 or h < 1:
        raise DetloaderValueError(f"{name}={size!r} must be positive")
    return w, h


def check_interpolation(interpolation: str) -> None:
    """ValueError unless ``interpolation`` is one of :data:`INTERPOLATIONS`."""
    if interpolation not in INTERPOLATIONS:
        raise DetloaderValueError(f"interpolation={interpolation!r} is not one of {', '.join(INTERPOLATIONS)}")


def check_fraction(name: str, value: float) -> None:
    """ValueError naming ``name`` unless ``value`` is in [0, 1]."""
    if not 0.0 <= value <= 1.0:
        raise DetloaderValueError(f"{name}={value!r} must be in [0, 1]")
