"""Resuming a plain torch DataLoader mid-epoch: the rest of the epoch, none lost, none repeated."""

from __future__ import annotations

import io
import itertools

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader, IterableDataset, RandomSampler, TensorDataset

from detloader.balance import BalancedBatchSampler, ClassAwareSampler, RepeatFactorSampler, WeightedSampler
from detloader.resume import ResumableLoader

N = 60
DATA = TensorDataset(torch.arange(N))


def _ids(batch) -> list[int]:
    return batch[0].tolist()


SAMPLERS = {
    "weighted-no-replacement": lambda: WeightedSampler(np.linspace(1, 5, N), replacement=False, seed=1),
    "weighted": lambda: WeightedSampler(np.linspace(1, 5, N), seed=1),
    "repeat-factor": lambda: RepeatFactorSampler(np.linspace(1, 2.5, N), seed=1),
    "class-aware-rank1": lambda: ClassAwareSampler(
        [range(0, 40), range(40, 55), range(55, 60)], seed=1, rank=1, world_size=2
    ),
}


def _loader(sampler, workers: int, **kwargs) -> DataLoader:
    return DataLoader(DATA, batch_size=7, sampler=sampler, num_workers=workers, **kwargs)


def _epoch(make, workers: int, epoch: int) -> list[int]:
    loader = ResumableLoader(_loader(make(), workers))
    loader.set_epoch(epoch)
    return [i for b in loader for i in _ids(b)]


@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.parametrize("name", list(SAMPLERS))
def test_resume_yields_exactly_the_unconsumed_rest(name, workers):
    make = SAMPLERS[name]
    reference = _epoch(make, workers, epoch=1)
    for stop in (0, 2, 4):  # batches consumed before the interruption
        loader = ResumableLoader(_loader(make(), workers))
        loader.set_epoch(1)
        # the loop receives `stop` batches (a batch counts as consumed once received), then
        # saves - as a checkpoint in the loop body after the training step would
        seen = [i for batch in itertools.islice(loader, stop) for i in _ids(batch)]
        state = loader.state_dict()
        assert state["batches"] == stop and state["sampler"]["offset"] == min(stop * 7, len(reference))
        # the state is plain data: it survives torch.save / torch.load
        buffer = io.BytesIO()
        torch.save(state, buffer)
        buffer.seek(0)
        restored = torch.load(buffer)
        resumed = ResumableLoader(_loader(make(), workers))
        resumed.load_state_dict(restored)
        resumed.set_epoch(1)
        assert len(resumed) == -(-(len(reference) - stop * 7) // 7)
        rest = [i for b in resumed for i in _ids(b)]
        assert seen + rest == reference, (stop, seen, rest)


@pytest.mark.parametrize("workers", [0, 2])
def test_prefetch_runs_ahead_but_the_count_does_not(workers):
    sampler = WeightedSampler(np.ones(N), replacement=False, seed=0)
    loader = ResumableLoader(_loader(sampler, workers, prefetch_factor=2) if workers else _loader(sampler, 0))
    it = iter(loader)
    next(it)
    next(it)
    consumed = loader.state_dict()["sampler"]["offset"]
    assert consumed == 14
    if workers:
        # 2 workers x prefetch 2: the sampler has handed out more than was consumed
        assert sampler.state_dict()["offset"] > consumed
    del it


def test_resume_across_epochs_and_at_the_epoch_end():
    make = SAMPLERS["weighted"]
    ref = {e: _epoch(make, 0, e) for e in (0, 1)}
    loader = ResumableLoader(_loader(make(), 0))
    loader.set_epoch(0)
    for _ in loader:  # the whole epoch
        pass
    state = loader.state_dict()
    assert state["sampler"]["offset"] == N and state["epoch"] == 0
    resumed = ResumableLoader(_loader(make(), 0))
    resumed.load_state_dict(state)
    got = {}
    for epoch in range(resumed.epoch, 2):
        resumed.set_epoch(epoch)
        got[epoch] = [i for b in resumed for i in _ids(b)]
    assert got[0] == [] and got[1] == ref[1]


def test_resume_a_batch_sampler():
    def make():
        return BalancedBatchSampler([range(0, 30), range(30, 50), range(50, 60)], 2, 3, num_batches=8, seed=2)

    def run(loader):
        return [_ids(b) for b in loader]

    reference = run(DataLoader(DATA, batch_sampler=make()))
    loader = ResumableLoader(DataLoader(DATA, batch_sampler=make(), num_workers=2))
    head = []
    for k, batch in enumerate(loader):
        head.append(_ids(batch))
        if k == 2:
            break
    state = loader.state_dict()
    assert state["sampler"]["offset"] == 3  # batches, for a batch sampler
    resumed = ResumableLoader(DataLoader(DATA, batch_sampler=make(), num_workers=2))
    resumed.load_state_dict(state)
    assert head + run(resumed) == reference


def test_drop_last_and_no_auto_batching():
    sampler = RepeatFactorSampler(np.full(N, 1.3), seed=0)
    loader = ResumableLoader(DataLoader(DATA, batch_size=8, drop_last=True, sampler=sampler))
    total = len(sampler)
    assert len(loader) == total // 8
    single = ResumableLoader(DataLoader(DATA, batch_size=None, sampler=WeightedSampler(np.ones(5), seed=0)))
    it = iter(single)
    next(it)
    assert single.state_dict()["sampler"]["offset"] == 1 and len(single) == 4


class _Stream(IterableDataset):
    def __iter__(self):
        return iter(range(3))


def test_refuses_what_it_cannot_resume():
    with pytest.raises(ValueError, match="RandomSampler has no state_dict"):
        ResumableLoader(DataLoader(DATA, sampler=RandomSampler(DATA)))
    with pytest.raises(ValueError, match="IterableDataset"):
        ResumableLoader(DataLoader(_Stream()))
    with pytest.raises(ValueError, match="in_order=False"):
        ResumableLoader(DataLoader(DATA, sampler=WeightedSampler(np.ones(N)), num_workers=2, in_order=False))
    with pytest.raises(ValueError, match="not a torch DataLoader"):
        ResumableLoader([1, 2])  # type: ignore[arg-type]
