"""Walker's alias method, exact: the table in int64 arithmetic, built and drawn chunk by chunk;
and the block inverse CDF that serves the first draws of an epoch over many weights without it.

A table of ``n`` weights (``n <= MAX_WEIGHTS``) is uint64 ``[n]``; entry ``b`` packs
``(threshold << 32) | alias``. A draw is one uniform uint64 ``x`` in ``[0, n * 2**32)``:
bucket ``x >> 32``, coin ``x & (2**32 - 1)``; it returns the bucket if the coin is below the
bucket's threshold, else its alias. Building and drawing run on threads
(:func:`thread_map`: the numpy calls release the GIL); the results never depend on the
number of threads or on the chunk size.
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np

from detloader._system import local_world_size, usable_cpus

#: Most weights a table takes: n * 2**32 must fit the int64 running sums.
MAX_WEIGHTS = (1 << 31) - 1
#: Above this many weights (where the table takes over a second to build) a sampler draws the
#: first ``FAST_START`` positions of every epoch by :func:`block_draw` and builds the table
#: when a later position first needs it: the first batches do not wait for it.
FAST_START_WEIGHTS, FAST_START = 1 << 24, 1 << 20
_BLOCK = 16  # weights per block of block_cdf
_MASK32 = np.uint64(0xFFFFFFFF)
_SHIFT32 = np.uint64(32)
_UNIT = 1 << 32  # a bucket's whole mass in the table's fixed point


def thread_map(fn: Callable[[int], Any], count: int, threads: int) -> list[Any]:
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


def alias_table(weights: np.ndarray, chunk: int = 1 << 16, threads: int = 1) -> np.ndarray:
    """Walker alias table of float64 ``weights`` ``[n]`` (n < 2**31), packed as the module says:
    every index's probability is ``w_i / sum(w)`` within ``1.5 * 2**-32 / n`` (absolute), and
    the table is the same for any ``chunk`` and ``threads``.

    Construction: Vose's pairing as merges of the running deficit ``D`` of the smalls and excess
    ``E`` of the larges, chunk by chunk (docs/balancing.md, "Exact weighted sampling beyond 2**24").
    """
    n = len(weights)
    build = _TableBuild(weights, chunk)
    count = len(build.starts)
    # pass 1: Q, and per chunk the totals that make the chunks independent
    sums = thread_map(build.quantise, count, threads)
    changed = _spread_residual(build.signed, n * _UNIT - sum(s[0] for s in sums), chunk)
    if changed is not None:
        for j in range(changed // chunk, count):
            sums[j] = build.totals(j)
    build.prepare_larges(sums)
    thread_map(build.list_larges, count, threads)
    # pass 2: pair, chunk by chunk (every small Q is read before any write reaches it: a
    # chunk writes only its own smalls and larges, which no other chunk reads)
    thread_map(build.pair, count, threads)
    return build.finish()


class _TableBuild:
    """One :func:`alias_table` build: the table (holding ``Q`` until an entry is packed) and
    what its per-chunk passes share. Each pass's method takes a chunk number ``j``, so that
    the chunks can run on threads (:func:`thread_map`)."""

    def __init__(self, weights: np.ndarray, chunk: int) -> None:
        self.weights, self.chunk, self.n = weights, chunk, len(weights)
        self.scale = self.n * float(_UNIT) / float(np.sum(weights))
        self.table = np.empty(self.n, dtype=np.uint64)
        self.signed = self.table.view(np.int64)  # holds Q (non-negative) until an entry is packed
        self.starts = list(range(0, self.n, chunk))
        self.big: list[np.ndarray] = [np.zeros(0, dtype=np.int64)] * len(self.starts)  # larges per chunk

    def totals(self, j: int) -> tuple[int, int, int, int]:
        """Chunk j's sum of Q, number of larges, their excess and the smalls' deficit."""
        q = self.signed[self.starts[j] : self.starts[j] + self.chunk]
        self.big[j] = idx = np.flatnonzero(q >= _UNIT)
        num = len(idx)
        total = int(q.sum())
        excess_sum = int(q[idx].sum()) - num * _UNIT
        deficit_sum = (len(q) - num) * _UNIT - (total - excess_sum - num * _UNIT)
        return total, num, excess_sum, deficit_sum

    def quantise(self, j: int) -> tuple[int, int, int, int]:
        """Chunk j's Q (its weights scaled to ``n * 2**32`` in all, rounded), and its totals."""
        lo = self.starts[j]
        part = np.multiply(self.weights[lo : lo + self.chunk], self.scale)
        np.rint(part, out=part)
        self.signed[lo : lo + len(part)] = part
        return self.totals(j)

    def prepare_larges(self, sums: list[tuple[int, int, int, int]]) -> None:
        """From the chunks' totals: where each chunk's larges, excess ``E`` and deficit ``D``
        start, and the arrays of all larges and their running excess."""
        self.at_start = np.concatenate([[0], np.cumsum([s[1] for s in sums])]).tolist()
        self.e_start = np.concatenate([[0], np.cumsum([s[2] for s in sums])]).tolist()
        self.d_start = np.concatenate([[0], np.cumsum([s[3] for s in sums])]).tolist()
        num_large = self.at_start[-1]
        self.large = np.empty(num_large, dtype=np.uint32)
        self.excess = np.empty(num_large, dtype=np.int64)

    def list_larges(self, j: int) -> None:
        """Chunk j's larges and their running excess ``E`` into ``large`` and ``excess``."""
        lo, at, idx = self.starts[j], self.at_start[j], self.big[j]
        self.big[j] = np.zeros(0, dtype=np.int64)  # free as we go
        self.large[at : at + len(idx)] = idx + lo
        e = self.excess[at : at + len(idx)]
        np.subtract(self.signed[lo : lo + self.chunk][idx], _UNIT, out=e)
        np.cumsum(e, out=e)
        e += self.e_start[j]

    def pair(self, j: int) -> None:
        """Chunk j's smalls get their aliases; the larges they exhaust get theirs."""
        unit, table, large, excess = _UNIT, self.table, self.large, self.excess
        num_large = len(large)
        last = num_large - 1
        lo = self.starts[j]
        hi = min(lo + self.chunk, self.n)
        is_small = np.ones(hi - lo, dtype=bool)
        is_small[large[self.at_start[j] : self.at_start[j + 1]].astype(np.int64) - lo] = False
        small_local = np.flatnonzero(is_small)
        if not len(small_local):
            return
        carry = self.d_start[j]  # running deficit D before this chunk
        qs = self.signed[lo:hi][small_local]
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

    def finish(self) -> np.ndarray:
        """The table, once the larges never exhausted keep their whole bucket (alias itself)."""
        rest = self.large[int(np.searchsorted(self.excess, self.d_start[-1], side="left")) :]
        self.table[rest] = rest
        return self.table


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


