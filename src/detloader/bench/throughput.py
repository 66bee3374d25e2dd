"""Images per second: of a DataLoader over a number of batches, and of one core decoding.

:func:`loader_rate` times the batches after the first (worker start-up is not throughput);
:func:`decode_rate` is the single-core decode + resize rate of the same images - the work a
loader cannot avoid - so that ``rate x usable CPUs`` is the ceiling any loader of these
images at this size can reach on this machine.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable, Iterable
from typing import Any

import torch

from detloader.annotations.index import AnnotationIndex
from detloader.images import read_image
from detloader.transforms import Resize
from detloader.transforms.base import min_input_size
from detloader.transforms.functional import resize_image


def loader_rate(loader: Iterable[Any], count: Callable[[Any], int], batches: int) -> float:
    """Images per second of ``loader`` over up to ``batches`` batches after the first."""
    it = iter(loader)
    first = next(it, None)
    if first is None:
        return 0.0
    start = time.perf_counter()
    n = 0
    for step, batch in enumerate(it):
        n += count(batch)
        if step + 1 >= batches:
            break
    elapsed = time.perf_counter() - start
    del it  # shut the workers down before the next setting starts its own
    return n / elapsed if elapsed > 0 else 0.0


def decode_rate(index: AnnotationIndex, size: int, images: int, repeats: int = 2) -> float:
    """Images per second of one core reading, decoding (libjpeg-turbo through simplejpeg, or
    Pillow, with the reduced-size JPEG decoding the Dataset uses) and resizing the first
    ``images`` images of ``index`` to ``size x size`` - best of ``repeats`` passes."""
    resize = Resize((size, size))
    hint = functools.partial(min_input_size, (resize,))
    count = min(images, len(index))
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # one core: the resize kernel is torch's
    try:
        best = 0.0
        for _ in range(repeats):
            start = time.perf_counter()
            for i in range(count):
                ann = (int(index.width[i]), int(index.height[i]))
                img = read_image(index.image_path(i), expected_size=ann, min_size=hint).image
                w, h = resize.content_size(img.shape[1], img.shape[0])
                resize_image(img, w, h, resize.interpolation)
            elapsed = time.perf_counter() - start
            best = max(best, count / elapsed if elapsed > 0 else 0.0)
        return best
    finally:
        torch.set_num_threads(threads)
