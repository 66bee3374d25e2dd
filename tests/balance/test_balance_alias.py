"""The exact alias table: the probabilities it encodes, chunking; the block inverse CDF."""

from __future__ import annotations

import numpy as np
from balance_helpers import P_MIN, chi_square_test
from hypothesis import given, settings
from hypothesis import strategies as st

from detloader.balance.alias import alias_table, block_cdf, block_draw


def _weights(max_size: int) -> st.SearchStrategy[list[float]]:
    """Lists of weights, zeros among them, not all zero."""
    weight = st.one_of(st.just(0.0), st.floats(1e-6, 1e6, allow_nan=False, allow_infinity=False))
    return st.lists(weight, min_size=1, max_size=max_size).filter(lambda w: any(w))


def alias_probabilities(table: np.ndarray) -> np.ndarray:
    """float64 ``[n]``: the exact draw probabilities an alias table encodes."""
    n = len(table)
    thr = (table >> np.uint64(32)).astype(np.float64) / 4294967296.0
    alias = (table & np.uint64(0xFFFFFFFF)).astype(np.int64)
    own = np.where(alias == np.arange(n), 1.0, thr)
    given = np.bincount(alias, weights=1.0 - own, minlength=n)
    return (own + given) / n


@settings(max_examples=150, deadline=None)
@given(_weights(max_size=80), st.sampled_from([1, 2, 7, 1 << 20]))
def test_alias_table_encodes_the_weights_exactly(weights, chunk):
    """The probabilities a table encodes equal w / sum(w) within 1.5 * 2**-32 / n, for any
    chunking of the build; zero weights are never drawn."""
    w = np.array(weights)
    table = alias_table(w, chunk)
    p = alias_probabilities(table)
    n = len(w)
    assert np.abs(p - w / w.sum()).max() <= 1.5 * 2.0**-32 / n + 1e-15
    assert (p[w == 0] == 0).all()
    assert np.array_equal(table, alias_table(w, 1 << 20))  # the chunking changes nothing


def test_alias_table_heavy_tail_is_exact_relative_to_each_weight():
    w = np.exp(np.random.default_rng(0).normal(0, 3, 100_000))
    p = alias_probabilities(alias_table(w, chunk=4096))
    q = w * len(w) / w.sum()
    exact = w / w.sum()
    big = q > 0.5
    assert (np.abs(p - exact)[big] / exact[big]).max() < 1e-9


@settings(max_examples=60, deadline=None)
@given(_weights(max_size=70), st.integers(0, 2**32 - 1))
def test_block_draw_is_the_inverse_cdf(weights, seed):
    """Every draw lands where the uniform falls in the running sum of the weights (up to
    float64 rounding), never on a zero weight, and the extreme draws stay in range."""
    w = np.array(weights)
    n = len(w)
    x = np.random.default_rng(seed).integers(0, n << 32, size=2000, dtype=np.uint64)
    x[:2] = [0, (n << 32) - 1]
    got = block_draw(w, block_cdf(w), x)
    assert ((got >= 0) & (got < n)).all() and (w[got] > 0).all()
    cdf = np.cumsum(w) / w.sum()
    u = x.astype(np.float64) / (n * 2.0**32)
    lo = np.where(got > 0, cdf[np.maximum(got - 1, 0)], 0.0)
    assert (lo <= u + 1e-12).all() and (u <= cdf[got] + 1e-12).all()


def test_block_draw_frequencies_match_the_weights():
    w = np.random.default_rng(1).lognormal(0, 1, 1001)  # a short last block
    w[::7] = 0.0
    x = np.random.default_rng(2).integers(0, len(w) << 32, size=400_000, dtype=np.uint64)
    counts = np.bincount(block_draw(w, block_cdf(w), x), minlength=len(w))
    assert chi_square_test(counts, len(x) * w / w.sum()).p_value > P_MIN
