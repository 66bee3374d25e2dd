"""Faults of runs (issue 44, families 4, 6, 7, 8, 10): damaged checkpoints, stores in use,
shared memory full, processes and files left behind, a lost DDP rank. Each ends handled or
with one named error (a non-zero exit from the CLI, no traceback) and nothing left behind."""

from __future__ import annotations

import os
import re
import shutil
import signal
import struct
import subprocess
import sys
import time
import zipfile
from pathlib import Path
from typing import Any

import pytest
import torch

from detloader.cli import main
from detloader.errors import CheckpointError, NonFiniteLossError
from detloader.synth import make_synthetic
from detloader.train import TrainConfig, evaluate_checkpoint, load_checkpoint, train
from detloader.train.model import CenterNet, ModelConfig
from detloader.train.task import Task, centernet_task


@pytest.fixture(scope="module")
def faces(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """40 synthetic faces of 96 x 72 with train / val splits."""
    return make_synthetic(tmp_path_factory.mktemp("runs") / "faces", 40, seed=1, size=(96, 72))


def _config(data: Path, out: Path, **changes: Any) -> TrainConfig:
    base = dict(data=str(data), out=str(out), size=64, batch_size=4, epochs=2, width=4, num_workers=0,
                warmup_steps=2, read_options={"cache": False}, evaluate=False)
    return TrainConfig(**{**base, **changes})


@pytest.fixture(scope="module")
def base_run(faces: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A run stopped at step 2 of 16: last.pt at step 2 (mid-epoch)."""
    out = tmp_path_factory.mktemp("base") / "run"
    train(_config(faces, out, max_steps=2))
    return out


def _error_line(err: str) -> str:
    assert "Traceback" not in err and err.startswith("detloader ")
    return " ".join(err.split())


# -- family 4: checkpoints ------------------------------------------------------------------------
def _nan_lr(state: dict[str, Any]) -> None:
    state["optimizer"]["param_groups"][0]["lr"] = float("nan")


def _nan_weight(state: dict[str, Any]) -> None:
    name = next(iter(state["model"]))
    state["model"][name] = state["model"][name].clone()
    state["model"][name].view(-1)[0] = float("nan")


def _nan_moment(state: dict[str, Any]) -> None:
    moment = state["optimizer"]["state"][0]["exp_avg"]
    moment.view(-1)[0] = float("inf")


@pytest.mark.parametrize(
    ("damage", "said"),
    [
        (lambda s: s.update(epoch="two"), "epoch='two' is not a count (an int >= 0)"),
        (lambda s: s.update(epoch=7), "epoch=7 does not match the 0 finished epochs its history records"),
        (lambda s: s.update(loader="garbage"), "loader='garbage' is not a loader state"),
        (lambda s: s["loader"].update(sampler=[1, 2]), "loader={'epoch': 0, 'batches': 2, 'sampler': [1, 2]} is not"),
        (lambda s: s["loader"]["sampler"].update(offset=-3), "loader sampler offset=-3 is not a count"),
        (lambda s: s.update(step=-5), f"step=-5 is outside [0, {10**12}]"),
        (lambda s: s.update(step=10**18), f"step={10**18} is outside [0, {10**12}]"),
        (_nan_weight, "1 tensors hold NaN or inf: model.backbone.stem.0.weight"),
        (_nan_moment, "1 tensors hold NaN or inf: optimizer.state.0.exp_avg"),
        (_nan_lr, "optimizer param_groups[0].lr=nan is not finite"),
        (lambda s: s["scheduler"].update(base_lrs=[float("inf")]), "scheduler base_lrs[0]=inf is not finite"),
        (lambda s: s["optimizer"]["param_groups"][0].update(lr=-1.0),
         "optimizer param_groups[0].lr=-1.0 is not a rate >= 0"),
    ],
)
def test_a_checkpoint_with_bad_values_is_refused_on_load_for_resume_and_evaluate(
    faces: Path, base_run: Path, tmp_path: Path, damage, said: str, capsys
):
    state = load_checkpoint(base_run / "last.pt")
    damage(state)
    path = tmp_path / "bad" / "last.pt"
    path.parent.mkdir()
    torch.save(state, path)
    with pytest.raises(CheckpointError, match=re.escape(f"{path}: {said}")):
        evaluate_checkpoint(path, faces, read_options={"cache": False})
    assert main(["evaluate", str(path), str(faces)]) == 2
    assert f"{path}: {said}" in _error_line(capsys.readouterr().err)
    assert main(["train", str(faces), "--resume", str(path), "--no-eval", "--num-workers", "0"]) == 2
    assert f"{path}: {said}" in _error_line(capsys.readouterr().err)


def _flip_a_tensor(path: Path) -> str:
    """Invert 64 bytes in the middle of the largest tensor record of the checkpoint ``path``;
    the record's name."""
    with zipfile.ZipFile(path) as archive:
        record = max((i for i in archive.infolist() if "/data/" in i.filename), key=lambda i: i.file_size)
    data = bytearray(path.read_bytes())
    name_len, extra_len = struct.unpack("<HH", data[record.header_offset + 26:record.header_offset + 30])
    start = record.header_offset + 30 + name_len + extra_len + record.file_size // 2
    data[start:start + 64] = bytes(b ^ 0xFF for b in data[start:start + 64])
    path.write_bytes(bytes(data))
    return record.filename


def test_flipped_bytes_in_a_weight_tensor_are_found_by_the_crc(faces: Path, base_run: Path, tmp_path: Path, capsys):
    run = Path(shutil.copytree(base_run, tmp_path / "run"))
    path = run / "last.pt"
    record = _flip_a_tensor(path)
    assert torch.load(path, weights_only=True)["step"] == 2  # torch reads it without a word
    said = f"{path}: damaged checkpoint: its record {record} fails its CRC-32 check"
    with pytest.raises(CheckpointError, match=re.escape(said)):
        load_checkpoint(path)
    assert main(["evaluate", str(path), str(faces)]) == 2
    err = _error_line(capsys.readouterr().err)
    assert said in err and "mAP" not in err
    assert main(["train", str(faces), "--resume", str(path), "--no-eval", "--num-workers", "0"]) == 2
    assert said in _error_line(capsys.readouterr().err)


def test_a_folder_given_as_the_checkpoint_is_named_with_its_last_pt(faces: Path, base_run: Path, tmp_path: Path,
                                                                    capsys):
    with pytest.raises(CheckpointError, match=re.escape(f"checkpoint={str(base_run)!r} is a folder, not a checkpoint "
                                                        f"file: give its checkpoint, {base_run / 'last.pt'}")):
        load_checkpoint(base_run)
    assert main(["evaluate", str(tmp_path), str(faces)]) == 2
    assert f"checkpoint={str(tmp_path)!r} is a folder, not a checkpoint file (no last.pt in it)" in _error_line(
        capsys.readouterr().err)
    assert main(["train", str(faces), "--resume", str(base_run), "--no-eval", "--num-workers", "0"]) == 2
    assert "is a folder, not a checkpoint file" in _error_line(capsys.readouterr().err)


def _nan_task(index: Any) -> Task:
    shape = ModelConfig(len(index.classes), len(index.landmark_schema), len(index.image_classes), 4)
    inner = centernet_task(CenterNet(shape))

    def loss(outputs: Any, batch: Any) -> dict[str, torch.Tensor]:
        terms = dict(inner.loss(outputs, batch))
        terms["heatmap"] = terms["heatmap"] * float("nan")
        return terms

    return Task(inner.model, loss, inner.decode, inner.weights, inner.config)


def test_a_loss_gone_nan_after_a_resume_names_the_checkpoint_resumed_from_without_calling_it_good(
    faces: Path, base_run: Path, tmp_path: Path
):
    run = Path(shutil.copytree(base_run, tmp_path / "run"))
    with pytest.raises(NonFiniteLossError) as info:
        train(_config(faces, run, resume=str(run / "last.pt")), task=_nan_task)
    text = str(info.value)
    assert f"{run / 'last.pt'} (step 2), the checkpoint it resumed from, is unchanged" in text
    assert "last good" not in text


# -- family 8: processes and files left behind ----------------------------------------------------
@pytest.fixture(scope="module")
def many(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """2,000 small images: a cold index build parses them in worker processes for about a second."""
    return make_synthetic(tmp_path_factory.mktemp("many") / "faces", 2000, seed=2, size=(96, 72))


@pytest.mark.slow
@pytest.mark.parametrize("signum", [signal.SIGKILL, signal.SIGTERM])
def test_parse_workers_end_with_a_killed_index(many: Path, signum: int, tmp_path: Path):
    psutil = pytest.importorskip("psutil")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    command = [sys.executable, "-m", "detloader", "index", str(many), "--rebuild", "--workers", "2"]
    with open(tmp_path / "err.txt", "w") as err:
        proc = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=err, env=env)
    children: list[Any] = []
    deadline = time.monotonic() + 60
    while len(children) < 2 and proc.poll() is None and time.monotonic() < deadline:
        children = psutil.Process(proc.pid).children(recursive=True)
        time.sleep(0.02)
    assert len(children) == 2, "no parse workers seen: the build ended before"
    os.kill(proc.pid, signum)
    proc.wait(10)
    gone, alive = psutil.wait_procs(children, timeout=5)
    for child in alive:
        child.kill()
    assert alive == [], f"parse workers left running: {alive}"


def test_the_next_store_build_removes_the_temporary_file_of_a_dead_one(tmp_path: Path):
    from detloader import read_annotations
    from detloader._system.locks import locked
    from detloader.dataset import store_files
    from detloader.dataset.caches import find_made
    from detloader.store import ImageStore

    index = read_annotations(make_synthetic(tmp_path / "ds", 6, seed=0, size=(96, 72)))
    store = ImageStore.open(index, "disk", 48)
    dead = store.path.with_name(f".{store.path.name}.x1y2z3ab.tmp")  # atomic_write's name
    dead.write_bytes(b"\0" * 1000)
    listed = {Path(m.path): m.kind for m in find_made("store", index.root)}
    assert listed[dead] == "store leftover"
    with locked(Path(f"{store.path}.lock")):  # a build of that store runs: its file stays
        assert store_files.sweep_temporaries(store.path.parent) == [] and dead.exists()
    ImageStore.open(index, "disk", 48)
    assert not dead.exists() and store.path.is_file()


def test_a_killed_checkpoint_save_leaves_nothing_for_the_next_run(faces: Path, base_run: Path, tmp_path: Path):
    run = Path(shutil.copytree(base_run, tmp_path / "run"))
    dead = [run / ".last.pt.q7w8e9r0.tmp", run / ".previous.pt.999999.tmp", run / ".metrics.json.a1b2c3d4.tmp"]
    for path in dead:
        path.write_bytes(b"partial")
    train(_config(faces, run, resume=str(run / "last.pt"), max_steps=3))
    assert sorted(p.name for p in run.iterdir() if p.name.endswith(".tmp")) == []
    assert load_checkpoint(run / "last.pt")["step"] == 3


# -- family 6: stores in use ------------------------------------------------------------------------
_READER = """
import sys
from detloader import read_annotations
from detloader.dataset import DetectionDataset
data = DetectionDataset(read_annotations(sys.argv[1]), cache="disk", cache_size=48)
data[0]
print("ready", flush=True)
sys.stdin.readline()
data[1]
print("read", flush=True)
"""


def test_cache_clear_keeps_the_disk_store_and_index_cache_another_process_reads(tmp_path: Path, capsys):
    from detloader.dataset.caches import find_made

    root = make_synthetic(tmp_path / "ds", 6, seed=0, size=(96, 72))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    reader = subprocess.Popen([sys.executable, "-c", _READER, str(root)], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True, env=env)
    try:
        assert reader.stdout.readline().strip() == "ready"
        made = {m.kind: m for m in find_made("all", root)}
        assert made["store disk"].in_use and made["index"].in_use
        assert main(["cache", "clear", str(root), "--kind", "all"]) == 0
        out = capsys.readouterr().out
        assert "2 in use kept" in out
        assert all(Path(m.path).is_file() for m in made.values())
        reader.stdin.write("\n")
        reader.stdin.flush()
        assert reader.stdout.readline().strip() == "read"
    finally:
        reader.stdin.close()
        assert reader.wait(30) == 0
    assert main(["cache", "clear", str(root), "--kind", "all"]) == 0
    assert not any(Path(m.path).exists() for m in made.values())


# -- family 7: shared memory full -----------------------------------------------------------------
def test_shared_memory_full_in_a_worker_is_one_named_line_exit_4_and_no_torch_files(
    faces: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys
):
    from detloader._system import pool
    from detloader.loader import collate

    def full(numel: int) -> torch.Tensor:  # as torch fails when /dev/shm has no room left
        name = f"torch_{os.getpid()}_4242_0"
        Path("/dev/shm", name).write_bytes(b"")  # the file torch leaves behind
        raise RuntimeError(f"unable to allocate shared memory(shm) for file </{name}>: No space left on device (28)")

    monkeypatch.setattr(collate, "_new_shared", full)
    monkeypatch.setattr(pool, "start_method", lambda: "fork")  # the workers see the patch
    code = main(["train", str(faces), "--size", "64", "--batch-size", "4", "--width", "4", "--num-workers", "1",
                 "--epochs", "1", "--no-eval", "--out", str(tmp_path / "run")])
    err = capsys.readouterr().err
    assert code == 4
    line = _error_line(err)
    assert "could not allocate shared memory for a batch" in line and "--shm-size" in line
    assert "--num-workers" in line and "--cache disk" in line
    assert len(err.strip().splitlines()) == 1
    assert list(Path("/dev/shm").glob("torch_*_4242_0")) == []


# -- 10: a lost DDP rank ------------------------------------------------------------------------


def test_a_collective_that_lost_its_peer_is_one_named_line(tmp_path: Path) -> None:
    from detloader.errors import RankLostError
    from detloader.train.distributed import DistEnv
    from detloader.train.stopping import rank_lost

    gloo = RuntimeError("[gloo/transport/tcp/pair.cc:537] Read error [127.0.0.1]:3804: Connection reset by peer. "
                        "This is typically caused by a remote worker hanging or bugs in the application. GLHF!")
    (tmp_path / "last.pt").write_bytes(b"x")
    two = DistEnv(rank=0, world_size=2, local_rank=0, device=torch.device("cpu"))
    err = rank_lost(gloo, two, tmp_path)
    assert isinstance(err, RankLostError) and (err.rank, err.world_size) == (0, 2)
    assert "rank 1 ended during training" in str(err) and "Connection reset by peer" in str(err)
    assert f"--resume {tmp_path / 'last.pt'}" in str(err) and "\n" not in str(err)
    four = DistEnv(rank=2, world_size=4, local_rank=2, device=torch.device("cpu"))
    assert "another of the 4 ranks" in str(rank_lost(gloo, four, tmp_path / "none"))
    assert "no checkpoint was saved" in str(rank_lost(gloo, four, tmp_path / "none"))
    one = DistEnv(rank=0, world_size=1, local_rank=0, device=torch.device("cpu"))
    assert rank_lost(gloo, one, tmp_path) is None  # not distributed: not ours to name
    assert rank_lost(RuntimeError("CUDA out of memory"), two, tmp_path) is None


@pytest.mark.slow
@pytest.mark.distributed
def test_a_rank_killed_mid_run_ends_the_other_with_one_line(tmp_path: Path) -> None:
    from helpers import free_port

    data = make_synthetic(tmp_path / "faces", 24, seed=0, size=(96, 72))
    port, procs = free_port(), []
    for rank in range(2):
        env = dict(os.environ, OMP_NUM_THREADS="1", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank),
                   LOCAL_RANK=str(rank), WORLD_SIZE="2", LOCAL_WORLD_SIZE="2")
        procs.append(subprocess.Popen(
            [sys.executable, "-m", "detloader", "train", str(data), "--epochs", "500", "--size", "64",
             "--batch-size", "4", "--out", str(tmp_path / "run"), "--num-workers", "0", "--checkpoint-every", "1",
             "--log-every", "1", "--no-eval"],
            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        ))
    deadline = time.monotonic() + 120
    while not (tmp_path / "run" / "last.pt").is_file():  # training runs: a checkpoint was saved
        assert time.monotonic() < deadline and procs[0].poll() is None, procs[0].stderr.read()[-3000:]
        time.sleep(0.2)
    procs[1].kill()
    try:
        _, err = procs[0].communicate(timeout=90)
    finally:
        for p in procs:
            p.kill()
    lines = [line for line in err.splitlines() if line.strip()]
    assert procs[0].returncode == 4, err[-3000:]
    assert "Traceback" not in err and len(lines) == 1, err[-3000:]
    assert "rank 0 of 2: rank 1 ended during training" in lines[0] and "last.pt" in lines[0]
