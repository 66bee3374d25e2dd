"""A loss that goes NaN or infinite stops the run at that step with a named error (exit status
3 from the CLI), and no checkpoint ever holds non-finite weights: the last good one stays."""

from __future__ import annotations

import hashlib
import os
import pickle
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.multiprocessing as mp
from helpers import free_port

from detloader.cli import main
from detloader.errors import NonFiniteError, NonFiniteLossError, NonFiniteWeightsError
from detloader.synth import make_synthetic
from detloader.train import TrainConfig, load_checkpoint, save_checkpoint, train
from detloader.train.checkpoint import PREVIOUS, non_finite_tensors
from detloader.train.model import CenterNet, ModelConfig
from detloader.train.task import Task, centernet_task

pytest.importorskip("faster_coco_eval")


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """40 images of 96 x 72: 32 train, 8 val."""
    return make_synthetic(tmp_path_factory.mktemp("nonfinite") / "faces", 40, seed=1, size=(96, 72))


def _config(data: Path, out: Path, **changes: Any) -> TrainConfig:
    base = dict(
        data=str(data), out=str(out), size=64, batch_size=4, epochs=1, width=4, num_workers=0,
        warmup_steps=2, evaluate=False, read_options={"cache": False},
    )
    return TrainConfig(**{**base, **changes})


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _all_finite(state: dict[str, Any]) -> bool:
    return all(bool(torch.isfinite(t).all()) for t in state["model"].values() if t.is_floating_point())


def _nan_task_at(bad_call: int, out: Path, seen: dict[str, Any]):
    """The reference task whose ``heatmap`` term is NaN at its ``bad_call``-th loss; at that
    moment it notes the hashes of the checkpoints in ``out``."""

    def make(index: Any) -> Task:
        shape = ModelConfig(len(index.classes), len(index.landmark_schema), len(index.image_classes), 4)
        inner = centernet_task(CenterNet(shape))
        calls = [0]

        def loss(outputs: Any, batch: Any) -> dict[str, torch.Tensor]:
            terms = dict(inner.loss(outputs, batch))
            calls[0] += 1
            if calls[0] == bad_call:
                seen.update({p.name: _sha(p) for p in out.glob("*.pt")})
                terms["heatmap"] = terms["heatmap"] * float("nan")
            return terms

        return Task(inner.model, loss, inner.decode, inner.weights, inner.config)

    return make


def test_a_nan_term_stops_at_its_step_and_leaves_the_checkpoints_as_they_were(tiny: Path, tmp_path: Path):
    out, seen = tmp_path / "run", {}
    steps: list[int] = []
    with pytest.raises(NonFiniteLossError) as info:
        train(_config(tiny, out, checkpoint_every=1), task=_nan_task_at(3, out, seen),
              on_step=lambda s: steps.append(s.global_step))
    err = info.value
    assert steps == [1, 2]  # no step after the bad one, and the bad one made no update
    assert err.step == 3 and set(err.terms) == {"heatmap", "total"}
    text = str(err)
    assert "non-finite loss at step 3 (epoch 1, step 3 of 8): heatmap nan, total nan" in text
    assert f"{out / 'last.pt'} (step 2) is the last good checkpoint" in text
    assert "--lr" in text and "--warmup-steps" in text and "detloader validate" in text
    assert isinstance(err, NonFiniteError) and isinstance(err, RuntimeError)
    assert {p.name: _sha(p) for p in out.glob("*.pt")} == seen == {"last.pt": seen["last.pt"], PREVIOUS: seen[PREVIOUS]}
    last = load_checkpoint(out / "last.pt")
    assert last["step"] == 2 and _all_finite(last)
    copy = pickle.loads(pickle.dumps(err))
    assert str(copy) == text and copy.step == 3 and list(copy.terms) == ["heatmap", "total"]


def test_cli_huge_lr_exits_3_with_the_message_and_a_finite_checkpoint(
    tiny: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
):
    out = tmp_path / "run"
    argv = ["train", str(tiny), "--size", "64", "--batch-size", "4", "--width", "4", "--num-workers", "0",
            "--epochs", "1", "--warmup-steps", "2", "--checkpoint-every", "1", "--no-eval", "--no-amp",
            "--lr", "1e30", "--out", str(out)]
    assert main(argv) == 3
    captured = capsys.readouterr()
    assert "Traceback" not in captured.err
    line = captured.err.strip().splitlines()[-1]
    assert line.startswith("detloader train: error: non-finite loss at step 2 (epoch 1, step 2 of 8): ")
    assert "a lower --lr (now 1e+30 at this step, 1e+30 at its peak)" in line
    state = load_checkpoint(out / "last.pt")  # step 1's weights: huge but finite
    assert state["step"] == 1 and _all_finite(state) and not (out / PREVIOUS).exists()
    assert state["config"]["amp"] is False and state["config"]["warmup_steps"] == 2
    assert not (out / "metrics.json").exists()


