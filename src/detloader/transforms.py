"""Geometry and colour on an image and its boxes, landmarks and visibility together.

Two layers, as albumentations does it:

* **kernels**: pure numpy functions of arrays and numbers (``resize_image``,
  ``affine_boxes``, ``hflip_landmarks``, ``crop_boxes``, ``adjust_colour`` ...). They never
  modify their inputs and know nothing about randomness.
* **transforms**: small classes that hold parameters, draw their random numbers from the
  ``numpy.random.Generator`` they are given, and call kernels: :class:`Resize`,
  :class:`RandomHorizontalFlip`, :class:`RandomCrop`, :class:`RandomResizedCrop`,
  :class:`ColorJitter`, :class:`Compose`. A transform is called as
  ``transform(data, rng) -> data`` on an :class:`Annotated`.

Coordinates (the index's convention): continuous pixel coordinates, pixel ``i`` covers
``[i, i + 1)``; boxes are float32 ``xyxy``; a ``W x H`` image spans ``[0, W] x [0, H]``. A
horizontal flip maps ``x -> W - x`` for box corners and landmarks alike, and swaps the
left/right landmark slots with ``LandmarkSchema.flip_permutation()``. Every transform here is
axis-aligned, so the map from annotation coordinates to output coordinates stays
``x' = x * sx + ox``, ``y' = y * sy + oy`` (``sx < 0`` after a flip); :attr:`Annotated.affine`
accumulates it so that predictions can be mapped back.

Guarantees after any transform of this module: boxes lie inside ``[0, W] x [0, H]`` with
positive width and height; every landmark with visibility > 0 lies inside the image; every
landmark with visibility 0 has coordinates (0, 0). A crop drops the boxes that keep less than
``min_visibility`` of their area, with their landmarks and labels; landmarks of kept objects
that leave the image get visibility 0.

Randomness: a transform uses only the generator passed to it. :class:`DetectionDataset`
derives one per sample from ``(seed, epoch, index)``, which makes batches identical whatever
the number of DataLoader workers.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable, Literal, Protocol, Sequence, runtime_checkable

import numpy as np

if TYPE_CHECKING:  # torch is imported where a kernel needs it, not for `import transforms`
    import torch

from detloader.index import LandmarkSchema

Interpolation = Literal["bilinear", "nearest"]
INTERPOLATIONS: tuple[str, ...] = ("bilinear", "nearest")
ResizeMode = Literal["fixed", "shorter", "longer", "letterbox"]
RESIZE_MODES: tuple[str, ...] = ("fixed", "shorter", "longer", "letterbox")
#: Landmarks may sit this far (pixels) outside the image after a scale: float rounding.
_ROUNDING = 1e-3


# =============================================================================================
# The record transforms work on
# =============================================================================================
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
        affine: float64 ``[4]`` ``(sx, sy, ox, oy)``: annotation frame -> current image.
        flip_permutation: int64 ``[K]`` from the landmark schema, or None when unknown.
    """

    image: np.ndarray
    boxes: np.ndarray
    labels: np.ndarray
    landmarks: np.ndarray
    visibility: np.ndarray
    object_ids: np.ndarray
    affine: np.ndarray = field(default_factory=lambda: np.array([1.0, 1.0, 0.0, 0.0]))
    flip_permutation: np.ndarray | None = None

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
    ) -> "Annotated":
        """Build from loose arrays (copies them): the entry point when used without a
        :class:`~detloader.dataset.DetectionDataset`. Missing visibility means 2 (visible)."""
        image = np.asarray(image)
        if image.dtype != np.uint8 or image.ndim != 3 or image.shape[2] != 3:
            raise ValueError(
                f"image: dtype={image.dtype}, shape={image.shape}; expected uint8 [H, W, 3]"
            )
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
                raise ValueError(f"landmarks: shape {lm.shape}, expected [N={n}, K, 2]")
        k = lm.shape[1]
        if visibility is None:
            vis = np.full((n, k), 2, dtype=np.uint8)
        else:
            vis = np.array(visibility, dtype=np.uint8).reshape(n, k)
        if len(lab) != n:
            raise ValueError(f"labels: {len(lab)} values for {n} boxes")
        if schema is not None and len(schema) != k:
            raise ValueError(f"landmarks: K={k} points but the schema has {len(schema)} names")
        lm[vis == 0] = 0.0
        perm = schema.flip_permutation() if schema is not None else None
        return cls(image, b, lab, lm, vis, np.arange(n, dtype=np.int64), flip_permutation=perm)

    @property
    def width(self) -> int:
        return int(self.image.shape[1])

    @property
    def height(self) -> int:
        return int(self.image.shape[0])

    def select(self, keep: np.ndarray) -> None:
        """Keep only the objects where ``keep`` (bool ``[N]``) is True, in place."""
        if keep.all():
            return
        self.boxes = self.boxes[keep]
        self.labels = self.labels[keep]
        self.landmarks = self.landmarks[keep]
        self.visibility = self.visibility[keep]
        self.object_ids = self.object_ids[keep]

    def map_annotations(self, sx: float, sy: float, ox: float, oy: float) -> None:
        """Apply ``x' = x * sx + ox``, ``y' = y * sy + oy`` to boxes and landmarks (the image
        is the caller's business) and record it in :attr:`affine`. Clips the result into the
        current image size, which only corrects float rounding for maps that keep the image
        inside itself."""
        self.boxes = clip_boxes(affine_boxes(self.boxes, sx, sy, ox, oy), self.width, self.height)
        points = affine_points(self.landmarks, self.visibility, sx, sy, ox, oy)
        self.landmarks, self.visibility = clip_points(
            points, self.visibility, self.width, self.height
        )
        a = self.affine
        self.affine = np.array([a[0] * sx, a[1] * sy, a[2] * sx + ox, a[3] * sy + oy])


