"""The exact draw of any sampler, reordered so that reads from packed shards stay shard-local:
:class:`ShardLocalSampler`, and :func:`downloaded_bytes`, an LRU cache simulated over a
sequence of shard reads (what an order costs in downloads). docs/balancing.md, "Shard-local order".
"""

from __future__ import annotations

import warnings
from collections import OrderedDict
from collections.abc import Sequence
from typing import Any

import numpy as np

from detloader.balance.base import EpochSampler, check_int, epoch_generator, epoch_items, pad, sampler_config
from detloader.errors import DetloaderValueError, DetloaderWarning

#: The stream of the shard-local order (the stream ids 1-6 are in :mod:`detloader.balance.base`).
STREAM_SHARD_ORDER = 7


def downloaded_bytes(order_of_shards: Any, shard_bytes: Any, cache_bytes: int) -> int:
    """Bytes an LRU cache of ``cache_bytes`` downloads to serve the reads ``order_of_shards``
    (int ``[R]``: the shard of each image read, in read order) of shards of ``shard_bytes``
    (int ``[S]``) bytes each; the cache starts empty.

    A read of a shard not in the cache downloads the whole shard, after evicting least recently
    used shards until it fits or the cache is empty (a shard larger than the cache is held
    alone while it is read, then evicted by the next download). A pure function.
    """
    reads = np.asarray(order_of_shards, dtype=np.int64).reshape(-1)
    sizes = np.asarray(shard_bytes, dtype=np.int64).reshape(-1)
    limit = check_int("cache_bytes", cache_bytes, 1)
    if len(reads) and (reads.min() < 0 or reads.max() >= len(sizes)):
        bad = int(reads[(reads < 0) | (reads >= len(sizes))][0])
        raise DetloaderValueError(f"order_of_shards holds shard {bad}, outside [0, {len(sizes)}) shards")
    if len(reads) == 0:
        return 0
    runs = reads[np.concatenate([[True], reads[1:] != reads[:-1]])]  # a repeated read is a hit
    cache: OrderedDict[int, int] = OrderedDict()
    used = downloaded = 0
    for s in runs.tolist():
        if s in cache:
            cache.move_to_end(s)
            continue
        size = int(sizes[s])
        while cache and used + size > limit:
            used -= cache.popitem(last=False)[1]
        cache[s] = size
        used += size
        downloaded += size
    return downloaded


