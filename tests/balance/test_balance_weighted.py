"""WeightedSampler: exact weighted draws, frequencies vs expectation, determinism, threads."""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch
from balance_helpers import P_MIN, chi_square_test

import detloader
from detloader.balance import WeightedSampler, balance_groups, sample_weights
from detloader.balance.alias import alias_table
from detloader.stats import group_totals


def test_frequencies_match_weights_chi_square():
    """One epoch of 300 000 draws over 50 indices with weights 1..50: the counts fit the
    multinomial expectation (Pearson chi-square, p > 1e-3 at seed 7)."""
    w = np.arange(1, 51, dtype=np.float64)
    s = WeightedSampler(w, num_samples=300_000, seed=7)
    counts = np.bincount(s.indices(), minlength=50)
    result = chi_square_test(counts, s.expected_counts())
    assert result.dof == 49
    assert result.p_value > P_MIN, result


def test_frequencies_fail_for_wrong_expectation():
    """The frequency test can fail: the same draw against a slightly wrong expectation."""
    w = np.arange(1, 51, dtype=np.float64)
    counts = np.bincount(WeightedSampler(w, num_samples=300_000, seed=7).indices(), minlength=50)
    wrong = np.arange(1, 51) + 0.5
    assert chi_square_test(counts, wrong / wrong.sum() * 300_000).p_value < P_MIN


def test_class_frequencies_over_many_draws_match_the_analytic_expectation(synth_root):
    """Balanced by image class with inverse weights, 200 000 draws from the 200-image synthetic
    set: (1) image-class counts fit the expectation (chi-square, p > 1e-3); (2) per-image
    counts too (200 cells); (3) object-class counts, which are sums over images with several
    objects, lie within 4 standard deviations of the expectation (exact multinomial
    variance)."""
    idx = detloader.read_annotations(synth_root)
    draws = 200_000
    w = sample_weights(idx, "image_class", "inverse")
    s = WeightedSampler(w, num_samples=draws, seed=11)
    per_image = np.bincount(s.indices(), minlength=len(idx)).astype(np.float64)
    expected_images = s.expected_counts()
    g = balance_groups(idx, "image_class")
    observed = group_totals(g, per_image)
    expected = group_totals(g, expected_images)
    np.testing.assert_allclose(expected, draws / 3)  # inverse balances image classes exactly
    assert chi_square_test(observed, expected).p_value > P_MIN
    assert chi_square_test(per_image, expected_images).p_value > P_MIN
    objects = balance_groups(idx, "class")
    m = np.stack([group_totals(objects, (np.arange(len(idx)) == i).astype(float)) for i in range(len(idx))])
    p = s.probabilities()
    mean = draws * (p @ m)
    var = draws * (p @ m**2 - (p @ m) ** 2)
    z = (group_totals(objects, per_image) - mean) / np.sqrt(var)
    assert np.abs(z).max() < 4, z


def test_beyond_two_to_the_24_categories():
    """2**24 + 10 weights, only the last 10 positive: every draw is one of them, with the
    right frequencies; torch.multinomial refuses this many categories."""
    n = (1 << 24) + 10
    w = np.zeros(n)
    w[-10:] = np.arange(1, 11)
    s = WeightedSampler(w, num_samples=200_000, seed=3)
    idx = s.indices()
    assert idx.min() >= n - 10
    counts = np.bincount(idx - (n - 10), minlength=10)
    assert chi_square_test(counts, np.arange(1, 11) / 55 * 200_000).p_value > P_MIN
    with pytest.raises(RuntimeError, match="2\\^24"):
        torch.multinomial(torch.as_tensor(w), 10, True)


def test_deterministic_and_independent_of_global_rngs():
    w = np.random.default_rng(0).random(1000)
    np_state, torch_state, py_state = np.random.get_state(), torch.get_rng_state(), random.getstate()
    a = WeightedSampler(w, seed=5)
    first = list(a)
    assert np.array_equal(np.random.get_state()[1], np_state[1])
    assert torch.equal(torch.get_rng_state(), torch_state) and random.getstate() == py_state
    np.random.seed(123)
    torch.manual_seed(123)
    assert list(WeightedSampler(w, seed=5)) == first  # global seeds do not matter
    assert list(WeightedSampler(w, seed=6)) != first
    a.set_epoch(1)
    second = list(a)
    assert second != first and len(second) == len(first) == 1000
    b = WeightedSampler(w, seed=5)
    b.set_epoch(1)
    assert list(b) == second


def test_without_replacement_draws_each_index_once_in_weighted_order():
    w = np.array([0.0, 1, 2, 3, 4, 0, 5])
    s = WeightedSampler(w, num_samples=5, replacement=False, seed=0)
    got = list(s)
    assert sorted(got) == [1, 2, 3, 4, 6]
    with pytest.raises(ValueError, match="num_samples=6 > 5 positive weights"):
        WeightedSampler(w, num_samples=6, replacement=False)
    # the first pick of each epoch follows the weights (chi-square over 3000 epochs)
    firsts = []
    for epoch in range(3000):
        s.set_epoch(epoch)
        firsts.append(int(s.indices()[0]))
    counts = np.bincount(firsts, minlength=7)[[1, 2, 3, 4, 6]]
    assert chi_square_test(counts, np.array([1, 2, 3, 4, 5]) / 15 * 3000).p_value > P_MIN