@runtime_checkable
class Transform(Protocol):
    """What :class:`DetectionDataset` accepts as ``transform``."""

    def __call__(self, data: Annotated, rng: np.random.Generator) -> Annotated: ...


# =============================================================================================
# Kernels: pure functions on arrays
# =============================================================================================
def _torch_view(image: np.ndarray) -> "torch.Tensor":
    """``[1, 3, H, W]`` tensor over ``image``'s memory (copied only if strides are negative or
    the array is read-only, which torch cannot wrap)."""
    import torch

    if any(s < 0 for s in image.strides) or not image.flags.writeable:
        image = np.ascontiguousarray(image) if image.flags.writeable else image.copy()
    return torch.from_numpy(image).permute(2, 0, 1).unsqueeze(0)


def resize_image(
    image: np.ndarray, width: int, height: int, interpolation: Interpolation = "bilinear"
) -> np.ndarray:
    """``image`` (uint8 ``[H, W, 3]``) resized to ``[height, width, 3]``.

    Bilinear, pixel-centre aligned, so that ``x -> x * width / W`` maps coordinates exactly.
    Shrinking by less than 2x is plain bilinear (as OpenCV's ``INTER_LINEAR``, the usual
    choice in detection pipelines); shrinking more is antialiased (as Pillow does), which is
    rare here because JPEGs that shrink 2x or more are already reduced while decoding. Runs
    on torch's vectorised uint8 kernel (2-3x faster than Pillow); the result is an
    ``[H, W, 3]`` view of channel-first memory, which the Dataset turns into a CHW tensor
    without a copy.
    """
    h, w = image.shape[:2]
    if (w, h) == (width, height):
        return image
    if width < 1 or height < 1:
        raise ValueError(f"resize_image: width={width}, height={height} must be >= 1")
    import torch.nn.functional as F

    x = _torch_view(image)
    if interpolation == "nearest":
        out = F.interpolate(x, size=(height, width), mode="nearest-exact")
    else:
        antialias = width * 2 < w or height * 2 < h
        out = F.interpolate(
            x, size=(height, width), mode="bilinear", align_corners=False, antialias=antialias
        )
    return out[0].permute(1, 2, 0).numpy()


def affine_boxes(boxes: np.ndarray, sx: float, sy: float, ox: float, oy: float) -> np.ndarray:
    """float32 ``[N, 4]`` xyxy boxes under ``x' = x*sx + ox``, ``y' = y*sy + oy``; corners are
    reordered when a scale is negative (a flip), so ``x1 < x2`` still holds. Computed in
    float64."""
    b = np.asarray(boxes, dtype=np.float64).reshape(-1, 4)
    xs = b[:, 0::2] * sx + ox
    ys = b[:, 1::2] * sy + oy
    out = np.empty(b.shape, dtype=np.float32)
    out[:, 0], out[:, 2] = xs.min(axis=1), xs.max(axis=1)
    out[:, 1], out[:, 3] = ys.min(axis=1), ys.max(axis=1)
    return out


