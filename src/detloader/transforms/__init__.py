"""Geometry and colour on an image and its boxes, landmarks and visibility together.

Two layers, as albumentations does it:

* **kernels** (:mod:`.functional`): pure numpy functions of arrays and numbers
  (``resize_image``, ``affine_boxes``, ``hflip_landmarks``, ``crop_boxes``, ``adjust_colour``
  ...). They never modify their inputs and know nothing about randomness.
* **transforms**: small classes that hold parameters, draw their random numbers from the
  ``numpy.random.Generator`` they are given, and call kernels: :class:`Resize`,
  :class:`RandomHorizontalFlip`, :class:`RandomCrop`, :class:`RandomResizedCrop`,
  :class:`RandomAffine` (:mod:`.geometric`), :class:`ColorJitter` (:mod:`.colour`),
  :class:`Compose` (:mod:`.base`). A transform is called as ``transform(data, rng) -> data``
  on an :class:`Annotated` (:mod:`.base`). :class:`Mosaic` and :class:`MixUp` (:mod:`.mix`)
  combine several images; ``make_loader(mosaic=..., mixup=...)`` applies them. The
  albumentations adapter is :mod:`detloader.transforms.albumentations` (optional extra, not
  imported here).

Coordinates (the index's convention): continuous pixel coordinates, pixel ``i`` covers
``[i, i + 1)``; boxes are float32 ``xyxy``; a ``W x H`` image spans ``[0, W] x [0, H]``. A
horizontal flip maps ``x -> W - x`` for box corners and landmarks alike, and swaps the
left/right landmark slots with ``LandmarkSchema.flip_permutation()`` (as does any transform
that mirrors). Every transform here but a rotating or shearing :class:`RandomAffine` is
axis-aligned, so the map from annotation coordinates to output coordinates stays
``x' = x * sx + ox``, ``y' = y * sy + oy`` (``sx < 0`` after a flip); :attr:`Annotated.affine`
accumulates it so that predictions can be mapped back (NaN offsets when no such map exists).

Guarantees after any transform of this module: boxes lie inside ``[0, W] x [0, H]`` with
positive width and height; every landmark with visibility > 0 lies inside the image; every
landmark with visibility 0 has coordinates (0, 0). A crop drops the boxes that keep less than
``min_visibility`` of their area, with their landmarks and labels; landmarks of kept objects
that leave the image get visibility 0 (they are never clipped onto the border).

Randomness: a transform uses only the generator passed to it. :class:`DetectionDataset`
derives one per sample from ``(seed, epoch, index)``, which makes batches identical whatever
the number of DataLoader workers.
"""

from detloader.transforms.base import Annotated, Compose, Transform, min_input_size
from detloader.transforms.colour import ColorJitter
from detloader.transforms.functional import (
    INTERPOLATIONS,
    Interpolation,
    adjust_colour,
    affine_boxes,
    affine_points,
    blend_images,
    clip_boxes,
    clip_points,
    crop_boxes,
    crop_image,
    hflip_boxes,
    hflip_image,
    hflip_landmarks,
    invalidate_outside,
    pad_image,
    resize_image,
    warp_boxes,
    warp_image,
    warp_points,
)
from detloader.transforms.geometric import (
    RESIZE_MODES,
    RandomAffine,
    RandomCrop,
    RandomHorizontalFlip,
    RandomResizedCrop,
    Resize,
    ResizeMode,
)
from detloader.transforms.mix import MixUp, Mosaic

__all__ = [
    # the record and composition
    "Annotated",
    "Compose",
    "Transform",
    "min_input_size",
    # transforms
    "ColorJitter",
    "MixUp",
    "Mosaic",
    "RandomAffine",
    "RandomCrop",
    "RandomHorizontalFlip",
    "RandomResizedCrop",
    "Resize",
    "RESIZE_MODES",
    "ResizeMode",
    # kernels
    "INTERPOLATIONS",
    "Interpolation",
    "adjust_colour",
    "affine_boxes",
    "affine_points",
    "blend_images",
    "clip_boxes",
    "clip_points",
    "crop_boxes",
    "crop_image",
    "hflip_boxes",
    "hflip_image",
    "hflip_landmarks",
    "invalidate_outside",
    "pad_image",
    "resize_image",
    "warp_boxes",
    "warp_image",
    "warp_points",
]