def _state(model: torch.nn.Module, step: int) -> dict[str, Any]:
    optimizer = torch.optim.AdamW(model.parameters())
    keys = ("model_config", "scheduler", "loader", "epoch", "config", "classes", "image_classes",
            "landmark_schema", "history")
    return {"model": model.state_dict(), "optimizer": optimizer.state_dict(), "step": step, **dict.fromkeys(keys)}


@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_a_non_finite_parameter_blocks_the_save(tmp_path: Path, bad: float):
    model = torch.nn.Sequential(torch.nn.Linear(3, 2), torch.nn.Linear(2, 1))
    path = tmp_path / "last.pt"
    save_checkpoint(path, _state(model, 1))
    save_checkpoint(path, _state(model, 2))
    before = {p.name: _sha(p) for p in tmp_path.iterdir()}
    with torch.no_grad():
        model[1].weight[0, 1] = bad
    assert non_finite_tensors(_state(model, 3)) == ["model.1.weight"]
    with pytest.raises(NonFiniteWeightsError) as info:
        save_checkpoint(path, _state(model, 3))
    assert info.value.tensors == ["model.1.weight"]
    assert "model.1.weight" in str(info.value) and "at step 3" in str(info.value) and "not written" in str(info.value)
    assert {p.name: _sha(p) for p in tmp_path.iterdir()} == before  # no temporary left either
    assert torch.load(path, weights_only=False)["step"] == 2  # the state as saved (not a whole training checkpoint)


def test_optimizer_moments_are_checked_too():
    model = torch.nn.Linear(2, 1)
    optimizer = torch.optim.AdamW(model.parameters())
    model(torch.ones(1, 2)).sum().backward()
    optimizer.step()
    next(iter(optimizer.state.values()))["exp_avg_sq"].fill_(float("inf"))
    assert non_finite_tensors({"model": model.state_dict(), "optimizer": optimizer.state_dict()}) == [
        "optimizer.state.0.exp_avg_sq"
    ]


WORLD = 2


def _worker(rank: int, data: str, out: str, port: int) -> None:
    os.environ.update(
        MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), LOCAL_RANK=str(rank),
        WORLD_SIZE=str(WORLD), LOCAL_WORLD_SIZE=str(WORLD),
    )

    def make(index: Any) -> Task:  # NaN on rank 1 only, at its second step
        shape = ModelConfig(len(index.classes), len(index.landmark_schema), len(index.image_classes), 4)
        inner = centernet_task(CenterNet(shape))
        calls = [0]

        def loss(outputs: Any, batch: Any) -> dict[str, torch.Tensor]:
            terms = dict(inner.loss(outputs, batch))
            calls[0] += 1
            if rank == 1 and calls[0] == 2:
                terms["giou"] = terms["giou"] * float("inf")
            return terms

        return Task(inner.model, loss, inner.decode, inner.weights, inner.config)

    config = TrainConfig(
        data=data, out=out, size=64, batch_size=4, epochs=1, width=4, num_workers=0, warmup_steps=1,
        device="cpu", evaluate=False, checkpoint_every=1, read_options={"cache": False, "workers": 1},
    )
    steps: list[int] = []
    try:
        train(config, task=make, on_step=lambda s: steps.append(s.global_step))
        result: Any = "no error"
    except NonFiniteLossError as err:
        result = (err.step, err.terms)
    Path(out, f"rank{rank}.pkl").write_bytes(pickle.dumps({"result": result, "steps": steps}))


@pytest.mark.distributed
@pytest.mark.slow
@pytest.mark.timeout(180)
def test_ddp_ranks_stop_together_when_one_rank_goes_non_finite(tiny: Path, tmp_path: Path) -> None:
    out = tmp_path / "run"
    mp.spawn(_worker, args=(str(tiny), str(out), free_port()), nprocs=WORLD, join=True)
    ranks = [pickle.loads((out / f"rank{r}.pkl").read_bytes()) for r in range(WORLD)]
    for got in ranks:
        assert got["steps"] == [1]
        step, terms = got["result"]
        assert step == 2 and set(terms) == {"rank 1: giou", "rank 1: total"}
    state = load_checkpoint(out / "last.pt")
    assert state["step"] == 1 and _all_finite(state)
