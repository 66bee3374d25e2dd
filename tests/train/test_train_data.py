"""What the trainer feeds the model: the training augmentation keeps the picture."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np

from detloader.transforms import ColorJitter


def test_colour_jitter_keeps_bright_images_bright():
    # Saturation used to overflow int16 (255 * 150 > 32767) and turn bright images black.
    image = np.full((8, 8, 3), (200, 180, 150), dtype=np.uint8)
    rng = np.random.default_rng(0)
    for _ in range(20):
        out = ColorJitter()(SimpleNamespace(image=image), rng).image  # reads only .image
        assert abs(float(out.mean()) - float(image.mean())) < 0.45 * float(image.mean())
