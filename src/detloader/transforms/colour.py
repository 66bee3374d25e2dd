"""Colour transforms: they change pixel values only, never geometry (``preserves_size``).
The kernel is :func:`detloader.transforms.functional.adjust_colour`."""

from __future__ import annotations

import numpy as np

from detloader.errors import DetloaderValueError
from detloader.transforms.base import Annotated, check_fraction
from detloader.transforms.functional import adjust_colour


class ColorJitter:
    """With probability ``p``, brightness, contrast and saturation factors drawn uniformly from
    ``[1 - b, 1 + b]`` etc. (0 disables one) and a hue shift uniform in ``[-hue, hue]`` turns
    (``hue <= 0.5``); see :func:`adjust_colour`. Geometry untouched. The HSV jitter of YOLO
    pipelines is ``ColorJitter(brightness=v, saturation=s, hue=h, contrast=0)``: brightness
    scales HSV's value exactly; saturation blends with luma instead of scaling HSV's S."""

    preserves_size = True

    def __init__(
        self,
        brightness: float = 0.2,
        contrast: float = 0.2,
        saturation: float = 0.2,
        hue: float = 0.0,
        *,
        p: float = 1.0,
    ) -> None:
        for name, value in (("brightness", brightness), ("contrast", contrast), ("saturation", saturation)):
            check_fraction(name, value)
        check_fraction("p", p)
        if not 0.0 <= hue <= 0.5:
            raise DetloaderValueError(f"hue={hue!r} must be in [0, 0.5] (turns)")
        self.brightness, self.contrast, self.saturation = float(brightness), float(contrast), float(saturation)
        self.hue, self.p = float(hue), float(p)

    def __call__(self, data: Annotated, rng: np.random.Generator) -> Annotated:
        if rng.random() >= self.p:
            return data
        b, c, s = (
            rng.uniform(1 - v, 1 + v) if v > 0 else 1.0 for v in (self.brightness, self.contrast, self.saturation)
        )
        hue = rng.uniform(-self.hue, self.hue) if self.hue > 0 else 0.0
        data.image = adjust_colour(data.image, b, c, s, hue)
        return data

    def __repr__(self) -> str:
        return (
            f"ColorJitter(brightness={self.brightness}, contrast={self.contrast}, "
            f"saturation={self.saturation}, hue={self.hue}, p={self.p})"
        )