class ShardLocalSampler(EpochSampler):
    """The exact draw of ``sampler``, in a shard-local order, shared out to ranks.

    Each epoch: the wrapped sampler's global draw ``D`` of the epoch (its ``global_indices()``
    over all ranks when it has them, else its items after ``set_epoch``), padded to a multiple
    of ``world_size`` by wrapping around (or cut with ``drop_last``) as :func:`~detloader.balance.base.shard` does;
    then, from ``SeedSequence([seed, epoch, 7])``:

    1. the shards ``D`` reads, in a random order, cut into **windows**: consecutive shards whose
       bytes add up to at most ``cache_bytes // 2`` (a shard larger than that is a window of
       its own), so a cache holds the window being read and the one before it;
    2. the draw grouped by window, and within a window by shard (in the window's order);
    3. each window cut into ``world_size`` consecutive **blocks**, rank ``r`` taking block
       ``r``; the block sizes are those of the positions ``r::world_size`` within the window,
       so every rank has the same length for the epoch and all ranks pass a window boundary
       within one item of each other;
    4. the items of every block shuffled.

    Rank ``r`` yields its blocks window by window. The ranks are disjoint, their union is the
    padded ``D``, and every rank computes the same global order without communication. Blocks
    rather than ``r::world_size``: docs/balancing.md. ``cache_bytes`` is one node's cache,
    shared by the ranks of that node.

    Args:
        sampler: an index sampler (1-D items): a detloader sampler (built as
            ``make_balanced_sampler`` builds it; with ``world_size`` 1 or this one's) or any
            sampler whose multiset for an epoch is fixed by its ``set_epoch`` (torch's
            ``RandomSampler`` draws a permutation of every index: any order gives its multiset).
        shard_of: int ``[n]``: the shard holding each dataset index (the pack keeps the
            index's rows in order, so shards are runs of consecutive indices, but any map works).
        shard_bytes: int ``[S]``: the bytes of each shard.
        cache_bytes: the bytes one cache (a node's) may hold.
        seed, rank, world_size, drop_last: see :mod:`detloader.balance.base`; ``drop_last``
            cuts the draw to a multiple of ``world_size`` instead of wrapping.

    Raises:
        DetloaderValueError: arrays of the wrong shape or values, a wrapped sampler distributed
            over another world size, or items that are not indices of ``shard_of``.

    Warns (DetloaderWarning): shards larger than ``cache_bytes`` (they cannot be kept; count
    given).
    """

    def __init__(self, sampler: Any, shard_of: Any, shard_bytes: Any, cache_bytes: int, *, seed: int = 0,
                 rank: int | None = None, world_size: int | None = None, drop_last: bool = False) -> None:
        super().__init__(seed=seed, rank=rank, world_size=world_size, drop_last=drop_last)
        if not hasattr(sampler, "__iter__"):
            raise DetloaderValueError(f"sampler={sampler!r} is not iterable")
        inner_world = int(getattr(sampler, "world_size", 1))
        if inner_world not in (1, self.world_size):
            raise DetloaderValueError(f"sampler has world_size={inner_world}, ShardLocalSampler "
                                      f"world_size={self.world_size}: give it 1 or the same")
        if inner_world > 1 and not hasattr(sampler, "global_indices"):
            raise DetloaderValueError(f"{type(sampler).__name__} has world_size={inner_world} but no global_indices(): "
                                      "its items are one rank's share; give it world_size=1")
        if inner_world > 1 and bool(getattr(sampler, "drop_last", drop_last)) != self.drop_last:
            raise DetloaderValueError(f"sampler has drop_last={sampler.drop_last}, ShardLocalSampler "
                                      f"drop_last={self.drop_last}: they pad the draw differently")
        self.sampler = sampler
        self.shard_of = np.asarray(shard_of)
        self.shard_bytes = np.asarray(shard_bytes)
        self.cache_bytes = check_int("cache_bytes", cache_bytes, 1)
        _check_shards(self.shard_of, self.shard_bytes)
        big = int(np.count_nonzero(self.shard_bytes > self.cache_bytes))
        if big:
            warnings.warn(f"ShardLocalSampler: {big} of {len(self.shard_bytes)} shards are larger than "
                          f"cache_bytes={self.cache_bytes}: each is downloaded whenever it is read, never kept",
                          DetloaderWarning, stacklevel=2)

    @property
    def window_bytes(self) -> int:
        """The most bytes of shards in one window (but a larger shard alone): half the cache."""
        return max(1, self.cache_bytes // 2)

    def _config(self) -> dict[str, Any]:
        return {**super()._config(), "drop_last": self.drop_last, "cache_bytes": self.cache_bytes,
                "shards": len(self.shard_bytes), "pack_bytes": int(self.shard_bytes.sum()),
                "sampler": sampler_config(self.sampler)}

    def global_draw(self) -> np.ndarray:
        """The wrapped sampler's draw of this epoch over all ranks, padded (or cut) to a
        multiple of ``world_size``: the multiset the ranks share."""
        if hasattr(self.sampler, "set_epoch"):
            self.sampler.set_epoch(self.epoch)
        if hasattr(self.sampler, "global_indices"):
            draw = np.asarray(self.sampler.global_indices())
        else:
            draw = epoch_items(self.sampler, self.epoch)
        if draw.ndim != 1:
            raise DetloaderValueError(f"{type(self.sampler).__name__} yields batches or groups; "
                                      "ShardLocalSampler needs indices")
        if len(draw) and (int(draw.min()) < 0 or int(draw.max()) >= len(self.shard_of)):
            bad = int(draw[(draw < 0) | (draw >= len(self.shard_of))][0])
            raise DetloaderValueError(f"{type(self.sampler).__name__} drew index {bad}, but shard_of maps "
                                      f"{len(self.shard_of)} indices")
        return pad(draw, self.world_size, self.drop_last)

    def global_order(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``(items, ranks, windows)``, each ``[L]``: the epoch's padded draw in its global
        shard-local order, the rank each position goes to, and its window number."""
        draw = self.global_draw()
        w = self.world_size
        rng = epoch_generator(self.seed, self.epoch, STREAM_SHARD_ORDER)
        shards = self.shard_of[draw].astype(np.int64)
        drawn = np.unique(shards)
        seq = drawn[rng.permutation(len(drawn))]  # the shards in their order of the epoch
        window_of = np.empty(len(self.shard_bytes), dtype=np.int64)
        window_of[seq] = _windows(self.shard_bytes[seq], self.window_bytes)
        place = np.empty(len(self.shard_bytes), dtype=np.int64)
        place[seq] = np.arange(len(seq))
        by_shard = np.argsort(place[shards], kind="stable")  # grouped by shard, so by window
        windows = window_of[shards[by_shard]]  # 0, 0, ..., 1, ...: every window is drawn from
        sizes = np.bincount(windows)
        ends = np.cumsum(sizes)
        # block (window k, rank r) holds as many positions as r::w has in [ends[k] - sizes[k], ends[k])
        counts = (_rank_counts(ends, w) - _rank_counts(ends - sizes, w)).reshape(-1)
        ranks = np.repeat(np.tile(np.arange(w), len(ends)), counts)
        blocks = np.repeat(np.arange(len(counts)), counts)
        shuffled = np.lexsort((rng.random(len(draw)), blocks))  # blocks stay in place, items shuffle
        return draw[by_shard][shuffled], ranks, windows

    def _rank_items(self) -> np.ndarray:
        def compute() -> np.ndarray:
            items, ranks, _ = self.global_order()
            return items[ranks == self.rank] if self.world_size > 1 else items

        return self._cached(compute)


def _check_shards(shard_of: np.ndarray, shard_bytes: np.ndarray) -> None:
    if shard_bytes.ndim != 1 or len(shard_bytes) == 0 or not np.issubdtype(shard_bytes.dtype, np.integer):
        raise DetloaderValueError(f"shard_bytes must be a non-empty 1-D int array, got {shard_bytes.dtype} "
                                  f"shape {shard_bytes.shape}")
    if (shard_bytes < 0).any():
        s = int(np.flatnonzero(shard_bytes < 0)[0])
        raise DetloaderValueError(f"shard_bytes[{s}]={int(shard_bytes[s])} < 0")
    if shard_of.ndim != 1 or not np.issubdtype(shard_of.dtype, np.integer):
        raise DetloaderValueError(f"shard_of must be a 1-D int array, got {shard_of.dtype} shape {shard_of.shape}")
    outside = (shard_of < 0) | (shard_of >= len(shard_bytes))
    if outside.any():
        i = int(np.flatnonzero(outside)[0])
        raise DetloaderValueError(f"shard_of[{i}]={int(shard_of[i])} is not a shard of shard_bytes "
                                  f"([0, {len(shard_bytes)}))")


def _rank_counts(stops: np.ndarray, world_size: int) -> np.ndarray:
    """int ``[K, world_size]``: how many of the positions ``0 .. stops[k] - 1`` are rank ``r``'s
    under the split ``r::world_size``."""
    r = np.arange(world_size)
    return stops[:, None] // world_size + (r[None, :] < stops[:, None] % world_size)


def _windows(sizes: Sequence[int] | np.ndarray, budget: int) -> np.ndarray:
    """int ``[S]``: the window of each shard of ``sizes`` (in read order): a new window starts
    where the next shard would take the current one over ``budget`` bytes."""
    out = np.empty(len(sizes), dtype=np.int64)
    k, used = 0, 0
    for i, size in enumerate(np.asarray(sizes, dtype=np.int64).tolist()):
        if used and used + size > budget:
            k, used = k + 1, 0
        used += size
        out[i] = k
    return out
