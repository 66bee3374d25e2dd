"""Geometry and colour on an image and its boxes, landmarks and visibility together.

Two layers, as albumentations does it: pure numpy **kernels** (:mod:`.functional`) that never
modify their inputs and know nothing about randomness, and **transforms** (:mod:`.geometric`,
:mod:`.colour`, :mod:`.mix`, :class:`Compose` in :mod:`.base`) that hold parameters, draw from
the ``numpy.random.Generator`` they are given and call kernels: ``transform(data, rng) -> data``
on an :class:`Annotated`. The albumentations adapter (:mod:`.albumentations`) is not imported
here. Coordinates, the accumulated map and the guarantees every transform keeps: docs/loader.md,
"Transforms".
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
