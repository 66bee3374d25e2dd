"""Geometric transforms: resize / letterbox, horizontal flip with the left/right landmark
swap, random crops, random affine. The map is recorded in ``Annotated.affine`` (exactly when
axis-aligned). See docs/loader.md, "Transforms" and "RandomAffine".
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Literal

import numpy as np

import detloader.transforms.functional as fn
from detloader.annotations.landmarks import LandmarkSchema
from detloader.errors import DetloaderValueError
from detloader.transforms.base import Annotated, check_fraction, check_interpolation, size_pair
from detloader.transforms.functional import Interpolation

ResizeMode = Literal["fixed", "shorter", "longer", "letterbox"]
RESIZE_MODES: tuple[str, ...] = ("fixed", "shorter", "longer", "letterbox")


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

    #: it draws nothing: the dataset makes no generator for it (``transforms.base.draws``)
    draws = False

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
            raise DetloaderValueError(f"mode={mode!r} is not one of {', '.join(RESIZE_MODES)}")
        check_interpolation(interpolation)
        if mode in ("shorter", "longer"):
            if not isinstance(size, (int, np.integer)) or size < 1:
                raise DetloaderValueError(f"size={size!r}: mode={mode!r} needs one positive int")
            self.size: tuple[int, int] = (int(size), int(size))
        else:
            self.size = size_pair("size", size)
        if max_size is not None and (mode != "shorter" or max_size < self.size[0]):
            raise DetloaderValueError(f"max_size={max_size!r} applies to mode='shorter' only and must be >= size")
        if not 0 <= fill <= 255:
            raise DetloaderValueError(f"fill={fill!r} must be in 0..255")
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

    def __call__(self, data: Annotated, rng: np.random.Generator | None = None) -> Annotated:
        w, h = data.width, data.height
        cw, ch = self.content_size(w, h)
        image = fn.resize_image(data.image, cw, ch, self.interpolation)
        left = top = 0
        if self.mode == "letterbox":
            tw, th = self.size
            left, top = (tw - cw) // 2, (th - ch) // 2
            image = fn.pad_image(image, tw, th, left, top, self.fill)
        data.image = image
        data.map_annotations(cw / w, ch / h, float(left), float(top))
        return data

    def __repr__(self) -> str:
        return f"Resize(size={self.size}, mode={self.mode!r}, max_size={self.max_size})"


class RandomHorizontalFlip:
    """Mirror left-right with probability ``p``, swapping left/right landmark slots by the
    permutation of ``schema``, else the data's, and mirror classes by the data's
    :class:`~detloader.annotations.landmarks.ClassFlip` (:class:`DetectionDataset` sets both).
    An image holding an object of a one-sided class (``redleft`` without ``redright``) is left
    as it is: mirrored, its label would lie. ``p=0`` turns flipping off."""

    preserves_size = True

    def __init__(self, p: float = 0.5, *, schema: LandmarkSchema | None = None) -> None:
        check_fraction("p", p)
        self.p = float(p)
        self.permutation = schema.flip_permutation() if schema is not None else None

    @property
    def mirrors(self) -> bool:
        return self.p > 0

    def __call__(self, data: Annotated, rng: np.random.Generator) -> Annotated:
        if rng.random() >= self.p:
            return data
        labels = data.mirrored_labels()
        if labels is None:
            return data
        perm = _flip_permutation(self, data)
        w = data.width
        data.image = fn.hflip_image(data.image)
        data.boxes = fn.hflip_boxes(data.boxes, w)
        data.labels = labels
        data.landmarks, data.visibility = fn.hflip_landmarks(data.landmarks, data.visibility, w, perm)
        data.affine = fn.compose_affine(data.affine, -1.0, 1.0, float(w), 0.0)
        return data

    def __repr__(self) -> str:
        return f"RandomHorizontalFlip(p={self.p})"


def _flip_permutation(transform: object, data: Annotated) -> np.ndarray:
    """The landmark slot permutation a mirroring ``transform`` applies: its own (from
    ``schema=``), else the data's; landmarks without one are refused rather than silently
    mislabelled."""
    perm = getattr(transform, "permutation", None)
    perm = perm if perm is not None else data.flip_permutation
    k = data.landmarks.shape[1]
    name = type(transform).__name__
    if perm is None:
        if k:
            raise DetloaderValueError(
                f"{name}: {k} landmarks but no flip permutation; pass schema= or build the "
                "data with a LandmarkSchema"
            )
        perm = np.zeros(0, dtype=np.int64)
    if len(perm) != k:
        raise DetloaderValueError(f"{name}: permutation of {len(perm)} for K={k} landmarks")
    return perm


class RandomCrop:
    """A ``size`` window at a uniformly drawn position; where the image is smaller than the
    window it is padded with ``fill``. Objects as :meth:`Annotated.crop`."""

    def __init__(self, size: int | Sequence[int], *, min_visibility: float = 0.25, fill: int = 0) -> None:
        self.size = size_pair("size", size)
        check_fraction("min_visibility", min_visibility)
        self.min_visibility = float(min_visibility)
        self.fill = int(fill)

    def __call__(self, data: Annotated, rng: np.random.Generator) -> Annotated:
        cw, ch = self.size
        w, h = data.width, data.height
        x0 = int(rng.integers(min(0, w - cw), max(0, w - cw) + 1))
        y0 = int(rng.integers(min(0, h - ch), max(0, h - ch) + 1))
        data.crop(x0, y0, cw, ch, self.min_visibility, self.fill)
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
        self.size = size_pair("size", size)
        if not (0 < scale[0] <= scale[1] <= 1):
            raise DetloaderValueError(f"scale={scale!r} must satisfy 0 < low <= high <= 1")
        if not (0 < ratio[0] <= ratio[1]):
            raise DetloaderValueError(f"ratio={ratio!r} must satisfy 0 < low <= high")
        check_fraction("min_visibility", min_visibility)
        check_interpolation(interpolation)
        if attempts < 1:
            raise DetloaderValueError(f"attempts={attempts!r} must be >= 1")
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
        data.crop(x0, y0, cw, ch, self.min_visibility, 0)
        data.resize(*self.size, self.interpolation)
        return data

    def __repr__(self) -> str:
        return (
            f"RandomResizedCrop(size={self.size}, scale={self.scale}, ratio={self.ratio}, "
            f"min_visibility={self.min_visibility})"
        )


class RandomAffine:
    """Rotation, scale, shear and translation about the image centre, optionally mirrored;
    the output keeps the input's size (Ultralytics' RandomPerspective without perspective).

    ``M = T @ Shear @ R(angle, scale) @ Mirror @ C`` (``C`` moves the centre to the origin,
    ``T`` back, shifted), drawn per call in that order of parameters. Boxes become the boxes
    around their transformed corners; a mirrored map swaps the left/right landmark slots and
    the mirror classes, and is not drawn for an image holding a one-sided class (as
    :class:`RandomHorizontalFlip`);
    ``Annotated.affine`` is exact while ``degrees`` and ``shear`` are 0, else NaN offsets.
    See docs/loader.md, "RandomAffine".
    """

    def __init__(
        self,
        degrees: float = 0.0,
        translate: float = 0.1,
        scale: tuple[float, float] = (0.5, 1.5),
        shear: float = 0.0,
        *,
        mirror: float = 0.0,
        min_visibility: float = 0.25,
        fill: int = 0,
        interpolation: Interpolation = "bilinear",
        schema: LandmarkSchema | None = None,
    ) -> None:
        if not (0 < scale[0] <= scale[1]):
            raise DetloaderValueError(f"scale={scale!r} must satisfy 0 < low <= high")
        if degrees < 0 or shear < 0 or not 0 <= translate <= 1:
            raise DetloaderValueError(
                f"degrees={degrees!r}, shear={shear!r} must be >= 0 and translate={translate!r} in [0, 1]"
            )
        check_fraction("mirror", mirror)
        check_fraction("min_visibility", min_visibility)
        check_interpolation(interpolation)
        self.degrees, self.translate, self.shear = float(degrees), float(translate), float(shear)
        self.scale = (float(scale[0]), float(scale[1]))
        self.mirror, self.min_visibility = float(mirror), float(min_visibility)
        self.fill, self.interpolation = int(fill), interpolation
        self.permutation = schema.flip_permutation() if schema is not None else None

    @property
    def mirrors(self) -> bool:
        return self.mirror > 0

    def matrix(self, width: int, height: int, rng: np.random.Generator, *, allow_mirror: bool = True) -> np.ndarray:
        """float64 ``[2, 3]``: the map of one call for a ``width x height`` image (never a
        mirror without ``allow_mirror``; the generator advances the same)."""
        angle = math.radians(rng.uniform(-self.degrees, self.degrees))
        s = rng.uniform(*self.scale)
        shx, shy = np.tan(np.radians(rng.uniform(-self.shear, self.shear, 2)))
        tx, ty = rng.uniform(-self.translate, self.translate, 2)
        mirror = -1.0 if rng.random() < self.mirror and allow_mirror else 1.0
        c, si = math.cos(angle) * s, math.sin(angle) * s
        shear, rotate = np.array([[1.0, shx], [shy, 1.0]]), np.array([[c, si], [-si, c]])
        linear = shear @ rotate @ np.diag([mirror, 1.0])
        centre = np.array([width / 2, height / 2])
        shift = centre + (tx * width, ty * height) - linear @ centre
        return np.column_stack([linear, shift])

    def __call__(self, data: Annotated, rng: np.random.Generator) -> Annotated:
        w, h = data.width, data.height
        mirrored = data.mirrored_labels()
        m = self.matrix(w, h, rng, allow_mirror=mirrored is not None)
        det = float(np.linalg.det(m[:, :2]))
        data.image = fn.warp_image(data.image, m, w, h, self.fill, self.interpolation)
        boxes, keep = fn.crop_boxes(fn.warp_boxes(data.boxes, m), 0, 0, w, h, self.min_visibility)
        points = fn.warp_points(data.landmarks, data.visibility, m)
        points, vis = fn.invalidate_outside(points, data.visibility, w, h)
        if det < 0:
            perm = _flip_permutation(self, data)
            points, vis = points[:, perm], vis[:, perm]
            data.labels = mirrored if mirrored is not None else data.labels  # None: only a shear past 45 degrees
        data.boxes, data.landmarks, data.visibility = boxes, points, vis
        data.select(keep)
        if m[0, 1] == 0 and m[1, 0] == 0:  # axis-aligned: the exact map
            data.affine = fn.compose_affine(data.affine, m[0, 0], m[1, 1], m[0, 2], m[1, 2])
        else:
            s = math.sqrt(abs(det))
            data.affine = fn.compose_affine(data.affine, math.copysign(s, det), s, math.nan, math.nan)
        return data

    def __repr__(self) -> str:
        return (
            f"RandomAffine(degrees={self.degrees}, translate={self.translate}, scale={self.scale}, "
            f"shear={self.shear}, mirror={self.mirror}, min_visibility={self.min_visibility})"
        )
