"""Samplers that balance classes: seeded, per-epoch, distributed, resumable.

Every sampler here follows one contract:

* **Deterministic from seed + epoch.** An epoch's draw comes from a numpy ``Generator``
  seeded with ``SeedSequence([seed, epoch, stream])``; the global RNGs of numpy, torch and
  Python are never touched. Call ``set_epoch(epoch)`` before each epoch (as with
  ``torch.utils.data.DistributedSampler``): otherwise every epoch repeats the same draw, and
  a second pass over an epoch that was already drawn warns once.
* **Distributed by construction.** ``rank`` and ``world_size`` default to
  ``torch.distributed``'s when a process group is initialised, else 0 and 1. All ranks derive
  the same *global* draw and rank ``r`` takes positions ``r, r + W, r + 2W, ...`` of it, so the
  union over ranks is exactly the single-process draw and every rank has the same length. When
  the global length is not a multiple of ``W`` it is padded (with-replacement samplers draw a
  few more; the others wrap around to the start, as DistributedSampler does) or, with
  ``drop_last=True``, cut.
* **Resumable.** ``state_dict()`` returns ``{"epoch", "offset", ...}`` where ``offset`` counts
  the items (indices, or batches for a batch sampler) this rank has yielded in the epoch;
  ``load_state_dict()`` makes the next iteration of that epoch start at ``offset``. A
  DataLoader's workers prefetch, so the sampler's own count runs ahead of training: use
  :class:`detloader.resume.ResumableLoader`, which counts consumed batches instead.

Samplers:

:class:`WeightedSampler`
    draws indices with probability proportional to ``weights``, with or without replacement,
    exact for any number of weights below 2**31 (``torch.multinomial`` refuses more than 2**24
    categories: pytorch issues 2576 and 43115). With replacement it uses Walker's alias method
    (built in O(n) exact integer arithmetic, one table lookup per draw); without replacement,
    Efraimidis-Spirakis exponential keys (the order of ``E_i / w_i``, ``E_i ~ Exp(1)``).
:class:`RepeatFactorSampler`
    LVIS repeat factors with stochastic rounding each epoch, shuffled.
:class:`ClassAwareSampler`
    round-robin over classes (a fresh class order every round), then the next image of that
    class from its own shuffled list (Shen et al. 2016).
:class:`BalancedBatchSampler`
    a batch sampler: P distinct classes x K images each.
:class:`DistributedSamplerWrapper`
    makes any sampler distributed (shares its draw across ranks) and forwards ``set_epoch``.

:func:`make_balanced_sampler` builds one of them from an index and a strategy name.
"""

from __future__ import annotations

import warnings
from abc import abstractmethod
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable, Iterator, Mapping, Sequence

import numpy as np
import torch
from torch.utils.data import Sampler

from detloader._system import local_world_size, usable_cpus
from detloader.annotations.index import AnnotationIndex
from detloader.balance.weights import (
    STRATEGIES,
    ByKey,
    class_members,
    parse_strategy,
    repeat_factors,
    sample_weights,
)

#: Draws per chunk: bounds temporary memory (and keeps it in cache), and fixes the random
#: streams: chunk k of an epoch always comes from the generator seeded (seed, epoch, stream, k).
CHUNK = 1 << 16
#: Indices are yielded to Python in slices of this many.
_YIELD_SLICE = 1 << 16
_MASK32 = np.uint64(0xFFFFFFFF)
_SHIFT32 = np.uint64(32)
#: Most weights a WeightedSampler takes: n * 2**32 must fit the int64 running sums.
MAX_WEIGHTS = (1 << 31) - 1

# Stream ids keep the draws of different sampler kinds apart for the same seed and epoch.
_STREAM_WEIGHTED, _STREAM_NO_REPLACEMENT, _STREAM_REPEAT = 1, 2, 3
_STREAM_CLASS_AWARE, _STREAM_BATCH, _STREAM_WRAPPER = 4, 5, 6


def distributed_defaults(rank: int | None, world_size: int | None) -> tuple[int, int]:
    """``(rank, world_size)``: the given values, else ``torch.distributed``'s when it is
    initialised, else ``(0, 1)``. Checks ``0 <= rank < world_size``."""
    initialised = torch.distributed.is_available() and torch.distributed.is_initialized()
    if world_size is None:
        world_size = torch.distributed.get_world_size() if initialised else 1
    if rank is None:
        rank = torch.distributed.get_rank() if initialised else 0
    if isinstance(world_size, bool) or not isinstance(world_size, (int, np.integer)) or world_size < 1:
        raise ValueError(f"world_size={world_size!r} must be an int >= 1")
    if isinstance(rank, bool) or not isinstance(rank, (int, np.integer)) or not 0 <= rank < world_size:
        raise ValueError(f"rank={rank!r} must be an int in [0, world_size={world_size})")
    return int(rank), int(world_size)


def _check_seed(seed: int) -> int:
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
        raise ValueError(f"seed={seed!r} must be an int >= 0")
    return int(seed)


