"""A training run killed with SIGKILL mid-epoch and resumed from its last checkpoint sees
exactly the samples of an uninterrupted run: one process (with and without loader
workers) and two gloo processes started as torchrun starts them."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers import free_port

from detloader.synth import make_synthetic
from detloader.train import load_checkpoint

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]
pytest.importorskip("faster_coco_eval")

HANG_AT = 7  # the step whose callback never returns: the process is killed there

# One training process: records every step's image ids (one JSON line per step, flushed),
# and with --hang stops inside the callback of step HANG_AT until it is killed.
SCRIPT = """
import json, sys, time
from detloader.train import TrainConfig, train

data, out, record, workers, hang, resume = sys.argv[1:7]
config = TrainConfig(
    data=data, out=out, size=64, batch_size=4, epochs=2, width=4, num_workers=int(workers),
    warmup_steps=2, balance="inverse", evaluate=False, checkpoint_every=1, device="cpu",
    read_options={"cache": False, "workers": 1}, resume=resume or None,
)
with open(record, "a") as f:
    def on_step(info):
        f.write(json.dumps([info.global_step, info.image_ids]) + "\\n")
        f.flush()
        if hang == "1" and info.global_step == HANG_AT:
            time.sleep(600)
    train(config, on_step=on_step)
""".replace("HANG_AT", str(HANG_AT))


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_synthetic(tmp_path_factory.mktemp("kill") / "faces", 40, seed=1, size=(96, 72))


def _start(data: Path, out: Path, record: Path, workers: int, *, hang: bool, resume: str = "",
           rank: int = 0, world: int = 1, port: int = 0) -> subprocess.Popen:
    env = dict(os.environ, OMP_NUM_THREADS="1")
    if world > 1:
        env.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank),
                   LOCAL_RANK=str(rank), WORLD_SIZE=str(world), LOCAL_WORLD_SIZE=str(world))
    args = [str(data), str(out), str(record), str(workers), "1" if hang else "0", resume]
    return subprocess.Popen([sys.executable, "-c", SCRIPT, *args], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


def _steps(record: Path) -> list[tuple[int, tuple[int, ...]]]:
    if not record.is_file():
        return []
    text = record.read_text()
    lines = text[: text.rfind("\n") + 1].splitlines()  # a line being written is left out
    return [(s, tuple(ids)) for s, ids in map(json.loads, lines)]


def _run(procs: list[subprocess.Popen]) -> None:
    for p in procs:
        _, err = p.communicate(timeout=240)
        assert p.returncode == 0, err.decode()[-3000:]


def _run_then_kill(procs: list[subprocess.Popen], record: Path) -> None:
    """Wait until rank 0 is inside step HANG_AT's callback, then SIGKILL every process."""
    deadline = time.monotonic() + 240
    while not any(s == HANG_AT for s, _ in _steps(record)):
        assert time.monotonic() < deadline, "the run never reached the step to kill it at"
        for p in procs:
            if p.poll() is not None:
                pytest.fail(f"a process ended early: {p.stderr.read().decode()[-3000:]}")
        time.sleep(0.2)
    for p in procs:
        os.kill(p.pid, signal.SIGKILL)
    for p in procs:
        p.wait(timeout=30)
        assert p.returncode == -signal.SIGKILL


@pytest.mark.parametrize("workers", [0, 2])
def test_sigkill_then_resume_one_process(tiny: Path, tmp_path: Path, workers: int) -> None:
    full, cut = tmp_path / "full", tmp_path / "cut"
    _run([_start(tiny, full, tmp_path / "full.jsonl", workers, hang=False)])
    _run_then_kill([_start(tiny, cut, tmp_path / "cut.jsonl", workers, hang=True)], tmp_path / "cut.jsonl")
    saved = int(load_checkpoint(cut / "last.pt")["step"])
    assert saved == HANG_AT - 1  # the checkpoint of the last finished step
    _run([_start(tiny, cut, tmp_path / "rest.jsonl", workers, hang=False, resume=str(cut / "last.pt"))])
    uninterrupted = _steps(tmp_path / "full.jsonl")
    before = _steps(tmp_path / "cut.jsonl")[:saved]
    assert len(uninterrupted) == 16
    assert before + _steps(tmp_path / "rest.jsonl") == uninterrupted


@pytest.mark.distributed
def test_sigkill_then_resume_two_gloo_processes(tiny: Path, tmp_path: Path) -> None:
    def ranks(out: Path, name: str, *, hang: bool, resume: str = "") -> list[subprocess.Popen]:
        port = free_port()
        return [
            _start(tiny, out, tmp_path / f"{name}{r}.jsonl", 0, hang=hang and r == 0, resume=resume,
                   rank=r, world=2, port=port)
            for r in range(2)
        ]

    full, cut = tmp_path / "full", tmp_path / "cut"
    _run(ranks(full, "full", hang=False))
    _run_then_kill(ranks(cut, "cut", hang=True), tmp_path / "cut0.jsonl")
    saved = int(load_checkpoint(cut / "last.pt")["step"])
    assert saved == HANG_AT - 1
    _run(ranks(cut, "rest", hang=False, resume=str(cut / "last.pt")))
    for r in range(2):
        uninterrupted = _steps(tmp_path / f"full{r}.jsonl")
        assert len(uninterrupted) == 8  # 2 epochs x 16 images per rank / batch 4
        before = _steps(tmp_path / f"cut{r}.jsonl")[:saved]
        assert before + _steps(tmp_path / f"rest{r}.jsonl") == uninterrupted
