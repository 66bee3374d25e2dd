"""The samplers driven by one number per image: :class:`WeightedSampler` (a probability) and
:class:`RepeatFactorSampler` (expected copies per epoch); :func:`make_balanced_sampler`, a
``balance=`` strategy as its sampler.

With replacement: Walker's alias method (:mod:`detloader.balance.alias`; above 2**24 weights the
first 2**20 positions of an epoch by block inverse CDF); without: the order of exponential keys
``E_i / w_i``. Both exact below 2**31 weights (docs/balancing.md, "Exact
weighted sampling beyond 2**24").
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping
from functools import cached_property
from typing import Any

import numpy as np
import torch
from torch.utils.data import Sampler

from detloader.annotations.index import AnnotationIndex
from detloader.balance import alias
from detloader.balance.base import (
    CHUNK,
    STREAM_NO_REPLACEMENT,
    STREAM_REPEAT,
    STREAM_WEIGHTED,
    EpochSampler,
    check_int,
    epoch_generator,
    index_dtype,
    interleave,
)
from detloader.balance.groups import ByKey
from detloader.balance.weights import DEFAULT_THRESHOLD, check_strategy, repeat_factors, sample_weights
from detloader.errors import DetloaderValueError


def as_weights(weights: Any) -> np.ndarray:
    """float64 ``[n]`` from numpy, torch or a sequence (a float64 numpy array is not copied);
    raises unless 1-D, non-empty, at most ``MAX_WEIGHTS`` long, finite, >= 0 and not all zero.
    Two reductions check it (no temporary arrays): a 100M-weight sampler starts sooner."""
    if isinstance(weights, torch.Tensor):
        weights = weights.detach().cpu().numpy()
    w = np.asarray(weights, dtype=np.float64)
    if w.ndim != 1 or len(w) == 0:
        raise DetloaderValueError(f"weights must be a non-empty 1-D sequence, got shape {w.shape}")
    if len(w) > alias.MAX_WEIGHTS:
        raise DetloaderValueError(f"len(weights)={len(w)} exceeds {alias.MAX_WEIGHTS}")
    total = float(np.sum(w))
    if not (math.isfinite(total) and float(np.min(w)) >= 0):  # NaN fails both
        bad = np.flatnonzero(~np.isfinite(w) | (w < 0))
        if len(bad):
            i = int(bad[0])
            raise DetloaderValueError(f"weights[{i}]={float(w[i])!r}: weights must be finite and >= 0")
        raise DetloaderValueError(f"the weights sum to {total}: scale them down")
    if total == 0:
        raise DetloaderValueError("weights are all zero: nothing can be drawn")
    return w


class WeightedSampler(EpochSampler):
    """Indices drawn with probability proportional to ``weights``, per epoch, seeded.

    Args:
        weights: ``[n]`` non-negative finite weights (numpy, torch or a sequence; a float64
            numpy array is used without a copy, so do not modify it afterwards), n < 2**31.
        num_samples: draws per epoch over all ranks (default ``n``).
        replacement: draw with replacement (alias method, O(1) per draw) or without
            (exponential keys: every index at most once, in weighted-random order;
            ``num_samples`` must not exceed the number of positive weights).
        seed, rank, world_size, drop_last: see :mod:`detloader.balance.base`.
        threads: threads that build the table and draw (default: the usable CPUs, at most
            8); the draws are the same for any number.

    With replacement every draw depends only on its position in the epoch, so a rank draws
    only its own share, chunk by chunk as it iterates, and a resume starts at its chunk.
    """

    def __init__(self, weights: Any, num_samples: int | None = None, replacement: bool = True, *, seed: int = 0,
                 rank: int | None = None, world_size: int | None = None, drop_last: bool = False,
                 threads: int | None = None) -> None:
        super().__init__(seed=seed, rank=rank, world_size=world_size, drop_last=drop_last)
        if threads is None:
            threads = alias.default_threads()
        self.threads = check_int("threads", threads, 1, " (or None: the usable CPUs)")
        self.weights = as_weights(weights)
        self.num_samples = check_int("num_samples", len(self.weights) if num_samples is None else num_samples, 1)
        self.replacement = bool(replacement)
        if not self.replacement and self.num_samples > self._positive:
            raise DetloaderValueError(f"num_samples={num_samples} > {self._positive} positive weights: without "
                                      "replacement each index is drawn at most once")
        #: chunks at the start of every epoch drawn by block_draw (no alias table needed)
        self._block_chunks = alias.FAST_START // CHUNK if len(self.weights) > alias.FAST_START_WEIGHTS else 0
        self._ready(1)

    def _ready(self, chunks: int) -> None:
        """Build what drawing chunks ``0 .. chunks - 1`` needs, before any thread draws."""
        if self.replacement and self._block_chunks:
            _ = self._cdf
        if self.replacement and chunks > self._block_chunks:
            _ = self._table

    @cached_property
    def _table(self) -> np.ndarray:
        return alias.alias_table(self.weights, threads=self.threads)

    @cached_property
    def _cdf(self) -> np.ndarray:
        return alias.block_cdf(self.weights)

    @cached_property
    def _positive(self) -> int:
        return int(np.count_nonzero(self.weights))

    @property
    def total_size(self) -> int:
        """Global draws per epoch after padding to a multiple of world_size (or cutting)."""
        w = self.world_size
        return (self.num_samples // w) * w if self.drop_last else -(-self.num_samples // w) * w

    def __len__(self) -> int:
        return self.total_size // self.world_size

    def _config(self) -> dict[str, Any]:
        return {**super()._config(), "num_samples": self.num_samples, "replacement": self.replacement,
                "drop_last": self.drop_last}

    def _chunk_layout(self, rank: int, world_size: int) -> tuple[range, list[int], list[int]]:
        """Where a rank's draws lie: the starts of the epoch's chunks (global positions), the
        rank's first position within each chunk, and the offsets of each chunk's draws in the
        rank's share (``[0, ..., len]``)."""
        total = self.total_size
        los = range(0, total, CHUNK)
        firsts = [(rank - lo) % world_size for lo in los]
        counts = [max(0, -(-(min(CHUNK, total - lo) - f) // world_size)) for lo, f in zip(los, firsts)]
        offsets = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64).tolist()
        return los, firsts, offsets

    def _draw_chunk(self, epoch: int, k: int, lo: int, first: int, world_size: int) -> np.ndarray:
        """The draws of chunk ``k`` of ``epoch`` (global positions ``lo, lo + 1, ...``) at
        positions ``first::world_size`` of the chunk. Each chunk has its own stream."""
        n = len(self.weights)
        span = n << 32  # x uniform in [0, n * 2**32): bucket x >> 32, coin x & (2**32 - 1)
        rng = epoch_generator(self.seed, epoch, STREAM_WEIGHTED, k)
        x = rng.integers(0, span, size=min(CHUNK, self.total_size - lo), dtype=np.uint64)
        if world_size > 1:
            x = x[first::world_size]
        if k < self._block_chunks:
            return alias.block_draw(self.weights, self._cdf, x)
        return alias.alias_draw(self._table, x)

    def _draw_replacement(self, rank: int, world_size: int) -> np.ndarray:
        """This rank's draws: global positions ``rank::world_size`` of the epoch (position ``p``
        depends only on chunk ``p // CHUNK``'s stream, so chunks are drawn on threads)."""
        los, firsts, offsets = self._chunk_layout(rank, world_size)
        self._ready(len(los))  # first: the build's peak memory and the epoch's do not add up
        out = np.empty(offsets[-1], dtype=index_dtype(len(self.weights)))

        def draw(k: int) -> None:
            out[offsets[k] : offsets[k + 1]] = self._draw_chunk(self.epoch, k, los[k], firsts[k], world_size)

        alias.thread_map(draw, len(los), self.threads)
        return out

    def _item_slices(self, start: int) -> Iterator[np.ndarray]:
        """With replacement, and unless this epoch's share was already drawn: the chunks from
        the one holding ``start`` on, drawn as they are reached; the items of :meth:`indices`."""
        if not self.replacement or (self._cache is not None and self._cache[0] == self.epoch):
            yield from super()._item_slices(start)
            return
        los, firsts, offsets = self._chunk_layout(self.rank, self.world_size)
        dtype = index_dtype(len(self.weights))
        k0 = max(0, int(np.searchsorted(offsets, start, side="right")) - 1)
        step = 4 * self.threads  # chunks per round: 4 per thread
        epoch = self.epoch

        def draw(k: int) -> np.ndarray:
            return self._draw_chunk(epoch, k, los[k], firsts[k], self.world_size)

        at = k0
        while at < len(los):
            end = min(at + step, len(los))
            if at < self._block_chunks:  # a round ends where the block draws do: the table waits for it
                end = min(end, self._block_chunks)
            ks = range(at, end)
            self._ready(ks[-1] + 1)
            parts = alias.thread_map(lambda j, at=at: draw(at + j), len(ks), self.threads)
            for k, part in zip(ks, parts):
                skip = max(0, start - offsets[k])
                if skip < len(part):
                    yield part[skip:].astype(dtype, copy=False)
            at = ks[-1] + 1

    def _order_no_replacement(self) -> np.ndarray:
        """The first ``total_size`` indices of this epoch's weighted random order (all ranks)."""
        n = len(self.weights)
        keys = np.empty(n, dtype=np.float64)

        def fill(k: int) -> None:
            lo = k * CHUNK
            w = self.weights[lo : lo + CHUNK]
            rng = epoch_generator(self.seed, self.epoch, STREAM_NO_REPLACEMENT, k)
            part = keys[lo : lo + len(w)]
            rng.standard_exponential(out=part)
            with np.errstate(divide="ignore"):
                np.divide(part, w, out=part)  # w = 0: inf, drawn last (never, see want)

        alias.thread_map(fill, -(-n // CHUNK), self.threads)
        want = min(self.total_size, self._positive)
        if want < n // 4:
            top = np.argpartition(keys, want - 1)[:want]
            order = top[np.argsort(keys[top], kind="stable")]
        else:
            order = np.argsort(keys, kind="stable")[:want]
        order = order.astype(index_dtype(n))
        if len(order) < self.total_size:  # more than the positive weights: wrap (base module doc)
            order = np.resize(order, self.total_size)
        return order

    def global_indices(self) -> np.ndarray:
        """Every rank's draws of this epoch interleaved: rank r has positions r::world_size."""
        if not self.replacement:
            return self._order_no_replacement()
        if self.world_size == 1:
            return self._draw_replacement(0, 1)[: self.total_size]
        return interleave([self._draw_replacement(r, self.world_size) for r in range(self.world_size)])

    def _rank_items(self) -> np.ndarray:
        if self.replacement:
            return self._cached(lambda: self._draw_replacement(self.rank, self.world_size))
        return self._cached(lambda: self._order_no_replacement()[self.rank :: self.world_size])

    def probabilities(self) -> np.ndarray:
        """float64 ``[n]``: the probability of each index in one draw (with replacement)."""
        return self.weights / float(np.sum(self.weights))

    def expected_counts(self) -> np.ndarray:
        """float64 ``[n]``: expected times each index is drawn in one epoch over all ranks
        (before padding). Without replacement this has a closed form only when every
        positive weight is drawn (``num_samples`` = their number): then it is 0 or 1."""
        if self.replacement:
            return self.num_samples * self.probabilities()
        if self.num_samples != self._positive:
            raise DetloaderValueError(f"WeightedSampler(replacement=False, num_samples={self.num_samples}) of "
                                      f"{self._positive} positive weights: inclusion probabilities have no closed "
                                      "form; use replacement=True or num_samples equal to the positive weights")
        return (self.weights > 0).astype(np.float64)


class RepeatFactorSampler(EpochSampler):
    """Each image ``i`` appears ``floor(r_i)`` or ``ceil(r_i)`` times per epoch (stochastic
    rounding, ``E = r_i``), in a shuffled order - LVIS / detectron2's repeat-factor sampling.

    The epoch length varies with the rounding; ``len(sampler)`` is this rank's length for the
    current epoch. Build it from an index with :meth:`from_index`.
    """

    def __init__(self, repeat_factors: Any, *, shuffle: bool = True, seed: int = 0, rank: int | None = None,
                 world_size: int | None = None, drop_last: bool = False) -> None:
        super().__init__(seed=seed, rank=rank, world_size=world_size, drop_last=drop_last)
        self.repeat_factors = as_weights(repeat_factors)
        self.shuffle = bool(shuffle)

    @classmethod
    def from_index(
        cls, index: AnnotationIndex, threshold: float = DEFAULT_THRESHOLD, *, by: ByKey = "class", **kwargs: Any
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


def make_balanced_sampler(
    index: AnnotationIndex,
    balance: str | Mapping[Any, float] | Sampler[Any],
    *,
    by: ByKey = "class",
    seed: int = 0,
    num_samples: int | None = None,
    rank: int | None = None,
    world_size: int | None = None,
) -> Sampler[Any]:
    """The sampler behind ``make_loader(balance=...)``.

    ``balance`` is a ready sampler (returned unchanged), a ``{group: weight}`` mapping
    (explicit weights), or a strategy name with an optional parameter (:func:`parse_strategy`).

    Weight strategies give a :class:`WeightedSampler` with replacement of ``num_samples``
    draws per epoch (default ``len(index)``); ``repeat_factor`` a :class:`RepeatFactorSampler`
    (``num_samples`` must be None: the factors set the length); ``class_aware`` a
    :class:`ClassAwareSampler`.
    """
    from detloader.balance.class_aware import ClassAwareSampler

    if isinstance(balance, Sampler):
        return balance
    common = {"seed": seed, "rank": rank, "world_size": world_size}
    if isinstance(balance, Mapping):
        weights = sample_weights(index, by, "explicit", class_weights=balance)
        return WeightedSampler(weights, num_samples or len(index), **common)
    if not isinstance(balance, str):
        raise DetloaderValueError(f"balance={balance!r} must be a strategy name, a {{group: weight}} mapping or "
                                  "a Sampler")
    name, params = check_strategy(balance)
    if name == "repeat_factor":
        if num_samples is not None:
            raise DetloaderValueError(f"num_samples={num_samples} with balance='repeat_factor': the repeat factors "
                                      "set the epoch length")
        return RepeatFactorSampler.from_index(index, params.get("threshold", DEFAULT_THRESHOLD), by=by, **common)
    if name == "class_aware":
        return ClassAwareSampler.from_index(index, by, num_samples=num_samples, **common)
    weights = sample_weights(index, by, name, **params)  # type: ignore[arg-type]
    return WeightedSampler(weights, num_samples or len(index), **common)
