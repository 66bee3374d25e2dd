"""AspectRatioBatchSampler: batches of images of similar aspect ratio, from any sampler's
order (detectron2's ``AspectRatioGroupedDataset`` for a map-style DataLoader), so that wide and
tall images are not padded to one square.

Seeds, epochs, ranks and resume: :mod:`detloader.balance.base` (its resume ``offset`` counts
batches).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from detloader.balance.base import EpochSampler, epoch_items, sampler_config
from detloader.balance.checks import check_int
from detloader.balance.groups import positions_by_group
from detloader.errors import DetloaderValueError


class AspectRatioBatchSampler(EpochSampler):
    """A batch sampler: the wrapped sampler's order of the epoch, put into buckets by aspect
    ratio (width / height); a bucket yields a batch as soon as it holds ``batch_size`` items,
    and what is left in the buckets at the end of the epoch comes last, one short batch per
    bucket (none with ``drop_last``). Items of a :class:`~detloader.balance.PartnerSampler`
    (groups) go by their first index.

    Args:
        sampler: the order: a detloader sampler (balanced or uniform), a ``PartnerSampler``, or
            torch's ``SequentialSampler`` for evaluation. It must not be distributed itself: this
            sampler shares whole batches out across ranks (batches ``rank::world_size``, padded
            by wrapping around or cut with ``drop_last``), so every rank gets as many batches.
        aspect_ratios: float ``[n]``: width / height of each dataset index.
        batch_size: items per batch.
        boundaries: ascending ratios between buckets: ``(1.0,)`` (default) makes two buckets,
            tall (< 1) and wide (>= 1), as detectron2; ``(0.75, 1.0, 1.5)`` makes four.
        drop_last, rank, world_size: see :mod:`detloader.balance.base`.
    """

    def __init__(
        self,
        sampler: Any,
        aspect_ratios: Any,
        batch_size: int,
        *,
        boundaries: Sequence[float] = (1.0,),
        drop_last: bool = False,
        rank: int | None = None,
        world_size: int | None = None,
    ) -> None:
        super().__init__(seed=0, rank=rank, world_size=world_size, drop_last=drop_last)
        if int(getattr(sampler, "world_size", 1)) > 1:
            raise DetloaderValueError(
                f"sampler has world_size={sampler.world_size}: AspectRatioBatchSampler shares "
                "batches out across ranks itself; give it the global order (world_size=1)"
            )
        self.sampler = sampler
        self.aspect_ratios = np.asarray(aspect_ratios, dtype=np.float64)
        self.batch_size = check_int("batch_size", batch_size, 1)
        self.boundaries = tuple(float(b) for b in boundaries)
        if list(self.boundaries) != sorted(self.boundaries):
            raise DetloaderValueError(f"boundaries={boundaries!r} must be ascending")

    def _config(self) -> dict[str, Any]:
        return {
            **super()._config(),
            "batch_size": self.batch_size,
            "boundaries": list(self.boundaries),
            "drop_last": self.drop_last,
            "sampler": sampler_config(self.sampler),
        }

    def global_batches(self) -> np.ndarray:
        """Object ``[B]`` of lists: this epoch's batches over all ranks, in the order they fill."""
        items = epoch_items(self.sampler, self.epoch)
        first = items if items.ndim == 1 else items[:, 0]
        bucket = np.searchsorted(self.boundaries, self.aspect_ratios[first], side="right")
        full: list[tuple[int, np.ndarray]] = []  # (position of the last item, positions)
        tails: list[np.ndarray] = []
        for members in positions_by_group(bucket, len(self.boundaries) + 1):
            cut = len(members) // self.batch_size * self.batch_size
            full += [(int(m[-1]), m) for m in members[:cut].reshape(-1, self.batch_size)]
            if cut < len(members) and not self.drop_last:
                tails.append(members[cut:])
        full.sort(key=lambda t: t[0])
        batches = [m for _, m in full] + tails
        out = np.empty(len(batches), dtype=object)
        for k, m in enumerate(batches):
            out[k] = items[m].tolist()
        return out

    def _rank_items(self) -> np.ndarray:
        return self._cached_share(self.global_batches)