def alias_draw(table: np.ndarray, x: np.ndarray) -> np.ndarray:
    """The indices that uniform uint64 draws ``x`` in ``[0, n * 2**32)`` pick from ``table``
    (uint64 ``[n]``, :func:`alias_table`): uint64 ``[len(x)]``. ``x`` is overwritten."""
    bucket = x >> _SHIFT32
    rec = np.take(table, bucket.view(np.int64))
    x &= _MASK32  # the coin
    accept = x < (rec >> _SHIFT32)
    rec &= _MASK32  # the alias
    np.copyto(rec, bucket, where=accept)
    return rec


def block_cdf(weights: np.ndarray) -> np.ndarray:
    """float64 running sums of float64 ``weights`` by blocks of 16 (the last may be shorter):
    all :func:`block_draw` needs, from one pass over the weights."""
    n, full = len(weights), len(weights) // _BLOCK
    sums = np.empty(-(-n // _BLOCK), dtype=np.float64)
    np.sum(weights[: full * _BLOCK].reshape(full, _BLOCK), axis=1, out=sums[:full])
    if full < len(sums):
        sums[full] = np.sum(weights[full * _BLOCK :])
    return np.cumsum(sums, out=sums)


def block_draw(weights: np.ndarray, cdf: np.ndarray, x: np.ndarray) -> np.ndarray:
    """The indices (int64) that uniform uint64 draws ``x`` in ``[0, n * 2**32)`` pick by
    inverse CDF: the block by binary search in ``cdf`` (:func:`block_cdf`; the draws sorted
    first, which makes the search walk the array), then the index by a running sum within
    the block. Exact up to float64 rounding (far below the table's ``2**-32 / n``); a zero
    weight is never drawn (its interval is empty, and a target rounded past a block's last
    sum takes the block's last positive weight)."""
    n, full = len(weights), len(weights) // _BLOCK
    target = x.astype(np.float64)
    target *= cdf[-1] / (float(n) * 2.0**32)
    order = np.argsort(target)
    target = target[order]
    block = np.searchsorted(cdf, target, side="right")
    np.minimum(block, len(cdf) - 1, out=block)  # a target rounded up to the total
    target -= np.where(block > 0, cdf[block - 1], 0.0)  # now the offset within the block
    rows = np.zeros((len(x), _BLOCK), dtype=np.float64)
    inside = block < full
    rows[inside] = np.take(weights[: full * _BLOCK].reshape(full, _BLOCK), block[inside], axis=0)
    rows[~inside, : n - full * _BLOCK] = weights[full * _BLOCK :]
    at = np.count_nonzero(np.cumsum(rows, axis=1) <= target[:, None], axis=1)
    past = np.flatnonzero(at == _BLOCK)
    at[past] = _BLOCK - 1 - np.argmax(rows[past, ::-1] > 0, axis=1)
    out = np.empty(len(x), dtype=np.int64)
    out[order] = block * _BLOCK + at
    return out
