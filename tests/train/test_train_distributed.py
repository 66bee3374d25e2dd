"""``train`` under DDP with two local gloo processes (as torchrun would start them): the
shuffle is shared out between the ranks, gradients are averaged, rank 0 gathers the
predictions of both ranks for the metrics."""

from __future__ import annotations

import os
import pickle
from pathlib import Path

import pytest
import torch.multiprocessing as mp
from helpers import free_port

from detloader.synth import make_synthetic

pytestmark = [pytest.mark.distributed, pytest.mark.slow, pytest.mark.timeout(180)]
pytest.importorskip("faster_coco_eval")

WORLD = 2


def _worker(rank: int, data: str, out: str, port: int) -> None:
    # what torchrun sets for each process
    os.environ.update(
        MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), LOCAL_RANK=str(rank),
        WORLD_SIZE=str(WORLD), LOCAL_WORLD_SIZE=str(WORLD),
    )
    from detloader.train import TrainConfig, train

    config = TrainConfig(
        data=data, out=out, size=64, batch_size=4, epochs=1, width=4, num_workers=0,
        warmup_steps=1, device="cpu", read_options={"cache": False, "workers": 1},
    )
    seen: list[int] = []
    metrics = train(config, on_step=lambda info: seen.extend(info.image_ids))
    Path(out, f"rank{rank}.pkl").write_bytes(pickle.dumps({"metrics": metrics, "seen": seen}))


def test_two_gloo_processes(tmp_path: Path) -> None:
    data = make_synthetic(tmp_path / "faces", 40, seed=1, size=(96, 72))  # 32 train, 8 val
    out = tmp_path / "run"
    mp.spawn(_worker, args=(str(data), str(out), free_port()), nprocs=WORLD, join=True)
    ranks = [pickle.loads((out / f"rank{r}.pkl").read_bytes()) for r in range(WORLD)]
    m0, m1 = ranks[0]["metrics"], ranks[1]["metrics"]
    assert m0 == m1  # rank 0's metrics broadcast
    assert m0["world_size"] == 2 and m0["samples_per_rank"] == [16, 16]
    a, b = (set(r["seen"]) for r in ranks)
    assert len(a) == len(b) == 16 and not a & b and len(a | b) == 32  # a shared-out shuffle
    assert m0["images"] == 8  # every val image evaluated once, over both ranks
    assert {"map50", "per_class", "data_wait_fraction"} <= set(m0)
