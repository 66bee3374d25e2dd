"""Transforms of several images: :class:`Mosaic` (four on one canvas) and :class:`MixUp` (two
blended, with the objects of both).

They work on a *group* of dataset indices ``[first, 3 mosaic partners, mixup partner]``
(:func:`group_size`), drawn from the loader's own sampler. In a
:class:`~detloader.dataset.DetectionDataset` a group becomes: the mosaic of the decoded images
(else the first image) -> the dataset's transform, once -> the mixup with the partner after
the same transform; :func:`mix_choice` seeds the coins and the layout per sample. See
docs/loader.md, "Mosaic" and "MixUp".
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from detloader.errors import DetloaderValueError
from detloader.transforms.base import Annotated, check_fraction
from detloader.transforms.functional import affine_boxes, affine_points, blend_images

#: Third seed word of the mix draws, ``(seed, epoch, first, MIX_STREAM)`` (1: decode substitutes).
MIX_STREAM = 2


def _check_epochs(epochs: int | None) -> int | None:
    if epochs is not None and (isinstance(epochs, bool) or not isinstance(epochs, int) or epochs < 0):
        raise DetloaderValueError(f"epochs={epochs!r} must be an int >= 0 or None")
    return epochs


class Mosaic:
    """Four images on one canvas around a random centre (the YOLO mosaic).

    The canvas is the first image's annotated size; the centre is uniform in ``center`` of it.
    Image ``k`` (0 top-left, 1 top-right, 2 bottom-left, 3 bottom-right) is resized to fit
    ``f * (W, H)``, ``f`` uniform in ``scale``, with a corner on the centre, cut to its quadrant.
    Boxes keeping less than ``min_visibility`` of their area are dropped with their landmarks.
    ``p``: share of samples that are mosaics; ``epochs``: mosaics only in epochs below it
    (None: always).
    """

    def __init__(
        self,
        p: float = 1.0,
        *,
        center: tuple[float, float] = (0.25, 0.75),
        scale: tuple[float, float] = (0.5, 1.0),
        min_visibility: float = 0.25,
        fill: int = 0,
        epochs: int | None = None,
    ) -> None:
        check_fraction("p", p)
        check_fraction("min_visibility", min_visibility)
        if not 0 < center[0] <= center[1] < 1:
            raise DetloaderValueError(f"center={center!r} must satisfy 0 < low <= high < 1")
        if not 0 < scale[0] <= scale[1]:
            raise DetloaderValueError(f"scale={scale!r} must satisfy 0 < low <= high")
        self.p, self.min_visibility, self.fill = float(p), float(min_visibility), int(fill)
        self.center = (float(center[0]), float(center[1]))
        self.scale = (float(scale[0]), float(scale[1]))
        self.epochs = _check_epochs(epochs)

    def __call__(self, tiles: Sequence[Annotated], width: int, height: int, rng: np.random.Generator) -> Annotated:
        """The mosaic of four ``tiles`` (changed in place) on a ``width x height`` canvas."""
        cx = min(max(round(width * rng.uniform(*self.center)), 1), width - 1)
        cy = min(max(round(height * rng.uniform(*self.center)), 1), height - 1)
        canvas = np.full((height, width, 3), self.fill, dtype=np.uint8)
        for k, tile in enumerate(tiles):
            right, below = k % 2, k // 2
            f = rng.uniform(*self.scale) * min(width / tile.width, height / tile.height)
            tile.resize(max(1, round(tile.width * f)), max(1, round(tile.height * f)))
            qx, qw = (cx, width - cx) if right else (0, cx)  # the quadrant
            qy, qh = (cy, height - cy) if below else (0, cy)
            left = cx if right else cx - tile.width  # the resized image's corner on the canvas
            top = cy if below else cy - tile.height
            tile.crop(qx - left, qy - top, qw, qh, self.min_visibility, self.fill)
            canvas[qy : qy + qh, qx : qx + qw] = tile.image
            tile.boxes = affine_boxes(tile.boxes, 1.0, 1.0, qx, qy)
            tile.landmarks = affine_points(tile.landmarks, tile.visibility, 1.0, 1.0, qx, qy)
        return _merge(tiles, canvas, np.array([1.0, 1.0, 0.0, 0.0]))

    def __repr__(self) -> str:
        return (
            f"Mosaic(p={self.p}, center={self.center}, scale={self.scale}, "
            f"min_visibility={self.min_visibility}, epochs={self.epochs})"
        )


class MixUp:
    """Two images blended, ``r * first + (1 - r) * partner`` with ``r ~ Beta(alpha, alpha)``
    (32: about 0.5, as YOLO), with the objects of both. The partner, after the dataset's
    transform, is resized to fit the first image's size and placed at its top-left (fill 0
    around it). The sample keeps the first image's map (``scale``, ``offset``) and has image
    class ``MISSING``. ``p`` and ``epochs`` as :class:`Mosaic`."""

    def __init__(self, p: float = 1.0, *, alpha: float = 32.0, epochs: int | None = None) -> None:
        check_fraction("p", p)
        if not alpha > 0:
            raise DetloaderValueError(f"alpha={alpha!r} must be > 0")
        self.p, self.alpha, self.epochs = float(p), float(alpha), _check_epochs(epochs)

    def __call__(self, data: Annotated, other: Annotated, rng: np.random.Generator) -> Annotated:
        r = rng.beta(self.alpha, self.alpha)
        w, h = data.width, data.height
        if (other.width, other.height) != (w, h):
            f = min(w / other.width, h / other.height)
            other.resize(max(1, round(other.width * f)), max(1, round(other.height * f)))
            other.crop(0, 0, w, h, 0.0)
        return _merge([data, other], blend_images(data.image, other.image, r), data.affine)

    def __repr__(self) -> str:
        return f"MixUp(p={self.p}, alpha={self.alpha}, epochs={self.epochs})"


def _merge(parts: Sequence[Annotated], image: np.ndarray, affine: np.ndarray) -> Annotated:
    """One record: ``image`` with the objects of all ``parts``."""
    fields = ("boxes", "labels", "landmarks", "visibility", "object_ids")
    columns = (np.concatenate([getattr(p, f) for p in parts]) for f in fields)
    return Annotated(
        image, *columns, affine=affine, flip_permutation=parts[0].flip_permutation, class_flip=parts[0].class_flip
    )


def group_size(mosaic: Mosaic | None, mixup: MixUp | None) -> int:
    """Indices per group: the first image, 3 mosaic partners, 1 mixup partner."""
    return 1 + 3 * (mosaic is not None) + (mixup is not None)


def mix_choice(
    mosaic: Mosaic | None, mixup: MixUp | None, seed: int, epoch: int, first: int
) -> tuple[bool, bool, np.random.Generator]:
    """(mosaic?, mixup?, the generator of the mix) of the sample whose group starts at
    ``first``: two coins from ``default_rng((seed, epoch, first, MIX_STREAM))`` against ``p``,
    within each one's ``epochs``; the mosaic layout and the mixup ratio come after them."""
    rng = np.random.default_rng((seed, epoch, first, MIX_STREAM))
    coins = rng.random(2)
    on = [
        m is not None and (m.epochs is None or epoch < m.epochs) and bool(c < m.p)
        for m, c in zip((mosaic, mixup), coins)
    ]
    return on[0], on[1], rng