def affine_points(
    landmarks: np.ndarray, visibility: np.ndarray, sx: float, sy: float, ox: float, oy: float
) -> np.ndarray:
    """float32 ``[N, K, 2]`` landmarks under the same map; absent points (visibility 0) stay
    at (0, 0)."""
    p = np.asarray(landmarks, dtype=np.float64)
    out = np.empty(p.shape, dtype=np.float32)
    out[..., 0] = p[..., 0] * sx + ox
    out[..., 1] = p[..., 1] * sy + oy
    out[visibility == 0] = 0.0
    return out


def clip_boxes(boxes: np.ndarray, width: float, height: float) -> np.ndarray:
    """Boxes clipped into ``[0, width] x [0, height]`` (a new array)."""
    out = np.array(boxes, dtype=np.float32).reshape(-1, 4)
    np.clip(out[:, 0::2], 0.0, float(width), out=out[:, 0::2])
    np.clip(out[:, 1::2], 0.0, float(height), out=out[:, 1::2])
    return out


def invalidate_outside(
    landmarks: np.ndarray, visibility: np.ndarray, width: float, height: float, tol: float = 0.0
) -> tuple[np.ndarray, np.ndarray]:
    """Landmarks outside ``[-tol, width + tol] x [-tol, height + tol]`` get visibility 0 and
    coordinates (0, 0); returns new (landmarks, visibility)."""
    lm = np.array(landmarks, dtype=np.float32)
    vis = np.array(visibility, dtype=np.uint8)
    x, y = lm[..., 0], lm[..., 1]
    outside = (x < -tol) | (x > width + tol) | (y < -tol) | (y > height + tol) | ~np.isfinite(x) | ~np.isfinite(y)
    vis[outside] = 0
    lm[vis == 0] = 0.0
    return lm, vis


def clip_points(
    landmarks: np.ndarray, visibility: np.ndarray, width: float, height: float
) -> tuple[np.ndarray, np.ndarray]:
    """Points within rounding distance of the image are clipped into it, points further out
    get visibility 0 (for maps that are meant to keep points inside)."""
    lm, vis = invalidate_outside(landmarks, visibility, width, height, tol=_ROUNDING)
    np.clip(lm[..., 0], 0.0, float(width), out=lm[..., 0])
    np.clip(lm[..., 1], 0.0, float(height), out=lm[..., 1])
    return lm, vis


def hflip_image(image: np.ndarray) -> np.ndarray:
    """The image mirrored left-right (a copy in the same memory layout)."""
    return np.flip(image, 1).copy(order="K")


def hflip_boxes(boxes: np.ndarray, width: float) -> np.ndarray:
    """Boxes mirrored in an image ``width`` wide: ``x -> width - x``, corners reordered."""
    return affine_boxes(boxes, -1.0, 1.0, float(width), 0.0)


