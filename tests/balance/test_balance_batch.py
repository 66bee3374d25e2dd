"""BalancedBatchSampler: P x K batches, sharded by batch."""

from __future__ import annotations

import numpy as np
import pytest
from balance_helpers import P_MIN, chi_square_test

from detloader.balance import BalancedBatchSampler


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
