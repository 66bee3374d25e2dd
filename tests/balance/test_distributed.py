"""Two real processes (gloo), spawned locally: samplers take rank and world size from
torch.distributed; the ranks' shares put together are the single-process draw; without
replacement no sample is on two ranks; two runs give the same draws."""

from __future__ import annotations

import pickle
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.utils.data import DataLoader, TensorDataset, WeightedRandomSampler

import detloader
from detloader.balance import (
    BalancedBatchSampler,
    ClassAwareSampler,
    DistributedSamplerWrapper,
    RepeatFactorSampler,
    WeightedSampler,
    class_members,
    make_balanced_sampler,
    repeat_factors,
)

pytestmark = [pytest.mark.distributed, pytest.mark.timeout(120)]

WORLD = 2
EPOCHS = (0, 1)
N = 101  # odd: the shares need padding


def _samplers(root: str, **dist_args):
    """The samplers under test, built the same way in the parent (dist_args = rank 0 of 1)
    and in the workers (no rank/world_size: taken from torch.distributed)."""
    index = detloader.read_annotations(root)
    weights = np.random.default_rng(0).random(N) + 0.05
    members = class_members(index)[1]
    return {
        "weighted": WeightedSampler(weights, seed=7, **dist_args),
        "no_replacement": WeightedSampler(weights, num_samples=100, replacement=False, seed=7, **dist_args),
        "repeat_factor": RepeatFactorSampler(repeat_factors(index, 0.5), seed=7, **dist_args),
        "class_aware": ClassAwareSampler(members, seed=7, **dist_args),
        "balanced_batches": BalancedBatchSampler(members, 2, 2, num_batches=9, seed=7, **dist_args),
        "torch_wrapped": DistributedSamplerWrapper(WeightedRandomSampler(weights.tolist(), N), seed=7, **dist_args),
        "sqrt_shortcut": make_balanced_sampler(index, "sqrt", seed=7, **dist_args),
    }


def _worker(rank: int, root: str, out: str) -> None:
    dist.init_process_group("gloo", init_method=f"file://{out}/rendezvous", rank=rank, world_size=WORLD)
    try:
        results: dict[str, dict[int, list]] = {}
        for name, sampler in _samplers(root).items():
            assert (sampler.rank, sampler.world_size) == (rank, WORLD), name
            results[name] = {}
            for epoch in EPOCHS:
                sampler.set_epoch(epoch)
                results[name][epoch] = [list(x) if isinstance(x, list) else int(x) for x in sampler]
                lengths: list[int | None] = [None] * WORLD
                dist.all_gather_object(lengths, len(results[name][epoch]))
                assert len(set(lengths)) == 1, (name, lengths)  # equal shares: DDP cannot hang
        # through a real DataLoader on each rank
        loader = DataLoader(TensorDataset(torch.arange(N)), batch_size=10, sampler=_samplers(root)["weighted"])
        results["loader"] = {0: [i for (b,) in loader for i in b.tolist()]}
        Path(out, f"rank{rank}.pkl").write_bytes(pickle.dumps(results))
    finally:
        dist.destroy_process_group()


def _run(root: Path, out: Path) -> list[dict]:
    out.mkdir()
    mp.spawn(_worker, args=(str(root), str(out)), nprocs=WORLD, join=True)
    return [pickle.loads((out / f"rank{r}.pkl").read_bytes()) for r in range(WORLD)]


def _interleave(parts: list[list]) -> list:
    size = sum(len(p) for p in parts)
    return [parts[i % WORLD][i // WORLD] for i in range(size)]


def test_two_processes(small_synth_root: Path, tmp_path: Path) -> None:
    detloader.read_annotations(small_synth_root)  # build the cache once, before the workers
    first = _run(small_synth_root, tmp_path / "run1")
    second = _run(small_synth_root, tmp_path / "run2")
    assert first == second  # identical across two runs

    single = _samplers(str(small_synth_root), rank=0, world_size=1)
    for name, sampler in single.items():
        for epoch in EPOCHS:
            sampler.set_epoch(epoch)
            union = _interleave([first[r][name][epoch] for r in range(WORLD)])
            if isinstance(sampler, WeightedSampler) and sampler.replacement:
                whole = sampler.indices().tolist()
                assert union[: len(whole)] == whole, (name, epoch)  # padding draws a few more
            elif isinstance(sampler, BalancedBatchSampler):
                whole = sampler.global_batches().tolist()
                assert union == (whole * 2)[: len(union)], (name, epoch)
            elif isinstance(sampler, DistributedSamplerWrapper):
                whole = sampler.global_items()
                assert union == (whole * 2)[: len(union)], (name, epoch)
            else:
                whole = sampler.global_indices().tolist() if hasattr(sampler, "global_indices") else list(sampler)
                assert union == (whole * 2)[: len(union)], (name, epoch)  # padding wraps
        assert first[0][name][0] != first[0][name][1], name  # epochs differ

    # without replacement: 100 draws, 50 per rank, no sample on two ranks
    for epoch in EPOCHS:
        a, b = (set(first[r]["no_replacement"][epoch]) for r in range(WORLD))
        assert len(a) == len(b) == 50 and not a & b
    # the DataLoader on each rank yields the rank's share
    assert first[1]["loader"][0] == first[1]["weighted"][0]
