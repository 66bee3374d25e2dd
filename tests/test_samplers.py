"""Samplers: exact weighted draws, frequencies vs expectation, determinism, sharding, resume."""

from __future__ import annotations

import random
import warnings

import numpy as np
import pytest
import torch
from balance_helpers import tiny_index
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.utils.data import BatchSampler, SequentialSampler, WeightedRandomSampler

import detloader
from detloader.balance import (
    BalancedBatchSampler,
    ClassAwareSampler,
    DistributedSamplerWrapper,
    RepeatFactorSampler,
    WeightedSampler,
    make_balanced_sampler,
    members_from_labels,
)
from detloader.balance.alias import alias_probabilities, alias_table
from detloader.balance.distributed import shard
from detloader.stats import chi_square_test, group_totals
from detloader.balance import balance_groups, class_members, sample_weights

#: Significance threshold of every frequency test here: a correct sampler fails one of them
#: with probability 1e-3 for a random seed; the seeds are fixed, so the outcome is too.
P_MIN = 1e-3


# -- the alias table ---------------------------------------------------------------------------


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


# -- WeightedSampler -------------------------------------------------------------------------


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


# -- sharding --------------------------------------------------------------------------------


@pytest.mark.parametrize("world", [2, 3])
@pytest.mark.parametrize("replacement", [True, False])
def test_ranks_partition_the_global_draw(world, replacement):
    w = np.random.default_rng(2).random(101) + 0.01
    single = WeightedSampler(w, replacement=replacement, seed=4)
    ranks = [WeightedSampler(w, replacement=replacement, seed=4, rank=r, world_size=world) for r in range(world)]
    for s in (single, *ranks):
        s.set_epoch(3)
    parts = [r.indices() for r in ranks]
    assert len({len(p) for p in parts}) == 1 and len(parts[0]) == -(-101 // world)
    union = np.empty(sum(len(p) for p in parts), dtype=np.int64)
    for r, p in enumerate(parts):
        union[r::world] = p
    assert np.array_equal(union, ranks[0].global_indices())
    assert np.array_equal(union[:101], single.indices())  # padding only appends
    if not replacement:
        # 101 positive weights, padded size > 101: the padding wraps; everything else is unique
        assert len(np.unique(union[:101])) == 101


def test_no_overlap_between_ranks_without_replacement():
    w = np.ones(1000)
    parts = [set(WeightedSampler(w, num_samples=600, replacement=False, seed=0, rank=r, world_size=4)) for r in range(4)]
    assert all(len(p) == 150 for p in parts)
    assert len(set.union(*parts)) == 600  # disjoint


def test_drop_last_cuts_to_equal_lengths():
    s = [WeightedSampler(np.ones(10), seed=0, rank=r, world_size=3, drop_last=True) for r in range(3)]
    assert [len(x) for x in s] == [3, 3, 3]
    assert [len(list(x)) for x in s] == [3, 3, 3]


def test_shard_wraps_rows():
    rows = np.arange(10).reshape(5, 2)
    assert shard(rows, 1, 3, False).tolist() == [[2, 3], [8, 9]]
    assert shard(rows, 2, 3, False).tolist() == [[4, 5], [0, 1]]  # padded by wrapping to row 0
    assert shard(rows, 0, 3, True).tolist() == [[0, 1]]


# -- repeat factors --------------------------------------------------------------------------


def test_repeat_factor_sampler_rounds_stochastically():
    r = np.array([1.0, 1.5, 2.25, 3.0, 0.5])
    s = RepeatFactorSampler(r, seed=1)
    extra = np.zeros(5)
    epochs = 2000
    for epoch in range(epochs):
        s.set_epoch(epoch)
        counts = np.bincount(s.indices(), minlength=5)
        assert (counts >= np.floor(r)).all() and (counts <= np.ceil(r)).all()
        assert len(s) == counts.sum()
        extra += counts - np.floor(r)
    # extra copies ~ Binomial(epochs, frac(r)): within 4 sd
    frac = r - np.floor(r)
    sd = np.sqrt(epochs * frac * (1 - frac))
    keep = sd > 0
    assert (np.abs(extra - epochs * frac)[keep] / sd[keep]).max() < 4
    assert (extra[~keep] == 0).all()
    np.testing.assert_allclose(s.expected_counts(), r)


def test_repeat_factor_sampler_shuffles():
    s = RepeatFactorSampler(np.full(50, 2.0), seed=0)
    idx = s.indices()
    assert sorted(idx.tolist()) == sorted(list(range(50)) * 2)
    assert idx.tolist() != sorted(idx.tolist())
    assert RepeatFactorSampler(np.full(50, 2.0), shuffle=False).indices().tolist() == sorted(idx.tolist())


# -- class-aware samplers --------------------------------------------------------------------


def test_members_from_labels():
    assert [m.tolist() for m in members_from_labels([2, 0, -1, 2, 0])] == [[1, 4], [], [0, 3]]


def test_class_aware_visits_classes_equally_and_cycles_members():
    members = [[0, 1, 2, 3, 4, 5, 6, 7], [8, 9], [10]]  # very unequal classes
    s = ClassAwareSampler(members, num_samples=31, seed=0)
    idx = s.indices()
    cls = np.array([0] * 8 + [1] * 2 + [2])[idx]
    assert sorted(np.bincount(cls, minlength=3).tolist()) == [10, 10, 11]  # 31 / 3 each, +-1
    # within a class: every member once before any member twice
    first_eight = idx[cls == 0][:8]
    assert sorted(first_eight.tolist()) == list(range(8))
    # the expectation: each class gets num_samples / 3, shared equally by its members
    np.testing.assert_allclose(s.expected_counts(), [31 / 3 / 8] * 8 + [31 / 3 / 2] * 2 + [31 / 3])


def test_class_aware_frequencies_match_expectation():
    idx = tiny_index([[0, 0], [0], [0, 1], [1], [2], [0]])
    s = ClassAwareSampler.from_index(idx, num_samples=30_000, seed=2)
    counts = np.bincount(s.indices(), minlength=6)
    assert chi_square_test(counts, s.expected_counts()).p_value > P_MIN


def test_balanced_batch_sampler():
    members = [list(range(0, 10)), list(range(10, 14)), list(range(14, 30)), [30, 31]]
    s = BalancedBatchSampler(members, classes_per_batch=3, samples_per_class=2, num_batches=50, seed=1)
    assert len(s) == 50 and s.batch_size == 6
    label = np.zeros(32, dtype=int)
    for c, m in enumerate(members):
        label[m] = c
    for batch in s:
        assert len(batch) == 6
        classes = label[batch].reshape(3, 2)
        assert (classes[:, 0] == classes[:, 1]).all() and len(set(classes[:, 0])) == 3
    counts = np.zeros(32)
    for epoch in range(1, 41):
        s.set_epoch(epoch)
        counts += np.bincount(np.concatenate([np.asarray(b) for b in s]), minlength=32)
    assert chi_square_test(counts, 40 * s.expected_counts()).p_value > P_MIN
    with pytest.raises(ValueError, match="classes_per_batch=5 > 4"):
        BalancedBatchSampler(members, 5, 2)


def test_balanced_batch_sampler_shards_batches():
    members = [list(range(0, 10)), list(range(10, 20))]
    ranks = [BalancedBatchSampler(members, 2, 2, num_batches=5, seed=0, rank=r, world_size=2) for r in range(2)]
    whole = BalancedBatchSampler(members, 2, 2, num_batches=5, seed=0).global_batches()
    assert [len(r) for r in ranks] == [3, 3]
    assert [list(b) for b in ranks[0]] == whole[[0, 2, 4]].tolist()
    assert [list(b) for b in ranks[1]] == whole[[1, 3, 0]].tolist()  # wrapped


# -- wrapper ---------------------------------------------------------------------------------


def test_wrapper_makes_torch_weighted_sampler_distributed():
    weights = [1.0, 5.0, 2.0, 0.5] * 25
    ranks = [
        DistributedSamplerWrapper(WeightedRandomSampler(weights, 100), seed=3, rank=r, world_size=2)
        for r in range(2)
    ]
    parts = [list(r) for r in ranks]
    assert ranks[0].global_items() == ranks[1].global_items()  # same draw on both ranks
    assert parts[0] == ranks[0].global_items()[0::2] and parts[1] == ranks[0].global_items()[1::2]
    assert all(isinstance(i, int) for i in parts[0]) and len(ranks[0]) == 50
    for r in ranks:
        r.set_epoch(1)
    assert [list(r) for r in ranks] != parts


def test_wrapper_forwards_set_epoch_and_wraps_batch_samplers():
    inner = WeightedSampler(np.ones(20), seed=0)
    wrapped = DistributedSamplerWrapper(BatchSampler(inner, 3, drop_last=False), rank=1, world_size=2)
    batches = list(wrapped)
    assert len(batches) == len(wrapped) == 4 and all(isinstance(b, list) for b in batches)
    first = inner.indices().copy()
    wrapped.set_epoch(2)
    list(wrapped)
    assert inner.epoch == 2 and not np.array_equal(inner.indices(), first)
    even = DistributedSamplerWrapper(BatchSampler(SequentialSampler(range(12)), 3, False), rank=1, world_size=2)
    assert list(even) == [[3, 4, 5], [9, 10, 11]]  # equal-length batches stay lists
    seq = DistributedSamplerWrapper(SequentialSampler(range(7)), rank=0, world_size=2, drop_last=True)
    assert list(seq) == [0, 2, 4]


# -- epochs, warnings, resume ----------------------------------------------------------------


def test_repeating_an_epoch_warns_once():
    s = WeightedSampler(np.ones(5))
    list(s)
    with pytest.warns(UserWarning, match="call set_epoch"):
        list(s)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        list(s)  # once per sampler
        s.set_epoch(1)
        list(s)


@pytest.mark.parametrize(
    "make",
    [
        lambda: WeightedSampler(np.arange(1.0, 41.0), seed=3, rank=1, world_size=2),
        lambda: WeightedSampler(np.arange(1.0, 41.0), replacement=False, seed=3),
        lambda: RepeatFactorSampler(np.linspace(1, 3, 30), seed=3),
        lambda: ClassAwareSampler([[0, 1, 2], [3, 4], [5]], num_samples=25, seed=3),
        lambda: BalancedBatchSampler([[0, 1, 2], [3, 4], [5]], 2, 2, num_batches=9, seed=3),
        lambda: DistributedSamplerWrapper(WeightedRandomSampler([1.0] * 30, 30), seed=3, rank=0, world_size=2),
    ],
)
@pytest.mark.parametrize("stop", [0, 4, 9])
def test_state_dict_resumes_the_rest_of_the_epoch(make, stop):
    reference = make()
    reference.set_epoch(2)
    full = list(reference)
    s = make()
    s.set_epoch(2)
    it = iter(s)
    head = [next(it) for _ in range(stop)]
    state = s.state_dict()
    assert state["offset"] == stop and state["epoch"] == 2
    resumed = make()
    resumed.load_state_dict(state)
    resumed.set_epoch(2)  # the training loop calls it; the restored position is kept
    assert head + list(resumed) == full
    resumed.set_epoch(3)  # the next epoch starts from its beginning
    assert len(list(resumed)) == len(resumed)


def test_load_state_dict_refuses_a_different_draw():
    state = WeightedSampler(np.ones(5), seed=1).state_dict()
    with pytest.raises(ValueError, match="seed=1, this sampler seed=2"):
        WeightedSampler(np.ones(5), seed=2).load_state_dict(state)
    with pytest.raises(ValueError, match="from a WeightedSampler"):
        RepeatFactorSampler(np.ones(5)).load_state_dict(state)
    with pytest.raises(ValueError, match="lacks"):
        WeightedSampler(np.ones(5)).load_state_dict({"epoch": 0})


# -- the shortcut ----------------------------------------------------------------------------


def test_make_balanced_sampler(small_synth_root):
    idx = detloader.read_annotations(small_synth_root)
    ready = SequentialSampler(range(3))
    assert make_balanced_sampler(idx, ready) is ready
    s = make_balanced_sampler(idx, "sqrt", seed=4)
    assert isinstance(s, WeightedSampler) and len(s) == len(idx) and s.seed == 4
    np.testing.assert_allclose(s.probabilities(), sample_weights(idx, "class", "sqrt") / sample_weights(idx, "class", "sqrt").sum())
    assert isinstance(make_balanced_sampler(idx, "repeat_factor:0.5"), RepeatFactorSampler)
    assert isinstance(make_balanced_sampler(idx, "class_aware", by="image_class"), ClassAwareSampler)
    assert isinstance(make_balanced_sampler(idx, "power:0.3", num_samples=7), WeightedSampler)
    explicit = make_balanced_sampler(idx, {"sunglasses": 10.0})
    w = sample_weights(idx, "class", "explicit", class_weights={"sunglasses": 10.0})
    np.testing.assert_allclose(explicit.probabilities(), w / w.sum())
    for bad, match in [("magic", "balance='magic'"), ("power", "needs power"), (3, "balance=3"),
                       ("explicit", "needs the weights")]:
        with pytest.raises(ValueError, match=match):
            make_balanced_sampler(idx, bad)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="num_samples=5 with balance='repeat_factor'"):
        make_balanced_sampler(idx, "repeat_factor", num_samples=5)


def test_class_members_feed_the_class_samplers(small_synth_root):
    idx = detloader.read_annotations(small_synth_root)
    names, members = class_members(idx)
    s = BalancedBatchSampler.from_index(idx, 2, 2, seed=0)
    assert s.num_items <= len(idx) and len(s) >= 1
    assert ClassAwareSampler.from_index(idx).num_samples == len(np.unique(np.concatenate(members)))


def test_threads_change_nothing():
    w = np.random.default_rng(5).lognormal(0, 2, 300_000)
    assert np.array_equal(alias_table(w, 1 << 12, threads=1), alias_table(w, 1 << 16, threads=3))
    for replacement in (True, False):
        one = WeightedSampler(w, replacement=replacement, seed=1, threads=1, rank=1, world_size=3)
        many = WeightedSampler(w, replacement=replacement, seed=1, threads=4, rank=1, world_size=3)
        assert np.array_equal(one.indices(), many.indices())
    with pytest.raises(ValueError, match="threads=0"):
        WeightedSampler(w, threads=0)
