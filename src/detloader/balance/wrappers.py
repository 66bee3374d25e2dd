"""The samplers built on another sampler's order: :class:`DistributedSamplerWrapper`,
:class:`PartnerSampler` (index groups for mosaic and mixup) and :class:`AspectRatioBatchSampler`.
The resume ``offset`` counts the items each yields: indices, groups or batches.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
import torch

from detloader.balance.base import STREAM_WRAPPER, EpochSampler, check_int, epoch_items, sampler_config, shard
from detloader.balance.groups import positions_by_group
from detloader.errors import DetloaderValueError

#: Partner ``j`` of epoch ``e`` is the wrapped sampler's draw of epoch ``e + j * PARTNER_EPOCHS``:
#: epochs no training reaches, so a partner stream never repeats an epoch's own draw.
PARTNER_EPOCHS = 1 << 32


class DistributedSamplerWrapper(EpochSampler):
    """Makes a user's index or batch sampler distributed: every rank runs it for the epoch and
    keeps positions ``rank::world_size`` (padded by wrapping or cut). Its (or a
    ``BatchSampler``'s inner sampler's) ``set_epoch`` is called; a ``generator`` attribute
    (torch's samplers) gets, with ``reseed=True``, a ``torch.Generator`` seeded from (seed,
    epoch). Any other randomness in it must already be the same on every rank.
    """

    def __init__(self, sampler: Any, *, seed: int = 0, rank: int | None = None, world_size: int | None = None,
                 drop_last: bool = False, reseed: bool = True) -> None:
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


class PartnerSampler(EpochSampler):
    """Groups of ``1 + partners`` indices from one sampler. Position ``k`` of epoch ``e`` is
    ``[d_0[k], d_1[k], ..., d_partners[k]]`` where ``d_0`` is the wrapped sampler's own draw of
    epoch ``e`` (the very indices the loader draws without partners) and ``d_j`` its draw of
    epoch ``e + j * PARTNER_EPOCHS`` (wrapped around to the same length when lengths differ).

    So every slot has the wrapped sampler's distribution and sharding (docs/loader.md tells why);
    the number of items, the ranks and the resume offsets are the wrapped sampler's. The wrapped
    sampler should have ``set_epoch`` (a detloader sampler), or a restore gives other groups.
    """

    def __init__(self, sampler: Any, partners: int = 3) -> None:
        super().__init__(seed=0, rank=0, world_size=1, drop_last=False)  # the wrapped one shards
        if not hasattr(sampler, "__iter__"):
            raise DetloaderValueError(f"sampler={sampler!r} is not iterable")
        self.sampler = sampler
        self.partners = check_int("partners", partners, 1)

    def _config(self) -> dict[str, Any]:
        return {**super()._config(), "partners": self.partners, "sampler": sampler_config(self.sampler)}

    def _rank_items(self) -> np.ndarray:
        def compute() -> np.ndarray:
            own = epoch_items(self.sampler, self.epoch)
            if own.ndim != 1:
                name = type(self.sampler).__name__
                raise DetloaderValueError(f"{name} yields batches or groups; PartnerSampler needs indices")
            slots = [own] + [
                np.resize(epoch_items(self.sampler, self.epoch + j * PARTNER_EPOCHS), len(own))
                for j in range(1, self.partners + 1)
            ]
            return np.stack(slots, axis=1)

        return self._cached(compute)


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

    def __init__(self, sampler: Any, aspect_ratios: Any, batch_size: int, *, boundaries: Sequence[float] = (1.0,),
                 drop_last: bool = False, rank: int | None = None, world_size: int | None = None) -> None:
        super().__init__(seed=0, rank=rank, world_size=world_size, drop_last=drop_last)
        if int(getattr(sampler, "world_size", 1)) > 1:
            raise DetloaderValueError(f"sampler has world_size={sampler.world_size}: AspectRatioBatchSampler shares "
                                      "batches out across ranks itself; give it the global order (world_size=1)")
        self.sampler = sampler
        self.aspect_ratios = np.asarray(aspect_ratios, dtype=np.float64)
        self.batch_size = check_int("batch_size", batch_size, 1)
        self.boundaries = tuple(float(b) for b in boundaries)
        if list(self.boundaries) != sorted(self.boundaries):
            raise DetloaderValueError(f"boundaries={boundaries!r} must be ascending")

    def _config(self) -> dict[str, Any]:
        return {**super()._config(), "batch_size": self.batch_size, "boundaries": list(self.boundaries),
                "drop_last": self.drop_last, "sampler": sampler_config(self.sampler)}

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
