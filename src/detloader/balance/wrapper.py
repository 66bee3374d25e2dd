"""DistributedSamplerWrapper: any sampler made distributed, its draw shared out across ranks.

Seeds, epochs, ranks and resume: :mod:`detloader.balance.base`.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import torch

from detloader.balance.base import STREAM_WRAPPER, EpochSampler
from detloader.balance.distributed import shard
from detloader.errors import DetloaderValueError


class DistributedSamplerWrapper(EpochSampler):
    """Makes a user's sampler distributed: every rank runs the wrapped sampler for the epoch,
    gets the same sequence, and keeps positions ``rank::world_size`` (padded by wrapping or cut).

    Before each epoch the wrapper calls the wrapped sampler's ``set_epoch(epoch)`` if it has
    one (for a ``BatchSampler``: its inner sampler's). A sampler with a ``generator``
    attribute (torch's ``RandomSampler``, ``WeightedRandomSampler``, ``SubsetRandomSampler``)
    gets, with ``reseed=True``, a fresh ``torch.Generator`` seeded from (seed, epoch), so that
    all ranks draw the same sequence; any other randomness in the wrapped sampler must already
    be the same on every rank. Works for index samplers and for batch samplers (yielding
    lists: whole batches are shared out).
    """

    def __init__(
        self,
        sampler: Any,
        *,
        seed: int = 0,
        rank: int | None = None,
        world_size: int | None = None,
        drop_last: bool = False,
        reseed: bool = True,
    ) -> None:
        super().__init__(seed=seed, rank=rank, world_size=world_size, drop_last=drop_last)
        if not hasattr(sampler, "__iter__"):
            raise DetloaderValueError(f"sampler={sampler!r} is not iterable")
        self.sampler = sampler
        self.reseed = bool(reseed)
        self._list_cache: tuple[int, list[Any]] | None = None

    def _config(self) -> dict[str, Any]:
        return {**super()._config(), "drop_last": self.drop_last}

    def global_items(self) -> list[Any]:
        """The wrapped sampler's sequence for this epoch (all ranks)."""
        if self._list_cache is None or self._list_cache[0] != self.epoch:
            # the sampler itself or, for a BatchSampler, the sampler inside it
            chain = [self.sampler, getattr(self.sampler, "sampler", None)]
            target = next((s for s in chain if hasattr(s, "set_epoch")), None)
            if target is not None:
                target.set_epoch(self.epoch)
            target = next((s for s in chain if hasattr(s, "generator")), None)
            if self.reseed and target is not None:
                state = np.random.SeedSequence([self.seed, self.epoch, STREAM_WRAPPER]).generate_state(1, np.uint64)
                target.generator = torch.Generator().manual_seed(int(state[0]) & (2**63 - 1))
            self._list_cache = (self.epoch, list(iter(self.sampler)))
        return self._list_cache[1]

    def _rank_items(self) -> np.ndarray:
        def compute() -> np.ndarray:
            items = self.global_items()
            holder = np.empty(len(items), dtype=object)
            for i, item in enumerate(items):  # one by one: equal-length batches stay lists
                holder[i] = list(item) if isinstance(item, (list, tuple)) else item
            positions = shard(np.arange(len(items)), self.rank, self.world_size, self.drop_last)
            return holder[positions]

        return self._cached(compute)

    def __iter__(self) -> Iterator[Any]:
        for item in super().__iter__():
            yield item if isinstance(item, list) else int(item)

    def __len__(self) -> int:
        if hasattr(self.sampler, "__len__"):
            n, w = len(self.sampler), self.world_size
            return n // w if self.drop_last else -(-n // w)
        return len(self._rank_items())

