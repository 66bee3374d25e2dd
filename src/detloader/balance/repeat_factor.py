"""RepeatFactorSampler: LVIS / detectron2 repeat-factor sampling, stochastic rounding per epoch.

The factors are :func:`detloader.balance.weights.repeat_factors`; seeds, epochs, ranks and
resume: :mod:`detloader.balance.base`.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from detloader.annotations.index import AnnotationIndex
from detloader.balance.base import STREAM_REPEAT, EpochSampler, epoch_generator, index_dtype
from detloader.balance.checks import as_weights
from detloader.balance.groups import ByKey
from detloader.balance.weights import DEFAULT_THRESHOLD, repeat_factors


class RepeatFactorSampler(EpochSampler):
    """Each image ``i`` appears ``floor(r_i)`` or ``ceil(r_i)`` times per epoch (stochastic
    rounding, ``E = r_i``), in a shuffled order - LVIS / detectron2's repeat-factor sampling.

    The epoch length varies with the rounding; ``len(sampler)`` is this rank's length for the
    current epoch. Build it from an index with :meth:`from_index`.
    """

    def __init__(
        self,
        repeat_factors: Any,
        *,
        shuffle: bool = True,
        seed: int = 0,
        rank: int | None = None,
        world_size: int | None = None,
        drop_last: bool = False,
    ) -> None:
        super().__init__(seed=seed, rank=rank, world_size=world_size, drop_last=drop_last)
        self.repeat_factors = as_weights(repeat_factors)
        self.shuffle = bool(shuffle)

    @classmethod
    def from_index(
        cls,
        index: AnnotationIndex,
        threshold: float = DEFAULT_THRESHOLD,
        *,
        by: ByKey = "class",
        **kwargs: Any,
    ) -> RepeatFactorSampler:
        """Repeat factors of ``index`` (:func:`detloader.balance.weights.repeat_factors`)."""
        return cls(repeat_factors(index, threshold, by=by), **kwargs)

    def _config(self) -> dict[str, Any]:
        return {**super()._config(), "shuffle": self.shuffle, "drop_last": self.drop_last}

    def global_indices(self) -> np.ndarray:
        """This epoch's indices over all ranks, before padding."""
        r = self.repeat_factors
        n = len(r)
        rng = epoch_generator(self.seed, self.epoch, STREAM_REPEAT)
        whole = np.floor(r)
        reps = whole.astype(np.int64) + (rng.random(n) < (r - whole))
        idx = np.repeat(np.arange(n, dtype=index_dtype(n)), reps)
        if self.shuffle:
            rng.shuffle(idx)
        return idx

    def _rank_items(self) -> np.ndarray:
        return self._cached_share(self.global_indices)

    def expected_counts(self) -> np.ndarray:
        """float64 ``[n]``: expected copies of each image per epoch (the repeat factors)."""
        return self.repeat_factors.copy()
