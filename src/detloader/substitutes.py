"""What stands in for an image that does not decode under ``on_decode_error="skip"``: one flag per
image in shared memory (set in whichever process failed to decode it, cleared by ``set_epoch``)
and the substitutes in the order they are tried. docs/reliability.md, "Decode errors in the loader".
"""

from __future__ import annotations

import os
from typing import Any, Literal

import numpy as np
import torch

from detloader.annotations.index import AnnotationIndex
from detloader.annotations.stratify import rarest_class_per_image

OnDecodeError = Literal["raise", "skip"]
DECODE_ERROR_CHOICES: tuple[str, ...] = ("raise", "skip")
#: Images tried as substitutes of one undecodable image before giving up.
MAX_SUBSTITUTE_TRIES = 32


class Substitutes:
    """The skip flags and substitute order of one dataset (``enabled``: the ``"skip"`` policy;
    otherwise no flags are kept)."""

    def __init__(self, index: AnnotationIndex, seed: int, enabled: bool) -> None:
        self.index, self.seed = index, seed
        self.flags = torch.zeros(len(index) if enabled else 0, dtype=torch.uint8).share_memory_()
        self._rarest: np.ndarray | None = None

    def clear(self) -> None:
        self.flags.zero_()

    def mark(self, i: int) -> None:
        """Image ``i`` failed to decode in this epoch."""
        self.flags[i] = 1

    def skipped(self) -> list[tuple[int, str]]:
        """(index, image path) of the images marked since :meth:`clear`, in index order."""
        return [(int(i), os.fspath(self.index.image_path(int(i)))) for i in torch.nonzero(self.flags).flatten()]

    def order(self, i: int, epoch: int) -> tuple[np.ndarray, np.ndarray]:
        """Substitute candidates of image ``i`` in the order they are tried: the other images of
        its group (same image class, same rarest object class), then the rest, each in the
        order of ``default_rng((seed, epoch, i, 1))``."""
        idx = self.index
        if self._rarest is None:
            self._rarest = rarest_class_per_image(idx.labels, idx.object_image, len(idx), len(idx.classes))
        same = (self._rarest == self._rarest[i]) & (idx.image_labels == idx.image_labels[i])
        same[i] = False
        others = ~same
        others[i] = False
        rng = np.random.default_rng((self.seed, epoch, i, 1))
        return rng.permutation(np.flatnonzero(same)), rng.permutation(np.flatnonzero(others))

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_rarest": None}  # each process computes it again when needed