def test_partial_without_replacement_is_the_prefix_of_the_full_order():
    w = np.random.default_rng(1).random(5000)
    full = WeightedSampler(w, num_samples=5000, replacement=False, seed=2).indices()
    part = WeightedSampler(w, num_samples=100, replacement=False, seed=2).indices()
    assert np.array_equal(part, full[:100])


@pytest.mark.parametrize("bad, match", [
    ([], "non-empty"), ([1, -1], "weights\\[1\\]=-1.0"), ([0, 0], "all zero"),
    ([1, float("nan")], "finite"), ([[1, 2]], "1-D"),
])
def test_bad_weights(bad, match):
    with pytest.raises(ValueError, match=match):
        WeightedSampler(bad)


@pytest.mark.parametrize("kwargs, match", [
    ({"num_samples": 0}, "num_samples=0"), ({"seed": -1}, "seed=-1"),
    ({"rank": 2, "world_size": 2}, "rank=2"), ({"world_size": 0}, "world_size=0"),
])
def test_bad_arguments_echo_name_and_value(kwargs, match):
    with pytest.raises(ValueError, match=match):
        WeightedSampler([1.0, 2.0], **kwargs)



def test_threads_change_nothing():
    w = np.random.default_rng(5).lognormal(0, 2, 300_000)
    assert np.array_equal(alias_table(w, 1 << 12, threads=1), alias_table(w, 1 << 16, threads=3))
    for replacement in (True, False):
        one = WeightedSampler(w, replacement=replacement, seed=1, threads=1, rank=1, world_size=3)
        many = WeightedSampler(w, replacement=replacement, seed=1, threads=4, rank=1, world_size=3)
        assert np.array_equal(one.indices(), many.indices())
    with pytest.raises(ValueError, match="threads=0"):
        WeightedSampler(w, threads=0)


@pytest.mark.parametrize("world_size, rank", [(1, 0), (3, 2)])
def test_iteration_draws_chunk_by_chunk_the_same_items_as_indices(world_size, rank):
    """Iterating draws the chunks as it reaches them (the first items of a long epoch need
    no full draw), and yields exactly indices(); a resume at any offset yields the rest."""
    from detloader.balance.base import CHUNK

    w = np.random.default_rng(2).random(1000)
    kw = dict(num_samples=3 * CHUNK + 123, seed=9, rank=rank, world_size=world_size, threads=2)
    lazy = WeightedSampler(w, **kw)
    it = iter(lazy)
    head = [next(it) for _ in range(10)]
    assert lazy._cache is None  # nothing of the epoch beyond the first chunks was drawn
    whole = WeightedSampler(w, **kw).indices()
    assert head == whole[:10].tolist()
    assert head + list(it) == whole.tolist()
    for offset in (0, 5, CHUNK // world_size + 1, len(whole) - 1, len(whole)):
        resumed = WeightedSampler(w, **kw)
        resumed.load_state_dict({"epoch": 0, "offset": offset})
        assert list(resumed) == whole[offset:].tolist()
        assert resumed.state_dict()["offset"] == len(whole)


def test_many_weights_start_without_the_alias_table(monkeypatch):
    """Above FAST_START_WEIGHTS the first FAST_START positions of every epoch come from the
    block inverse CDF and the table is built when a later position first needs it; the
    draws still follow the weights, and iteration, indices(), resumes and ranks agree."""
    from detloader.balance import alias
    from detloader.balance.base import CHUNK

    monkeypatch.setattr(alias, "FAST_START_WEIGHTS", 500)
    monkeypatch.setattr(alias, "FAST_START", 2 * CHUNK)
    w = np.random.default_rng(4).lognormal(0, 1, 1000)
    w[::9] = 0.0
    kw = dict(num_samples=4 * CHUNK, seed=3, threads=2)
    lazy = WeightedSampler(w, **kw)
    it = iter(lazy)
    head = [next(it) for _ in range(2 * CHUNK - 1)]
    assert "_table" not in vars(lazy)  # the first two chunks needed no table
    rest = list(it)
    assert "_table" in vars(lazy)
    whole = WeightedSampler(w, **kw).indices()
    assert head + rest == whole.tolist()
    for part in (whole[: 2 * CHUNK], whole[2 * CHUNK :]):  # block draws, then alias draws
        counts = np.bincount(part, minlength=len(w))
        assert chi_square_test(counts, len(part) * w / w.sum()).p_value > P_MIN
    for offset in (5, 2 * CHUNK + 7):
        resumed = WeightedSampler(w, **kw)
        resumed.load_state_dict({"epoch": 0, "offset": offset})
        assert list(resumed) == whole[offset:].tolist()
    ranks = [WeightedSampler(w, **kw, rank=r, world_size=3).indices() for r in range(3)]
    assert np.array_equal(WeightedSampler(w, **kw, world_size=3, rank=0).global_indices()[: len(whole)],
                          np.stack(ranks, 1).reshape(-1)[: len(whole)])


def test_an_iteration_keeps_the_epoch_it_started_with():
    """set_epoch while an iterator is still running does not change what it yields."""
    from detloader.balance.base import CHUNK

    w = np.random.default_rng(3).random(100)
    kw = dict(num_samples=2 * CHUNK * 8 + 5, seed=1, threads=1)
    whole = WeightedSampler(w, **kw).indices().tolist()
    s = WeightedSampler(w, **kw)
    it = iter(s)
    head = [next(it) for _ in range(3)]
    s.set_epoch(1)
    assert head + list(it) == whole
