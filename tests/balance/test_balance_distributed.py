"""Ranks' shares of a draw (detloader.balance.base.shard, in one process)."""

from __future__ import annotations

import numpy as np
import pytest

from detloader.balance import WeightedSampler
from detloader.balance.base import shard


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
    parts = [
        set(WeightedSampler(w, num_samples=600, replacement=False, seed=0, rank=r, world_size=4)) for r in range(4)
    ]
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
