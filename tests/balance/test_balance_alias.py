"""The exact alias table: the probabilities it encodes, chunking."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from detloader.balance.alias import alias_table


def alias_probabilities(table: np.ndarray) -> np.ndarray:
    """float64 ``[n]``: the exact draw probabilities an alias table encodes."""
    n = len(table)
    thr = (table >> np.uint64(32)).astype(np.float64) / 4294967296.0
    alias = (table & np.uint64(0xFFFFFFFF)).astype(np.int64)
    own = np.where(alias == np.arange(n), 1.0, thr)
    given = np.bincount(alias, weights=1.0 - own, minlength=n)
    return (own + given) / n


@settings(max_examples=150, deadline=None)
@given(
    st.lists(
        st.one_of(st.just(0.0), st.floats(1e-6, 1e6, allow_nan=False, allow_infinity=False)),
        min_size=1,
        max_size=80,
    ).filter(lambda w: any(w)),
    st.sampled_from([1, 2, 7, 1 << 20]),
)
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
