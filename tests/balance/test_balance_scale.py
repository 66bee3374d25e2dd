"""The sort-based sampler builds draw exactly what the np.unique-based ones drew: recorded
draws of every sampler on a long-tail index, and the member lists against np.unique."""

from __future__ import annotations

import numpy as np
import pytest
from balance_helpers import long_tail_index

from detloader.annotations.distinct import distinct_count, distinct_pairs_by_group, unique_counts, unique_sorted
from detloader.balance import BalancedBatchSampler, ClassAwareSampler, make_balanced_sampler
from detloader.balance.groups import balance_groups, class_members, group_counts

# Recorded with the np.unique-based builds (before the sort-based ones) on
# long_tail_index(400, 60, seed=3): first 12 indices, their sum, epoch length, expected sum.
RECORDED = {
    "sqrt": ([297, 156, 274, 164, 386, 334, 170, 54, 245, 272, 74, 318], 80873, 400, 400.0),
    "inverse": ([330, 156, 274, 164, 386, 363, 170, 54, 245, 272, 97, 318], 83012, 400, 400.0),
    "repeat_factor:0.01": ([345, 239, 379, 270, 122, 282, 48, 311, 203, 82, 225, 63], 80754, 403, 404.805789),
    "class_aware": ([307, 10, 280, 377, 2, 329, 206, 316, 395, 39, 367, 242], 83048, 396, 396.0),
    "effective": ([330, 156, 274, 164, 386, 363, 170, 54, 245, 272, 97, 318], 83012, 400, 400.0),
}


@pytest.fixture(scope="module")
def index():
    return long_tail_index(400, 60, seed=3)


@pytest.mark.parametrize("balance", sorted(RECORDED))
def test_sampler_draws_are_unchanged(index, balance):
    head, total, length, expected = RECORDED[balance]
    sampler = make_balanced_sampler(index, balance, seed=5)
    drawn = np.asarray(sampler.indices())
    assert drawn[:12].tolist() == head
    assert (int(drawn.sum()), len(drawn)) == (total, length)
    assert float(np.asarray(sampler.expected_counts()).sum()) == pytest.approx(expected, abs=1e-6)


def test_batch_sampler_draws_are_unchanged(index):
    batches = np.asarray(BalancedBatchSampler.from_index(index, 4, 2, seed=7).global_batches())
    assert batches[:2].reshape(-1).tolist() == [322, 210, 170, 211, 145, 270, 272, 97, 72, 110, 194, 312, 157, 178,
                                                308, 145]
    assert (int(batches.sum()), batches.shape[0]) == (78352, 49)


def test_class_members_equal_the_unique_reference():
    index = long_tail_index(3000, 1200, seed=1)
    names, members = class_members(index)
    assert len(members) == len(names) == 1200
    img, lab = index.object_image, index.labels
    for c in range(1200):
        np.testing.assert_array_equal(members[c], np.unique(img[lab == c]))
    groups = balance_groups(index)
    images, group, mult = groups.pairs()
    ref, ref_counts = np.unique(img * 1200 + lab, return_counts=True)
    np.testing.assert_array_equal(images, ref // 1200)
    np.testing.assert_array_equal(group, ref % 1200)
    np.testing.assert_array_equal(mult, ref_counts)
    np.testing.assert_array_equal(group_counts(groups, "images"), np.bincount(ref % 1200, minlength=1200))


def test_class_aware_from_unsorted_members_equals_sorted_unique():
    rng = np.random.default_rng(0)
    members = [rng.integers(0, 50, size) for size in (7, 1, 30, 0, 12)]  # repeats, any order
    a = ClassAwareSampler(members, num_samples=100, seed=3)
    b = ClassAwareSampler([np.unique(m) for m in members], num_samples=100, seed=3)
    np.testing.assert_array_equal(a.indices(), b.indices())
    np.testing.assert_allclose(a.expected_counts(), b.expected_counts())
    assert a._distinct == len(np.unique(np.concatenate(members)))
    members[0][:] = 49  # the sampler keeps its own copy
    np.testing.assert_array_equal(a.class_members[0], np.unique(b.class_members[0]))


def test_unique_helpers_equal_numpy():
    rng = np.random.default_rng(2)
    for values in (rng.integers(-5, 40, 500), np.array([], dtype=np.int64), np.array([3]), np.full(9, 7)):
        np.testing.assert_array_equal(unique_sorted(values), np.unique(values))
        uniq, counts = unique_counts(values)
        ref, ref_counts = np.unique(values, return_counts=True)
        np.testing.assert_array_equal(uniq, ref)
        np.testing.assert_array_equal(counts, ref_counts)
    values = rng.integers(0, 100, 300)
    assert distinct_count(values, 100) == distinct_count(values) == len(np.unique(values))
    major = np.sort(rng.integers(0, 30, 400))
    groups = rng.integers(0, 70_000, 400)  # over 2^16 groups: the general stable sort
    for g, num in ((groups % 9, 9), (groups, 70_000)):
        got_g, got_major, got_mult = distinct_pairs_by_group(major, g, num)
        ref, ref_counts = np.unique(g.astype(np.int64) * 30 + major, return_counts=True)
        np.testing.assert_array_equal(got_g, ref // 30)
        np.testing.assert_array_equal(got_major, ref % 30)
        np.testing.assert_array_equal(got_mult, ref_counts)