def hflip_landmarks(
    landmarks: np.ndarray, visibility: np.ndarray, width: float, permutation: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Landmarks mirrored (``x -> width - x``) and their slots swapped by ``permutation``
    (``new[k] = old[permutation[k]]``, from :meth:`LandmarkSchema.flip_permutation`), so a
    left eye is still called ``left_eye`` after the flip."""
    points = affine_points(landmarks, visibility, -1.0, 1.0, float(width), 0.0)
    return points[:, permutation], np.asarray(visibility)[:, permutation]


def crop_image(
    image: np.ndarray, x0: int, y0: int, width: int, height: int, fill: int = 0
) -> np.ndarray:
    """The ``width x height`` window at ``(x0, y0)``; parts outside the image are ``fill``.
    A view when the window lies inside the image."""
    h, w = image.shape[:2]
    if 0 <= x0 and 0 <= y0 and x0 + width <= w and y0 + height <= h:
        return image[y0 : y0 + height, x0 : x0 + width]
    out = np.full((height, width, 3), fill, dtype=np.uint8)
    sx0, sy0 = max(x0, 0), max(y0, 0)
    sx1, sy1 = min(x0 + width, w), min(y0 + height, h)
    if sx1 > sx0 and sy1 > sy0:
        out[sy0 - y0 : sy1 - y0, sx0 - x0 : sx1 - x0] = image[sy0:sy1, sx0:sx1]
    return out


def crop_boxes(
    boxes: np.ndarray, x0: float, y0: float, width: float, height: float, min_visibility: float
) -> tuple[np.ndarray, np.ndarray]:
    """Boxes in the frame of the window ``(x0, y0, width, height)``, clipped to it, and the
    bool mask of boxes to keep: positive size after clipping and at least ``min_visibility``
    of their area inside. Returns (all boxes shifted and clipped, keep)."""
    shifted = affine_boxes(boxes, 1.0, 1.0, -float(x0), -float(y0))
    clipped = clip_boxes(shifted, width, height)
    bw, bh = clipped[:, 2] - clipped[:, 0], clipped[:, 3] - clipped[:, 1]
    area = np.maximum(shifted[:, 2] - shifted[:, 0], 0) * np.maximum(shifted[:, 3] - shifted[:, 1], 0)
    inside = bw * bh
    with np.errstate(invalid="ignore", divide="ignore"):
        frac = np.where(area > 0, inside / area, 0.0)
    keep = (bw > 0) & (bh > 0) & (frac >= min_visibility)
    return clipped, keep


def pad_image(
    image: np.ndarray, width: int, height: int, left: int, top: int, fill: int = 0
) -> np.ndarray:
    """A ``[height, width, 3]`` canvas of ``fill`` with ``image`` placed at ``(left, top)``."""
    h, w = image.shape[:2]
    if left < 0 or top < 0 or left + w > width or top + h > height:
        raise ValueError(
            f"pad_image: a {w}x{h} image at left={left}, top={top} does not fit {width}x{height}"
        )
    if (w, h) == (width, height):
        return image
    out = np.full((height, width, 3), fill, dtype=np.uint8)
    out[top : top + h, left : left + w] = image
    return out


def adjust_colour(
    image: np.ndarray, brightness: float = 1.0, contrast: float = 1.0, saturation: float = 1.0
) -> np.ndarray:
    """Brightness, contrast and saturation factors (1 = unchanged) as torchvision defines
    them, in that order, on uint8: brightness and contrast are one 256-entry lookup table;
    saturation blends with the luma image in 32-bit integers. Contrast uses the mean luma of
    every 4th pixel in each direction (cheap, deterministic)."""
    out = image
    if brightness != 1.0 or contrast != 1.0:
        values = np.arange(256, dtype=np.float64) * brightness
        if contrast != 1.0:
            sample = np.asarray(image[::4, ::4], dtype=np.float64)
            mean = float((sample @ np.array([0.299, 0.587, 0.114])).mean()) * brightness
            mean = min(mean, 255.0)
            values = (values - mean) * contrast + mean
        lut = np.clip(np.rint(values), 0, 255).astype(np.uint8)
        out = lut[out]
    if saturation != 1.0:
        a = np.asarray(out, dtype=np.int32)  # int16 overflows: 255 * 150 > 32767
        gray = (a[..., 0] * 77 + a[..., 1] * 150 + a[..., 2] * 29 + 128) >> 8
        s = int(round(saturation * 256))
        mixed = gray[..., None] + (((a - gray[..., None]) * s) >> 8)
        out = np.clip(mixed, 0, 255).astype(np.uint8)
    return out


# =============================================================================================
# Transforms: parameters + randomness, calling kernels
# =============================================================================================
def _pair(name: str, size: int | Sequence[int]) -> tuple[int, int]:
    if isinstance(size, (int, np.integer)):
        w = h = int(size)
    else:
        if len(size) != 2:
            raise ValueError(f"{name}={size!r} must be an int or (width, height)")
        w, h = int(size[0]), int(size[1])
    if w < 1 or h < 1:
        raise ValueError(f"{name}={size!r} must be positive")
    return w, h


def _check_interpolation(interpolation: str) -> None:
    if interpolation not in INTERPOLATIONS:
        raise ValueError(
            f"interpolation={interpolation!r} is not one of {', '.join(INTERPOLATIONS)}"
        )


def _check_fraction(name: str, value: float) -> None:
    if not 0.0 <= value <= 1.0:
        raise ValueError(f"{name}={value!r} must be in [0, 1]")


class Compose:
    """Apply ``transforms`` in order, all drawing from the same generator."""

    def __init__(self, transforms: Sequence[Callable[[Annotated, np.random.Generator], Annotated]]) -> None:
        self.transforms = tuple(transforms)
        for t in self.transforms:
            if not callable(t):
                raise TypeError(f"transforms: {t!r} is not callable")

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


def min_input_size(
    transforms: Sequence[object], width: int, height: int
) -> tuple[int, int] | None:
    """How small an image of ``width x height`` may be decoded for ``transforms`` without
    losing output detail; None when no transform says (decode at full size)."""
    for t in transforms:
        if getattr(t, "preserves_size", False):
            continue
        hint = getattr(t, "min_input_size", None)
        return hint(width, height) if hint is not None else None
    return None


class Resize:
    """Resize to ``size`` and map the annotations exactly.

    Modes (``size`` is an int or (width, height)):

    ``"fixed"``      output exactly ``size`` (aspect ratio not kept): ``sx = W'/W, sy = H'/H``.
    ``"shorter"``    keep the aspect ratio, shorter side = ``size`` (an int); ``max_size`` caps
                     the longer side (torchvision's rule).
    ``"longer"``     keep the aspect ratio, longer side = ``size`` (an int).
    ``"letterbox"``  keep the aspect ratio, fit inside ``size``, pad with ``fill`` to exactly
                     ``size``, content centred; the padding offsets are in ``Annotated.affine``.

    In keep-ratio modes the content is ``round(W * s) x round(H * s)`` and the maps are
    ``sx = W'/W``, ``sy = H'/H`` for that rounded content (exact for the pixels).
    """

    def __init__(
        self,
        size: int | Sequence[int],
        *,
        mode: ResizeMode = "fixed",
        max_size: int | None = None,
        interpolation: Interpolation = "bilinear",
        fill: int = 0,
    ) -> None:
        if mode not in RESIZE_MODES:
            raise ValueError(f"mode={mode!r} is not one of {', '.join(RESIZE_MODES)}")
        _check_interpolation(interpolation)
        if mode in ("shorter", "longer"):
            if not isinstance(size, (int, np.integer)) or size < 1:
                raise ValueError(f"size={size!r}: mode={mode!r} needs one positive int")
            self.size: tuple[int, int] = (int(size), int(size))
        else:
            self.size = _pair("size", size)
        if max_size is not None and (mode != "shorter" or max_size < self.size[0]):
            raise ValueError(
                f"max_size={max_size!r} applies to mode='shorter' only and must be >= size"
            )
        if not 0 <= fill <= 255:
            raise ValueError(f"fill={fill!r} must be in 0..255")
        self.mode = mode
        self.max_size = max_size
        self.interpolation = interpolation
        self.fill = int(fill)

    def content_size(self, width: int, height: int) -> tuple[int, int]:
        """(width, height) the image content gets for a ``width x height`` input."""
        tw, th = self.size
        if self.mode == "fixed":
            return tw, th
        if self.mode == "shorter":
            s = tw / min(width, height)
            if self.max_size is not None and max(width, height) * s > self.max_size:
                s = self.max_size / max(width, height)
        elif self.mode == "longer":
            s = tw / max(width, height)
        else:  # letterbox
            s = min(tw / width, th / height)
        cw, ch = max(1, round(width * s)), max(1, round(height * s))
        if self.mode == "letterbox":
            cw, ch = min(cw, tw), min(ch, th)
        return cw, ch

    def output_size(self, width: int, height: int) -> tuple[int, int]:
        """(width, height) of the output for a ``width x height`` input."""
        return self.size if self.mode == "letterbox" else self.content_size(width, height)

    def min_input_size(self, width: int, height: int) -> tuple[int, int]:
        """The content size: decoding at any size >= this loses no output detail."""
        return self.content_size(width, height)

    def __call__(self, data: Annotated, rng: np.random.Generator) -> Annotated:
        w, h = data.width, data.height
        cw, ch = self.content_size(w, h)
        image = resize_image(data.image, cw, ch, self.interpolation)
        left = top = 0
        if self.mode == "letterbox":
            tw, th = self.size
            left, top = (tw - cw) // 2, (th - ch) // 2
            image = pad_image(image, tw, th, left, top, self.fill)
        data.image = image
        data.map_annotations(cw / w, ch / h, float(left), float(top))
        return data

    def __repr__(self) -> str:
        return f"Resize(size={self.size}, mode={self.mode!r}, max_size={self.max_size})"


class RandomHorizontalFlip:
    """Mirror left-right with probability ``p``, swapping left/right landmark slots.

    The permutation comes from ``schema`` when given, else from the data
    (:class:`DetectionDataset` sets it from ``index.landmark_schema``). Landmarks without a
    known permutation are refused rather than silently mislabelled.
    """

    preserves_size = True

    def __init__(self, p: float = 0.5, *, schema: LandmarkSchema | None = None) -> None:
        _check_fraction("p", p)
        self.p = float(p)
        self.permutation = schema.flip_permutation() if schema is not None else None

    def __call__(self, data: Annotated, rng: np.random.Generator) -> Annotated:
        if rng.random() >= self.p:
            return data
        perm = self.permutation if self.permutation is not None else data.flip_permutation
        k = data.landmarks.shape[1]
        if perm is None:
            if k:
                raise ValueError(
                    f"RandomHorizontalFlip: {k} landmarks but no flip permutation; pass "
                    "schema= or build the data with a LandmarkSchema"
                )
            perm = np.zeros(0, dtype=np.int64)
        if len(perm) != k:
            raise ValueError(f"RandomHorizontalFlip: permutation of {len(perm)} for K={k} landmarks")
        w = data.width
        data.image = hflip_image(data.image)
        data.boxes = hflip_boxes(data.boxes, w)
        data.landmarks, data.visibility = hflip_landmarks(data.landmarks, data.visibility, w, perm)
        a = data.affine
        data.affine = np.array([-a[0], a[1], w - a[2], a[3]])
        return data

    def __repr__(self) -> str:
        return f"RandomHorizontalFlip(p={self.p})"


def _apply_crop(
    data: Annotated, x0: int, y0: int, cw: int, ch: int, min_visibility: float, fill: int
) -> None:
    data.image = crop_image(data.image, x0, y0, cw, ch, fill)
    boxes, keep = crop_boxes(data.boxes, x0, y0, cw, ch, min_visibility)
    points = affine_points(data.landmarks, data.visibility, 1.0, 1.0, -float(x0), -float(y0))
    points, vis = invalidate_outside(points, data.visibility, cw, ch)
    data.boxes, data.landmarks, data.visibility = boxes, points, vis
    data.select(keep)
    a = data.affine
    data.affine = np.array([a[0], a[1], a[2] - x0, a[3] - y0])


class RandomCrop:
    """A ``size`` window at a uniformly drawn position; where the image is smaller than the
    window it is padded with ``fill`` (its position then drawn inside the window).

    Boxes keeping less than ``min_visibility`` of their area are dropped with their labels and
    landmarks; kept boxes are clipped; landmarks outside get visibility 0.
    """

    def __init__(
        self, size: int | Sequence[int], *, min_visibility: float = 0.25, fill: int = 0
    ) -> None:
        self.size = _pair("size", size)
        _check_fraction("min_visibility", min_visibility)
        self.min_visibility = float(min_visibility)
        self.fill = int(fill)

    def __call__(self, data: Annotated, rng: np.random.Generator) -> Annotated:
        cw, ch = self.size
        w, h = data.width, data.height
        x0 = int(rng.integers(min(0, w - cw), max(0, w - cw) + 1))
        y0 = int(rng.integers(min(0, h - ch), max(0, h - ch) + 1))
        _apply_crop(data, x0, y0, cw, ch, self.min_visibility, self.fill)
        return data

    def __repr__(self) -> str:
        return f"RandomCrop(size={self.size}, min_visibility={self.min_visibility})"


class RandomResizedCrop:
    """torchvision's RandomResizedCrop for detection: a window of random area fraction in
    ``scale`` and aspect ratio (w/h, log-uniform) in ``ratio`` inside the image (up to
    ``attempts`` draws, else the largest centred window of a valid ratio), resized to
    ``size``. Boxes and landmarks as :class:`RandomCrop`, then scaled exactly."""

    def __init__(
        self,
        size: int | Sequence[int],
        *,
        scale: tuple[float, float] = (0.25, 1.0),
        ratio: tuple[float, float] = (3 / 4, 4 / 3),
        min_visibility: float = 0.25,
        interpolation: Interpolation = "bilinear",
        attempts: int = 10,
    ) -> None:
        self.size = _pair("size", size)
        if not (0 < scale[0] <= scale[1] <= 1):
            raise ValueError(f"scale={scale!r} must satisfy 0 < low <= high <= 1")
        if not (0 < ratio[0] <= ratio[1]):
            raise ValueError(f"ratio={ratio!r} must satisfy 0 < low <= high")
        _check_fraction("min_visibility", min_visibility)
        _check_interpolation(interpolation)
        if attempts < 1:
            raise ValueError(f"attempts={attempts!r} must be >= 1")
        self.scale = (float(scale[0]), float(scale[1]))
        self.ratio = (float(ratio[0]), float(ratio[1]))
        self.min_visibility = float(min_visibility)
        self.interpolation = interpolation
        self.attempts = int(attempts)

    def window(self, width: int, height: int, rng: np.random.Generator) -> tuple[int, int, int, int]:
        """(x0, y0, w, h) of the crop window in a ``width x height`` image."""
        area = width * height
        log_lo, log_hi = math.log(self.ratio[0]), math.log(self.ratio[1])
        for _ in range(self.attempts):
            target = area * rng.uniform(self.scale[0], self.scale[1])
            aspect = math.exp(rng.uniform(log_lo, log_hi))
            cw = int(round(math.sqrt(target * aspect)))
            ch = int(round(math.sqrt(target / aspect)))
            if 0 < cw <= width and 0 < ch <= height:
                x0 = int(rng.integers(0, width - cw + 1))
                y0 = int(rng.integers(0, height - ch + 1))
                return x0, y0, cw, ch
        in_ratio = width / height
        if in_ratio < self.ratio[0]:
            cw, ch = width, max(1, int(round(width / self.ratio[0])))
        elif in_ratio > self.ratio[1]:
            cw, ch = max(1, int(round(height * self.ratio[1]))), height
        else:
            cw, ch = width, height
        return (width - cw) // 2, (height - ch) // 2, cw, ch

    def __call__(self, data: Annotated, rng: np.random.Generator) -> Annotated:
        x0, y0, cw, ch = self.window(data.width, data.height, rng)
        _apply_crop(data, x0, y0, cw, ch, self.min_visibility, 0)
        tw, th = self.size
        data.image = resize_image(data.image, tw, th, self.interpolation)
        data.map_annotations(tw / cw, th / ch, 0.0, 0.0)
        return data

    def __repr__(self) -> str:
        return (
            f"RandomResizedCrop(size={self.size}, scale={self.scale}, ratio={self.ratio}, "
            f"min_visibility={self.min_visibility})"
        )


class ColorJitter:
    """With probability ``p``, brightness, contrast and saturation factors drawn uniformly from
    ``[1 - b, 1 + b]`` etc. (0 disables one); see :func:`adjust_colour`. Geometry untouched."""

    preserves_size = True

    def __init__(
        self,
        brightness: float = 0.2,
        contrast: float = 0.2,
        saturation: float = 0.2,
        *,
        p: float = 1.0,
    ) -> None:
        for name, value in (("brightness", brightness), ("contrast", contrast), ("saturation", saturation)):
            if not 0.0 <= value <= 1.0:
                raise ValueError(f"{name}={value!r} must be in [0, 1]")
        _check_fraction("p", p)
        self.brightness, self.contrast, self.saturation = float(brightness), float(contrast), float(saturation)
        self.p = float(p)

    def __call__(self, data: Annotated, rng: np.random.Generator) -> Annotated:
        if rng.random() >= self.p:
            return data
        b, c, s = (
            rng.uniform(1 - v, 1 + v) if v > 0 else 1.0
            for v in (self.brightness, self.contrast, self.saturation)
        )
        data.image = adjust_colour(data.image, b, c, s)
        return data

    def __repr__(self) -> str:
        return (
            f"ColorJitter(brightness={self.brightness}, contrast={self.contrast}, "
            f"saturation={self.saturation}, p={self.p})"
        )