def epoch_generator(seed: int, epoch: int, stream: int, *extra: int) -> np.random.Generator:
    """The generator of one (seed, epoch, stream[, chunk]) - independent streams by
    construction (numpy ``SeedSequence`` hashing), never the global RNG."""
    return np.random.Generator(np.random.PCG64(np.random.SeedSequence([seed, epoch, stream, *extra])))


def _index_dtype(n: int) -> type[np.integer]:
    return np.int32 if n <= np.iinfo(np.int32).max else np.int64


def shard(global_items: np.ndarray, rank: int, world_size: int, drop_last: bool) -> np.ndarray:
    """Rank ``rank``'s positions ``rank::world_size`` of ``global_items`` (1-D, or 2-D rows),
    after wrapping around to a multiple of ``world_size`` (or cutting, with ``drop_last``)."""
    total = len(global_items)
    if world_size == 1:
        return global_items
    if drop_last:
        size = (total // world_size) * world_size
        return global_items[:size][rank::world_size]
    size = -(-total // world_size) * world_size
    if size > total:
        if total == 0:
            return global_items[:0]
        reps = -(-size // total)
        global_items = np.concatenate([global_items] * reps)[:size]
    return global_items[rank::world_size]


class _EpochSampler(Sampler[Any]):
    """Shared machinery: seed, epoch, rank/world_size, resume offset, the repeat warning."""

    def __init__(
        self,
        *,
        seed: int,
        rank: int | None,
        world_size: int | None,
        drop_last: bool,
    ) -> None:
        self.seed = _check_seed(seed)
        self.rank, self.world_size = distributed_defaults(rank, world_size)
        self.drop_last = bool(drop_last)
        self.epoch = 0
        self._offset = 0  # items of this epoch yielded (or restored)
        self._resume = False  # load_state_dict set an offset for the next iteration
        self._drawn_epoch: int | None = None  # last epoch iterated to its end
        self._warned = False
        self._cache: tuple[int, np.ndarray] | None = None

    # -- subclasses -------------------------------------------------------------------------
    @abstractmethod
    def _rank_items(self) -> np.ndarray:
        """This rank's items of the current epoch: int array ``[L]`` (or ``[L, B]`` batches)."""

    def _cached(self, compute: Callable[[], np.ndarray]) -> np.ndarray:
        if self._cache is None or self._cache[0] != self.epoch:
            self._cache = None  # free the old draw before computing the new one
            self._cache = (self.epoch, compute())
        return self._cache[1]

    # -- the Sampler protocol ---------------------------------------------------------------
    def set_epoch(self, epoch: int) -> None:
        """Select the draw of ``epoch``. A pending resume offset of that same epoch (from
        :meth:`load_state_dict`) is kept; any other epoch starts at its beginning."""
        if isinstance(epoch, bool) or not isinstance(epoch, (int, np.integer)) or epoch < 0:
            raise ValueError(f"epoch={epoch!r} must be an int >= 0")
        if self._resume and int(epoch) == self.epoch:
            return
        if int(epoch) != self.epoch:
            self._cache = None  # the old epoch's draw is not kept beside the new one
        self.epoch = int(epoch)
        self._offset = 0
        self._resume = False

    def indices(self) -> np.ndarray:
        """This rank's items of the current epoch, from its beginning (a numpy array)."""
        return self._rank_items()

    def __iter__(self) -> Iterator[Any]:
        items = self._rank_items()
        if self._resume:
            start = min(self._offset, len(items))
            self._resume = False
        else:
            if self._drawn_epoch == self.epoch and not self._warned:
                warnings.warn(
                    f"{type(self).__name__}: epoch {self.epoch} is drawn again; call "
                    "set_epoch(epoch) before every epoch, or every epoch repeats the same draw",
                    UserWarning,
                    stacklevel=2,
                )
                self._warned = True
            start = 0
        self._offset = start
        for lo in range(start, len(items), _YIELD_SLICE):
            part = items[lo : lo + _YIELD_SLICE].tolist()
            for item in part:
                self._offset += 1
                yield item
        self._drawn_epoch = self.epoch

    def __len__(self) -> int:
        return len(self._rank_items())

    # -- resume -----------------------------------------------------------------------------
    def _config(self) -> dict[str, Any]:
        return {"seed": self.seed, "rank": self.rank, "world_size": self.world_size}

    def state_dict(self) -> dict[str, Any]:
        """``{"epoch", "offset", "kind", "seed", "rank", "world_size", ...}``: plain data."""
        return {"kind": type(self).__name__, "epoch": self.epoch, "offset": self._offset, **self._config()}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore epoch and offset: the next iteration yields the rest of that epoch.

        Raises ValueError when the state comes from a sampler of another kind or with another
        seed, rank or world size (its draw would differ)."""
        missing = {"epoch", "offset"} - set(state)
        if missing:
            raise ValueError(f"{type(self).__name__}.load_state_dict: state lacks {sorted(missing)}")
        kind = state.get("kind", type(self).__name__)
        if kind != type(self).__name__:
            raise ValueError(f"{type(self).__name__}.load_state_dict: state is from a {kind}")
        for key, value in self._config().items():
            if key in state and state[key] != value:
                raise ValueError(
                    f"{type(self).__name__}.load_state_dict: state has {key}={state[key]!r}, "
                    f"this sampler {key}={value!r}; its draw would differ"
                )
        offset = int(state["offset"])
        if offset < 0:
            raise ValueError(f"{type(self).__name__}.load_state_dict: offset={offset} < 0")
        self.epoch = int(state["epoch"])
        self._offset = offset
        self._resume = True
        self._drawn_epoch = None


# --------------------------------------------------------------------------------------------
# Weighted sampling
# --------------------------------------------------------------------------------------------


def _as_weights(weights: Any) -> np.ndarray:
    if isinstance(weights, torch.Tensor):
        weights = weights.detach().cpu().numpy()
    w = np.asarray(weights, dtype=np.float64)
    if w.ndim != 1 or len(w) == 0:
        raise ValueError(f"weights must be a non-empty 1-D sequence, got shape {w.shape}")
    if len(w) > MAX_WEIGHTS:
        raise ValueError(f"len(weights)={len(w)} exceeds {MAX_WEIGHTS}")
    bad = ~np.isfinite(w) | (w < 0)
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        raise ValueError(f"weights[{i}]={float(w[i])!r}: weights must be finite and >= 0")
    if not w.any():
        raise ValueError("weights are all zero: nothing can be drawn")
    return w


def _map(fn: Callable[[int], Any], count: int, threads: int) -> list[Any]:
    """``[fn(0), ..., fn(count - 1)]``, on up to ``threads`` threads. The heavy numpy calls
    inside release the GIL; results never depend on the thread count."""
    if threads <= 1 or count <= 1:
        return [fn(j) for j in range(count)]
    with ThreadPoolExecutor(min(threads, count)) as pool:
        return list(pool.map(fn, range(count)))


def default_threads() -> int:
    """Threads for building tables and drawing: the usable CPUs shared by the processes of
    this node (``LOCAL_WORLD_SIZE``, set by torchrun), at most 8."""
    return max(1, min(8, usable_cpus() // local_world_size()))


def alias_table(weights: np.ndarray, chunk: int = 1 << 18, threads: int = 1) -> np.ndarray:
    """Walker alias table of float64 ``weights`` ``[n]`` (n < 2**31), packed in uint64 ``[n]``.

    Entry ``b`` is ``(threshold << 32) | alias``: a draw picks bucket ``b`` uniformly and a
    uniform 32-bit ``v``; it returns ``b`` if ``v < threshold`` else ``alias``.

    Construction, in exact integer arithmetic: ``Q_i = round(w_i * n * 2**32 / sum(w))``, the
    rounding residual spread one unit each over the last indices, so that
    ``sum(Q) = n * 2**32`` exactly. Buckets of ``Q < 2**32`` ("smalls") keep ``Q`` and give the
    rest of their unit to a "large"; a large that has given away all but ``r < 2**32`` becomes
    a small itself, with alias the next large (Vose's order). In cumulative terms, with ``D``
    the running deficit ``2**32 - Q`` of the smalls and ``E`` the running excess
    ``Q - 2**32`` of the larges (both in index order, int64): small ``k``'s alias is the first
    large ``m`` with ``E_m >= D_{k-1}``; large ``m`` keeps ``2**32 + E_m - D_k`` for the first
    ``k`` with ``D_k > E_m`` and its alias is large ``m + 1``. With per-chunk totals known
    first, every chunk is then independent: its ``D`` starts from the chunk's prefix, and its
    merge with the window of ``E`` it reaches is local. O(n) work on ``threads`` threads,
    ``12 * n_large`` bytes of temporary memory besides the table; the table is the same for
    any ``chunk`` and ``threads``.

    So every index's probability is ``w_i / sum(w)`` within ``1.5 * 2**-32 / n`` (absolute):
    a relative error below 1e-9 for any weight above half the mean weight.
    """
    n = len(weights)
    unit = 1 << 32
    scale = n * float(unit) / float(np.sum(weights))
    table = np.empty(n, dtype=np.uint64)
    signed = table.view(np.int64)  # holds Q (non-negative) until an entry is packed
    starts = list(range(0, n, chunk))

    big: list[np.ndarray] = [np.zeros(0, dtype=np.int64)] * len(starts)  # larges per chunk

    def totals(j: int) -> tuple[int, int, int, int]:
        """Chunk j's sum of Q, number of larges, their excess and the smalls' deficit."""
        q = signed[starts[j] : starts[j] + chunk]
        big[j] = idx = np.flatnonzero(q >= unit)
        num = len(idx)
        total = int(q.sum())
        excess_sum = int(q[idx].sum()) - num * unit
        deficit_sum = (len(q) - num) * unit - (total - excess_sum - num * unit)
        return total, num, excess_sum, deficit_sum

    def quantise(j: int) -> tuple[int, int, int, int]:
        lo = starts[j]
        part = np.multiply(weights[lo : lo + chunk], scale)
        np.rint(part, out=part)
        signed[lo : lo + len(part)] = part
        return totals(j)

    # pass 1: Q, and per chunk the totals that make the chunks independent
    sums = _map(quantise, len(starts), threads)
    changed = _spread_residual(signed, n * unit - sum(s[0] for s in sums), chunk)
    if changed is not None:
        for j in range(changed // chunk, len(starts)):
            sums[j] = totals(j)
    at_start = np.concatenate([[0], np.cumsum([s[1] for s in sums])]).tolist()
    e_start = np.concatenate([[0], np.cumsum([s[2] for s in sums])]).tolist()
    d_start = np.concatenate([[0], np.cumsum([s[3] for s in sums])]).tolist()
    num_large = at_start[-1]
    large = np.empty(num_large, dtype=np.uint32)
    excess = np.empty(num_large, dtype=np.int64)

    def list_larges(j: int) -> None:
        lo, at, idx = starts[j], at_start[j], big[j]
        big[j] = np.zeros(0, dtype=np.int64)  # free as we go
        large[at : at + len(idx)] = idx + lo
        e = excess[at : at + len(idx)]
        np.subtract(signed[lo : lo + chunk][idx], unit, out=e)
        np.cumsum(e, out=e)
        e += e_start[j]

    _map(list_larges, len(starts), threads)
    last = num_large - 1

    def pair(j: int) -> None:
        """Chunk j's smalls get their aliases; the larges they exhaust get theirs."""
        lo = starts[j]
        hi = min(lo + chunk, n)
        is_small = np.ones(hi - lo, dtype=bool)
        is_small[large[at_start[j] : at_start[j + 1]].astype(np.int64) - lo] = False
        small_local = np.flatnonzero(is_small)
        if not len(small_local):
            return
        carry = d_start[j]  # running deficit D before this chunk
        qs = signed[lo:hi][small_local]
        deficit = unit - qs
        np.cumsum(deficit, out=deficit)
        deficit += carry
        # One merge of this chunk's D_{k-1} with the window of E that they reach:
        # p_j = #{k : D_{k-1} <= E_j} = 1 + #{k < last : D_k <= E_j} (E_j >= D_{-1} here).
        # Small k's alias is the first large m with E_m >= D_{k-1}, i.e.
        # m_k = w_lo + #{j : p_j <= k}; large j, if E_j < D_last, is exhausted by small
        # p_j - 1 (the first k with D_k > E_j).
        w_lo = int(np.searchsorted(excess, carry, side="left"))
        e_hi = int(np.searchsorted(excess, int(deficit[-1]), side="left"))
        window = excess[w_lo : min(e_hi + 1, num_large)]
        p = np.searchsorted(deficit[:-1], window, side="right")
        p += 1
        m = np.cumsum(np.bincount(p, minlength=len(deficit) + 1)[: len(deficit)])
        m += w_lo
        np.minimum(m, last, out=m)
        if e_hi > w_lo:
            k = p[: e_hi - w_lo] - 1
            keep = (unit + excess[w_lo:e_hi] - deficit[k]).view(np.uint64)
            nxt = large[np.minimum(np.arange(w_lo + 1, e_hi + 1), last)].astype(np.uint64)
            table[large[w_lo:e_hi]] = (keep << _SHIFT32) | nxt
        packed = qs.view(np.uint64) << _SHIFT32
        packed |= large[m]
        table[small_local + lo] = packed

    # pass 2: pair, chunk by chunk (every small Q is read before any write reaches it: a
    # chunk writes only its own smalls and larges, which no other chunk reads)
    _map(pair, len(starts), threads)
    # larges never exhausted keep their whole bucket: alias itself
    rest = large[int(np.searchsorted(excess, d_start[-1], side="left")) :]
    table[rest] = rest
    return table


def _spread_residual(q: np.ndarray, residual: int, chunk: int) -> int | None:
    """Add ``residual`` units to int64 ``q`` (non-negative), one per index, to the last
    indices that can take one (``q > 0``: a zero weight stays zero); what is left after one
    pass goes to the largest entry. Returns the smallest index changed (None: none)."""
    step = 1 if residual > 0 else -1
    left = abs(residual)
    changed: int | None = None
    for lo in reversed(range(0, len(q), chunk)):
        if left == 0:
            return changed
        part = q[lo : lo + chunk]
        able = np.flatnonzero(part > 0)[-left:] if left else np.zeros(0, dtype=np.int64)
        part[able] += step
        left -= len(able)
        if len(able):
            changed = lo + int(able[0])
    if left:
        top = int(np.argmax(q))
        q[top] += step * left
        changed = top if changed is None else min(changed, top)
    return changed


def alias_probabilities(table: np.ndarray) -> np.ndarray:
    """float64 ``[n]``: the exact draw probabilities an alias table encodes (for tests and
    for checking a table against its weights)."""
    n = len(table)
    thr = (table >> _SHIFT32).astype(np.float64) / 4294967296.0
    alias = (table & _MASK32).astype(np.int64)
    own = np.where(alias == np.arange(n), 1.0, thr)
    given = np.bincount(alias, weights=1.0 - own, minlength=n)
    return (own + given) / n


class WeightedSampler(_EpochSampler):
    """Indices drawn with probability proportional to ``weights``, per epoch, seeded.

    Args:
        weights: ``[n]`` non-negative finite weights (numpy, torch or a sequence; a float64
            numpy array is used without a copy, so do not modify it afterwards), n < 2**31.
        num_samples: draws per epoch over all ranks (default ``n``).
        replacement: draw with replacement (alias method, O(1) per draw) or without
            (exponential keys: every index at most once, in weighted-random order;
            ``num_samples`` must not exceed the number of positive weights).
        seed, rank, world_size, drop_last: see the module docstring.
        threads: threads that build the table and draw (default: the usable CPUs, at most
            8); the draws are the same for any number.

    The epoch's indices (all ranks) are :meth:`global_indices`; this rank's share is
    :meth:`indices` (int32). With replacement a rank computes only
    its own share: every draw depends only on its position in the epoch.
    """

    def __init__(
        self,
        weights: Any,
        num_samples: int | None = None,
        replacement: bool = True,
        *,
        seed: int = 0,
        rank: int | None = None,
        world_size: int | None = None,
        drop_last: bool = False,
        threads: int | None = None,
    ) -> None:
        super().__init__(seed=seed, rank=rank, world_size=world_size, drop_last=drop_last)
        if threads is None:
            threads = default_threads()
        if isinstance(threads, bool) or not isinstance(threads, (int, np.integer)) or threads < 1:
            raise ValueError(f"threads={threads!r} must be an int >= 1 (or None: the usable CPUs)")
        self.threads = int(threads)
        self.weights = _as_weights(weights)
        n = len(self.weights)
        if num_samples is None:
            num_samples = n
        if isinstance(num_samples, bool) or not isinstance(num_samples, (int, np.integer)) or num_samples < 1:
            raise ValueError(f"num_samples={num_samples!r} must be an int >= 1")
        self.num_samples = int(num_samples)
        self.replacement = bool(replacement)
        positive = int(np.count_nonzero(self.weights))
        if not self.replacement and self.num_samples > positive:
            raise ValueError(
                f"num_samples={num_samples} > {positive} positive weights: without replacement "
                "each index is drawn at most once"
            )
        self._positive = positive
        self._table = alias_table(self.weights, threads=self.threads) if self.replacement else None

    @property
    def total_size(self) -> int:
        """Global draws per epoch after padding to a multiple of world_size (or cutting)."""
        w = self.world_size
        return (self.num_samples // w) * w if self.drop_last else -(-self.num_samples // w) * w

    def __len__(self) -> int:
        return self.total_size // self.world_size

    def _config(self) -> dict[str, Any]:
        return {
            **super()._config(),
            "num_samples": self.num_samples,
            "replacement": self.replacement,
            "drop_last": self.drop_last,
        }

    def _draw_replacement(self, rank: int, world_size: int) -> np.ndarray:
        """This rank's draws: global positions ``rank::world_size`` of the epoch. Position
        ``p`` (chunk ``k = p // CHUNK``) depends only on its chunk's stream, so a rank draws
        only its own positions, a shorter epoch is a prefix of a longer one, and chunks can
        be drawn on several threads."""
        assert self._table is not None
        table = self._table
        n = len(self.weights)
        total = self.total_size
        los = range(0, total, CHUNK)
        firsts = [(rank - lo) % world_size for lo in los]
        counts = [max(0, -(-(min(CHUNK, total - lo) - f) // world_size)) for lo, f in zip(los, firsts)]
        offsets = np.concatenate([[0], np.cumsum(counts)]).tolist()
        out = np.empty(offsets[-1], dtype=_index_dtype(n))
        span = n << 32  # x uniform in [0, n * 2**32): bucket x >> 32, coin x & (2**32 - 1)

        def draw(k: int) -> None:
            lo = los[k]
            x = epoch_generator(self.seed, self.epoch, _STREAM_WEIGHTED, k).integers(
                0, span, size=min(CHUNK, total - lo), dtype=np.uint64
            )
            if world_size > 1:
                x = x[firsts[k] :: world_size]
            bucket = x >> _SHIFT32
            rec = np.take(table, bucket.view(np.int64))
            x &= _MASK32  # the coin
            accept = x < (rec >> _SHIFT32)
            rec &= _MASK32  # the alias
            np.copyto(rec, bucket, where=accept)
            out[offsets[k] : offsets[k + 1]] = rec

        _map(draw, len(los), self.threads)
        return out

    def _order_no_replacement(self) -> np.ndarray:
        """The first ``total_size`` indices of this epoch's weighted random order (all ranks)."""
        n = len(self.weights)
        keys = np.empty(n, dtype=np.float64)

        def fill(k: int) -> None:
            lo = k * CHUNK
            w = self.weights[lo : lo + CHUNK]
            rng = epoch_generator(self.seed, self.epoch, _STREAM_NO_REPLACEMENT, k)
            part = keys[lo : lo + len(w)]
            rng.standard_exponential(out=part)
            with np.errstate(divide="ignore"):
                np.divide(part, w, out=part)  # w = 0: inf, drawn last (never, see want)

        _map(fill, -(-n // CHUNK), self.threads)
        want = min(self.total_size, self._positive)
        if want < n // 4:
            top = np.argpartition(keys, want - 1)[:want]
            order = top[np.argsort(keys[top], kind="stable")]
        else:
            order = np.argsort(keys, kind="stable")[:want]
        order = order.astype(_index_dtype(n))
        if len(order) < self.total_size:  # more than the positive weights: wrap (module doc)
            order = np.resize(order, self.total_size)
        return order

    def global_indices(self) -> np.ndarray:
        """Every rank's draws of this epoch interleaved: rank r has positions r::world_size."""
        if self.replacement:
            return self._draw_replacement(0, 1)[: self.total_size] if self.world_size == 1 else (
                _interleave([self._draw_replacement(r, self.world_size) for r in range(self.world_size)])
            )
        return self._order_no_replacement()

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
            raise ValueError(
                f"WeightedSampler(replacement=False, num_samples={self.num_samples}) of "
                f"{self._positive} positive weights: inclusion probabilities have no closed "
                "form; use replacement=True or num_samples equal to the positive weights"
            )
        return (self.weights > 0).astype(np.float64)


def _interleave(parts: Sequence[np.ndarray]) -> np.ndarray:
    out = np.empty(sum(len(p) for p in parts), dtype=parts[0].dtype)
    for r, p in enumerate(parts):
        out[r :: len(parts)] = p
    return out


# --------------------------------------------------------------------------------------------
# Repeat factors
# --------------------------------------------------------------------------------------------


class RepeatFactorSampler(_EpochSampler):
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
        r = _as_weights(repeat_factors)
        self.repeat_factors = r
        self.shuffle = bool(shuffle)

    @classmethod
    def from_index(
        cls,
        index: AnnotationIndex,
        threshold: float = 0.001,
        *,
        by: ByKey = "class",
        **kwargs: Any,
    ) -> "RepeatFactorSampler":
        """Repeat factors of ``index`` (:func:`detloader.balance.weights.repeat_factors`)."""
        return cls(repeat_factors(index, threshold, by=by), **kwargs)

    def _config(self) -> dict[str, Any]:
        return {**super()._config(), "shuffle": self.shuffle, "drop_last": self.drop_last}

    def global_indices(self) -> np.ndarray:
        """This epoch's indices over all ranks, before padding."""
        r = self.repeat_factors
        n = len(r)
        rng = epoch_generator(self.seed, self.epoch, _STREAM_REPEAT)
        whole = np.floor(r)
        reps = whole.astype(np.int64) + (rng.random(n) < (r - whole))
        idx = np.repeat(np.arange(n, dtype=_index_dtype(n)), reps)
        if self.shuffle:
            rng.shuffle(idx)
        return idx

    def _rank_items(self) -> np.ndarray:
        return self._cached(
            lambda: shard(self.global_indices(), self.rank, self.world_size, self.drop_last)
        )

    def expected_counts(self) -> np.ndarray:
        """float64 ``[n]``: expected copies of each image per epoch (the repeat factors)."""
        return self.repeat_factors.copy()


# --------------------------------------------------------------------------------------------
# Class-aware samplers
# --------------------------------------------------------------------------------------------


def _as_members(class_members: Sequence[Any]) -> list[np.ndarray]:
    members = [np.unique(np.asarray(m, dtype=np.int64).reshape(-1)) for m in class_members]
    if not members or not any(len(m) for m in members):
        raise ValueError("class_members: no class has a member")
    for c, m in enumerate(members):
        if len(m) and m[0] < 0:
            raise ValueError(f"class_members[{c}] holds a negative id {int(m[0])}")
    return members


def members_from_labels(labels: Any) -> list[np.ndarray]:
    """Per class, the ids of the items with that label (``labels`` int ``[n]``; negative
    labels, e.g. MISSING, belong to no class)."""
    labels = np.asarray(labels, dtype=np.int64).reshape(-1)
    valid = np.flatnonzero(labels >= 0)
    if not len(valid):
        return []
    order = valid[np.argsort(labels[valid], kind="stable")]
    bounds = np.searchsorted(labels[order], np.arange(int(labels.max()) + 2))
    return [order[bounds[c] : bounds[c + 1]] for c in range(int(labels.max()) + 1)]


def _cycled_picks(rng: np.random.Generator, members: np.ndarray, count: int) -> np.ndarray:
    """``count`` picks from ``members``: consecutive shuffled passes over all of them, so every
    member is used once before any is used twice."""
    if count <= 0:
        return members[:0]
    passes = -(-count // len(members))
    keys = rng.random((passes, len(members)))
    return members[np.argsort(keys, axis=1).reshape(-1)[:count]]


class _ClassSampler(_EpochSampler):
    def __init__(self, class_members: Sequence[Any], **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.class_members = _as_members(class_members)
        self._classes = np.array([c for c, m in enumerate(self.class_members) if len(m)], dtype=np.int64)
        self.num_items = int(max(int(m[-1]) for m in self.class_members if len(m))) + 1
        self._distinct = len(np.unique(np.concatenate([m for m in self.class_members if len(m)])))

    def _visit_share(self) -> np.ndarray:
        """float64 ``[num_items]``: expected picks of each item per class visit, summed over
        its classes (``sum_c 1 / |members_c|``)."""
        share = np.zeros(self.num_items, dtype=np.float64)
        for c in self._classes:
            m = self.class_members[c]
            share[m] += 1.0 / len(m)
        return share


class ClassAwareSampler(_ClassSampler):
    """Class-aware sampling: visit classes round-robin (a new random class order each round),
    and on each visit take the next image of that class from its own shuffled list (reshuffled
    when used up). Every class gets the same number of draws per epoch (+-1).

    Args:
        class_members: per class, the ids of the items that contain it (an item may be in
            several); classes without members are skipped. From an index:
            :meth:`from_index`; from one label per item: :func:`members_from_labels`.
        num_samples: draws per epoch over all ranks (default: the number of distinct items).
    """

    def __init__(
        self,
        class_members: Sequence[Any],
        num_samples: int | None = None,
        *,
        seed: int = 0,
        rank: int | None = None,
        world_size: int | None = None,
        drop_last: bool = False,
    ) -> None:
        super().__init__(class_members, seed=seed, rank=rank, world_size=world_size, drop_last=drop_last)
        if num_samples is None:
            num_samples = self._distinct
        if isinstance(num_samples, bool) or not isinstance(num_samples, (int, np.integer)) or num_samples < 1:
            raise ValueError(f"num_samples={num_samples!r} must be an int >= 1")
        self.num_samples = int(num_samples)

    @classmethod
    def from_index(cls, index: AnnotationIndex, by: ByKey = "class", **kwargs: Any) -> "ClassAwareSampler":
        """Classes (groups) of ``index`` under key ``by`` (see :mod:`detloader.balance.weights`)."""
        return cls(class_members(index, by)[1], **kwargs)

    def _config(self) -> dict[str, Any]:
        return {**super()._config(), "num_samples": self.num_samples, "drop_last": self.drop_last}

    def global_indices(self) -> np.ndarray:
        """This epoch's indices over all ranks, before padding."""
        rng = epoch_generator(self.seed, self.epoch, _STREAM_CLASS_AWARE)
        classes = self._classes
        n, c = self.num_samples, len(classes)
        rounds = -(-n // c)
        seq = np.argsort(rng.random((rounds, c)), axis=1).reshape(-1)[:n]  # positions into classes
        out = np.empty(n, dtype=_index_dtype(self.num_items))
        order = np.argsort(seq, kind="stable")
        bounds = np.searchsorted(seq[order], np.arange(c + 1))
        for j in range(c):
            where = order[bounds[j] : bounds[j + 1]]
            out[where] = _cycled_picks(rng, self.class_members[classes[j]], len(where))
        return out

    def _rank_items(self) -> np.ndarray:
        return self._cached(
            lambda: shard(self.global_indices(), self.rank, self.world_size, self.drop_last)
        )

    def expected_counts(self) -> np.ndarray:
        """float64 ``[num_items]``: expected draws of each item per epoch, all ranks: each
        class gets ``num_samples / C`` draws in expectation, shared equally by its members."""
        return self._visit_share() * (self.num_samples / len(self._classes))


class BalancedBatchSampler(_ClassSampler):
    """A batch sampler: each batch holds ``classes_per_batch`` (P) distinct classes drawn
    uniformly, and ``samples_per_class`` (K) items of each, taken from the class's shuffled
    list (reshuffled when used up). Yields lists of ``P * K`` indices; pass it to a DataLoader
    as ``batch_sampler``. An item in two chosen classes, or a class with fewer than K
    members, can repeat an index within a batch.

    Args:
        class_members: as :class:`ClassAwareSampler`.
        classes_per_batch: P, at most the number of classes with members.
        samples_per_class: K.
        num_batches: batches per epoch over all ranks (default: distinct items // (P * K),
            at least 1). With ``world_size`` W, rank r gets batches r::W (wrapped or cut).
    """

    def __init__(
        self,
        class_members: Sequence[Any],
        classes_per_batch: int,
        samples_per_class: int,
        num_batches: int | None = None,
        *,
        seed: int = 0,
        rank: int | None = None,
        world_size: int | None = None,
        drop_last: bool = False,
    ) -> None:
        super().__init__(class_members, seed=seed, rank=rank, world_size=world_size, drop_last=drop_last)
        c = len(self._classes)
        for name, value in (("classes_per_batch", classes_per_batch), ("samples_per_class", samples_per_class)):
            if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
                raise ValueError(f"{name}={value!r} must be an int >= 1")
        if classes_per_batch > c:
            raise ValueError(f"classes_per_batch={classes_per_batch} > {c} classes with members")
        self.classes_per_batch = int(classes_per_batch)
        self.samples_per_class = int(samples_per_class)
        if num_batches is None:
            num_batches = max(1, self._distinct // (self.classes_per_batch * self.samples_per_class))
        if isinstance(num_batches, bool) or not isinstance(num_batches, (int, np.integer)) or num_batches < 1:
            raise ValueError(f"num_batches={num_batches!r} must be an int >= 1")
        self.num_batches = int(num_batches)

    @classmethod
    def from_index(
        cls,
        index: AnnotationIndex,
        classes_per_batch: int,
        samples_per_class: int,
        by: ByKey = "class",
        **kwargs: Any,
    ) -> "BalancedBatchSampler":
        return cls(class_members(index, by)[1], classes_per_batch, samples_per_class, **kwargs)

    @property
    def batch_size(self) -> int:
        return self.classes_per_batch * self.samples_per_class

    def _config(self) -> dict[str, Any]:
        return {
            **super()._config(),
            "classes_per_batch": self.classes_per_batch,
            "samples_per_class": self.samples_per_class,
            "num_batches": self.num_batches,
            "drop_last": self.drop_last,
        }

    def global_batches(self) -> np.ndarray:
        """int ``[num_batches, P * K]``: this epoch's batches over all ranks, before padding."""
        rng = epoch_generator(self.seed, self.epoch, _STREAM_BATCH)
        b, p, k = self.num_batches, self.classes_per_batch, self.samples_per_class
        c = len(self._classes)
        chosen = np.argpartition(rng.random((b, c)), p - 1, axis=1)[:, :p]  # uniform P-subsets
        flat = chosen.reshape(-1)
        out = np.empty((b * p, k), dtype=_index_dtype(self.num_items))
        order = np.argsort(flat, kind="stable")
        bounds = np.searchsorted(flat[order], np.arange(c + 1))
        for j in range(c):
            where = order[bounds[j] : bounds[j + 1]]
            picks = _cycled_picks(rng, self.class_members[self._classes[j]], len(where) * k)
            out[where] = picks.reshape(len(where), k)
        return out.reshape(b, p * k)

    def _rank_items(self) -> np.ndarray:
        return self._cached(
            lambda: shard(self.global_batches(), self.rank, self.world_size, self.drop_last)
        )

    def expected_counts(self) -> np.ndarray:
        """float64 ``[num_items]``: expected draws of each item per epoch, all ranks."""
        c = len(self._classes)
        return self._visit_share() * (
            self.num_batches * self.classes_per_batch / c * self.samples_per_class
        )


# --------------------------------------------------------------------------------------------
# Any sampler, distributed
# --------------------------------------------------------------------------------------------


class DistributedSamplerWrapper(_EpochSampler):
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
            raise ValueError(f"sampler={sampler!r} is not iterable")
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
                state = np.random.SeedSequence([self.seed, self.epoch, _STREAM_WRAPPER]).generate_state(1, np.uint64)
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


# --------------------------------------------------------------------------------------------
# The shortcut
# --------------------------------------------------------------------------------------------

#: Names make_balanced_sampler understands (strategy names of weights.py plus class_aware).
BALANCE_CHOICES: tuple[str, ...] = (*STRATEGIES, "class_aware")


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
    (explicit weights), or a strategy name, optionally with its parameter after a colon:
    ``"inverse"``, ``"sqrt"``, ``"power:0.3"``, ``"effective"`` / ``"effective:0.99"`` (beta),
    ``"repeat_factor"`` / ``"repeat_factor:0.1"`` (threshold), ``"class_aware"``.

    Weight strategies give a :class:`WeightedSampler` with replacement of ``num_samples``
    draws per epoch (default ``len(index)``); ``repeat_factor`` a :class:`RepeatFactorSampler`
    (``num_samples`` must be None: the factors set the length); ``class_aware`` a
    :class:`ClassAwareSampler`.
    """
    if isinstance(balance, Sampler):
        return balance
    common = {"seed": seed, "rank": rank, "world_size": world_size}
    if isinstance(balance, Mapping):
        weights = sample_weights(index, by, "explicit", class_weights=balance)
        return WeightedSampler(weights, num_samples or len(index), **common)
    if not isinstance(balance, str):
        raise ValueError(
            f"balance={balance!r} must be a strategy name, a {{group: weight}} mapping or a Sampler"
        )
    name, params = parse_strategy(balance)
    if name not in BALANCE_CHOICES:
        raise ValueError(f"balance={balance!r} is not one of {BALANCE_CHOICES}")
    if name == "explicit":
        raise ValueError("balance='explicit' needs the weights: pass balance={group: weight}")
    if name == "repeat_factor":
        if num_samples is not None:
            raise ValueError(
                f"num_samples={num_samples} with balance='repeat_factor': the repeat factors "
                "set the epoch length"
            )
        return RepeatFactorSampler(
            repeat_factors(index, params.get("threshold", 0.001), by=by), **common
        )
    if name == "class_aware":
        return ClassAwareSampler.from_index(index, by, num_samples=num_samples, **common)
    weights = sample_weights(index, by, name, **params)  # type: ignore[arg-type]
    return WeightedSampler(weights, num_samples or len(index), **common)
