"""DistributedSamplerWrapper: any sampler made distributed."""

from __future__ import annotations

import numpy as np
from torch.utils.data import BatchSampler, SequentialSampler, WeightedRandomSampler

from detloader.balance import DistributedSamplerWrapper, WeightedSampler


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
