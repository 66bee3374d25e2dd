"""The shared sampler contract: epochs, the repeat warning, resume."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
from torch.utils.data import WeightedRandomSampler

from detloader.balance import (
    BalancedBatchSampler,
    ClassAwareSampler,
    DistributedSamplerWrapper,
    RepeatFactorSampler,
    WeightedSampler,
)


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
