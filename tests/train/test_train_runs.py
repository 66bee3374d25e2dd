"""A train/test process to trust on a real dataset: one recorded split shared by ``train`` and
``evaluate``, run folders that are never overwritten or mixed, checkpoints that know their data
and say when they are damaged, ``--max-steps`` then ``--resume``, and safe stops on SIGTERM /
SIGINT."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers import free_port

import detloader
from detloader.cli import main
from detloader.errors import DataMismatchError
from detloader.synth import make_synthetic
from detloader.train import TrainConfig, load_checkpoint, train
from detloader.train.checkpoint import CheckpointError
from detloader.train.run_data import RunDirError, RunLock, run_read_options

pytest.importorskip("faster_coco_eval")

SMALL = ["--size", "64", "--batch-size", "4", "--width", "4", "--num-workers", "0"]


@pytest.fixture(scope="module")
def no_splits(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """40 synthetic faces as a VOC export without split files."""
    root = make_synthetic(tmp_path_factory.mktemp("runs") / "faces", 40, seed=1, size=(96, 72))
    shutil.rmtree(root / "ImageSets")
    return root


def _config(data: Path, out: Path, **changes) -> TrainConfig:
    base = dict(data=str(data), out=str(out), size=64, batch_size=4, epochs=1, width=4, num_workers=0,
                warmup_steps=2, read_options={"cache": False})
    return TrainConfig(**{**base, **changes})


@pytest.mark.slow
def test_train_and_evaluate_share_the_split_of_a_dataset_without_split_files(no_splits: Path, tmp_path: Path, capsys):
    out = tmp_path / "run"
    assert main(["train", str(no_splits), "--out", str(out), "--epochs", "1", *SMALL]) == 0
    text = capsys.readouterr().out
    record = load_checkpoint(out / "last.pt")["data"]
    val, trained = record["splits"]["val"], record["splits"]["train"]["images"]
    assert (
        trained + val["images"] == 40 and len(val["paths"].split("\n")) == val["images"] and "seed 0" in val["source"]
    )
    assert f"training on split 'train': {trained} images (random 80/20" in " ".join(text.split())
    assert f"validating on split 'val': {val['images']} images" in text
    assert json.loads((out / "metrics.json").read_text())["split"]["images"] == val["images"]
    assert (out / "predictions.png").is_file()
    # evaluate with no --split: the checkpoint's validation images, said so
    assert main(["evaluate", str(out / "last.pt"), str(no_splits), "--json"]) == 0
    metrics = json.loads(capsys.readouterr().out)
    assert metrics["images"] == val["images"] and metrics["split"]["name"] == "val"
    assert "the checkpoint's validation split" in metrics["split"]["source"]
    assert metrics["seen_in_training"] == 0
    assert (out / "predictions.png").is_file()
    # --split all scores trained images too, and says how many
    assert main(["evaluate", str(out / "last.pt"), str(no_splits), "--split", "all"]) == 0
    assert f"{trained} of the 40 images were trained on" in " ".join(capsys.readouterr().out.split())
    assert (out / "predictions-all.png").is_file()


@pytest.fixture(scope="module")
def renamed(no_splits: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The 40 faces as a CVAT export whose images were renamed to their id (``images/107.jpg``):
    by name (``camera/IMG_0007.jpg``) none is found."""
    index = detloader.read_annotations(no_splits, cache=False)
    root = tmp_path_factory.mktemp("cvat") / "faces"
    (root / "images").mkdir(parents=True)
    images = []
    for i in range(len(index)):
        item = index.image(i)
        shutil.copy(index.image_path(i), root / "images" / f"{100 + i}.jpg")
        boxes = "".join(
            f'<box label="{index.classes[int(label)]}" xtl="{x1}" ytl="{y1}" xbr="{x2}" ybr="{y2}"/>'
            for (x1, y1, x2, y2), label in zip(item.boxes.tolist(), item.labels.tolist())
        )
        images.append(f'<image id="{100 + i}" name="camera/IMG_{i:04d}.jpg" width="96" height="72">{boxes}</image>')
    (root / "annotations.xml").write_text(f"<annotations><version>1.1</version>{''.join(images)}</annotations>")
    return root


def test_the_run_read_options_give_way_to_those_given():
    recorded = {"format": "cvat", "on_error": "warn", "images_by": "id", "cache": False, "workers": 1}
    read = run_read_options(recorded, {"on_error": "skip", "image_dir": "pics"})
    assert read.options == {"format": "cvat", "on_error": "skip", "images_by": "id", "image_dir": "pics"}
    assert read.from_run == {"format": "cvat", "images_by": "id"}  # how the index was built is not taken
    assert read.changed == {"on_error": ("warn", "skip"), "image_dir": (None, "pics")}
    assert run_read_options(recorded, {"format": "cvat"}).changed == {}
    # defaults lie beneath the run's: they fill in only what it did not record
    defaults = {"format": "auto", "on_error": "warn", "image_dir": "imgs"}
    assert run_read_options({"on_error": "raise"}, {}, defaults).options == {**defaults, "on_error": "raise"}


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore::detloader.errors.AnnotationWarning")  # by name, no image is found
def test_evaluate_and_resume_read_the_dataset_as_the_run_did(renamed: Path, tmp_path: Path, capsys):
    out = tmp_path / "run"
    assert main(["train", str(renamed), "--images-by", "id", "--out", str(out), *SMALL, "--epochs", "1",
                 "--max-steps", "2", "--no-eval"]) == 0
    val = load_checkpoint(out / "last.pt")["data"]["splits"]["val"]["images"]
    capsys.readouterr()
    # evaluate without --images-by: the run's, said first; the checkpoint's validation images are all found
    assert main(["evaluate", str(out / "last.pt"), str(renamed)]) == 0
    text = capsys.readouterr().out
    assert text.splitlines()[0] == "read options from the run: --images-by id"
    assert f"split 'val': {val} images (the checkpoint's validation split" in text
    assert "are not in this dataset" not in text
    # given, an option wins; that it differs is said (by name no image is found)
    assert main(["evaluate", str(out / "last.pt"), str(renamed), "--images-by", "name"]) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert "none of the checkpoint's" in err
    assert "read with other options than the run's (images_by 'id' -> 'name')" in err
    # the library alike
    metrics = detloader.train.evaluate_checkpoint(out / "last.pt", renamed, read_options={"cache": False})
    assert metrics["images"] == val and metrics["read_options"]["from_run"] == {
        "format": "auto", "on_error": "warn", "images_by": "id"
    }
    # --resume reads as the run did, and says so
    assert main(["train", str(renamed), "--resume", str(out / "last.pt"), *SMALL, "--no-eval"]) == 0
    text = capsys.readouterr().out
    assert text.splitlines()[0] == "read options from the run: --images-by id" and "resuming at step 2" in text
    assert load_checkpoint(out / "last.pt")["config"]["read_options"]["images_by"] == "id"
    # a given read option that reads other data is refused as other data, naming the option
    assert main(["train", str(renamed), "--resume", str(out / "last.pt"), "--class-map", "sunglasses=face",
                 *SMALL, "--no-eval"]) == 2
    said = capsys.readouterr()
    assert "read options given that differ from the run's: --class-map sunglasses=face (the run: not set)" in said.out
    err = " ".join(said.err.split())
    assert "checkpoint classes ['face', 'masked', 'sunglasses'] differ" in err
    assert "(read with other options than the run's: class_map not set -> {'sunglasses': 'face'})" in err


def test_a_run_folder_is_never_overwritten(no_splits: Path, tmp_path: Path, capsys):
    out = tmp_path / "run"
    out.mkdir()
    (out / "last.pt").write_bytes(b"a run's checkpoint")
    assert main(["train", str(no_splits), "--out", str(out), *SMALL, "--no-eval"]) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert "holds a run (last.pt)" in err and f"--resume {out / 'last.pt'}" in err
    assert f"--out {tmp_path / 'run2'}" in err and "--exist-ok" in err
    assert (out / "last.pt").read_bytes() == b"a run's checkpoint"
    assert (
        main(["train", str(no_splits), "--out", str(out), *SMALL, "--no-eval", "--exist-ok", "--max-steps", "1"]) == 0
    )
    assert int(load_checkpoint(out / "last.pt")["step"]) == 1


def test_two_trainings_on_one_folder_and_a_stale_lock(no_splits: Path, tmp_path: Path):
    out = tmp_path / "run"
    with RunLock(out):  # another training holds the folder
        with pytest.raises(RunDirError, match=rf"in use by another training \(pid {os.getpid()}"):
            train(_config(no_splits, out, evaluate=False, max_steps=1))
    assert not (out / "config.json").exists()
    # a training that died leaves its owner file: taken over, with a warning
    (out / ".train.owner.json").write_text(json.dumps({"pid": 999999, "host": "elsewhere", "started": "then"}))
    with pytest.warns(RuntimeWarning, match="took over the lock.*pid 999999"):
        train(_config(no_splits, out, evaluate=False, max_steps=1))
    assert not (out / ".train.owner.json").exists() and not (out / ".train.lock").exists()  # a finished run


def test_the_run_lock_leaves_no_file_and_refuses_a_second_holder(tmp_path: Path):
    out = tmp_path / "run"
    with RunLock(out):
        assert (out / ".train.lock").is_file() and (out / ".train.owner.json").is_file()
        with pytest.raises(RunDirError, match="in use by another training"):
            with RunLock(out):
                pass
        assert (out / ".train.lock").is_file()  # the refused one left the holder's file alone
    assert sorted(p.name for p in out.iterdir()) == []
    with pytest.raises(RuntimeError, match="the run failed"):
        with RunLock(out):
            raise RuntimeError("the run failed")
    assert sorted(p.name for p in out.iterdir()) == []


def test_two_processes_on_one_out(no_splits: Path, tmp_path: Path):
    out, ready = tmp_path / "run", tmp_path / "ready"
    code = f"""
import time, pathlib
from detloader.train import TrainConfig, train
def hold(info):
    pathlib.Path({str(ready)!r}).touch()
    time.sleep(60)
train(TrainConfig(data={str(no_splits)!r}, out={str(out)!r}, size=64, batch_size=4, width=4, epochs=1,
      num_workers=0, evaluate=False, read_options={{"cache": False}}), on_step=hold)
"""
    first = subprocess.Popen([sys.executable, "-c", code], stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 120
        while not ready.exists():
            assert first.poll() is None, first.stderr.read().decode()[-2000:]
            assert time.monotonic() < deadline
            time.sleep(0.1)
        config_before = (out / "config.json").read_text()
        with pytest.raises(RunDirError, match=rf"in use by another training \(pid {first.pid}"):
            train(_config(no_splits, out, evaluate=False, exist_ok=True, seed=5))
        assert (out / "config.json").read_text() == config_before
    finally:
        first.kill()
        first.wait()


def test_resume_refuses_other_data_and_max_steps_means_the_run(no_splits: Path, tmp_path: Path, capsys):
    out = tmp_path / "run"
    args = ["train", str(no_splits), "--out", str(out), *SMALL, "--no-eval", "--epochs", "2", "--checkpoint-every", "1"]
    assert main([*args, "--max-steps", "3"]) == 0
    assert int(load_checkpoint(out / "last.pt")["step"]) == 3
    # another dataset, same classes: refused with what differs
    other = tmp_path / "other"
    shutil.copytree(no_splits, other)
    for xml in sorted((other / "Annotations").glob("*.xml"))[:5]:
        xml.unlink()
    capsys.readouterr()
    assert main(["train", str(other), "--resume", str(out / "last.pt"), *SMALL, "--no-eval"]) == 2
    err = " ".join(capsys.readouterr().err.split())
    trained = load_checkpoint(out / "last.pt")["data"]["splits"]["train"]["images"]
    assert "trained on other data" in err and f"training images: {trained} of split 'train'" in err
    assert "--allow-data-change" in err
    # the same data: --resume continues to the configured end (16 steps), not one step more
    assert main(["train", str(no_splits), "--resume", str(out / "last.pt"), *SMALL, "--no-eval", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["steps"] == 2 * (trained // 4)
    # knowingly on other data
    assert main(["train", str(other), "--resume", str(out / "last.pt"), "--allow-data-change", "--epochs", "3",
                 *SMALL, "--no-eval", "--max-steps", str(2 * (trained // 4) + 1)]) == 0


def test_damaged_checkpoints_are_named(no_splits: Path, tmp_path: Path, capsys):
    out = tmp_path / "run"
    train(_config(no_splits, out, evaluate=False, max_steps=2, checkpoint_every=1))
    assert (out / "previous.pt").is_file() and int(load_checkpoint(out / "previous.pt")["step"]) == 1
    last = out / "last.pt"
    last.write_bytes(last.read_bytes()[:1000])
    with pytest.raises(
        CheckpointError, match=rf"{last}: damaged or truncated checkpoint \(1000 bytes.*previous.pt is intact"
    ):
        load_checkpoint(last)
    assert main(["evaluate", str(last), str(no_splits)]) == 2
    assert "damaged or truncated" in capsys.readouterr().err
    last.write_bytes(b"")
    with pytest.raises(CheckpointError, match="an empty file"):
        load_checkpoint(last)
    assert main(["train", str(no_splits), "--resume", str(last), *SMALL]) == 2
    assert "an empty file" in capsys.readouterr().err


def test_evaluate_refuses_a_dataset_of_other_classes(no_splits: Path, tmp_path: Path, capsys):
    out = tmp_path / "run"
    train(_config(no_splits, out, evaluate=False, max_steps=1))
    other = tmp_path / "cats"
    shutil.copytree(no_splits, other)
    for xml in (other / "Annotations").glob("*.xml"):
        text = xml.read_text()
        for name in ("face", "masked", "sunglasses"):
            text = text.replace(f"<name>{name}</name>", "<name>cat</name>")
        xml.write_text(text)
    assert main(["evaluate", str(out / "last.pt"), str(other), "--split", "all"]) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert "'cat'" in err and "share none with the checkpoint's" in err
    with pytest.raises(DataMismatchError, match="share none"):
        detloader.train.evaluate_checkpoint(out / "last.pt", other, split="all", read_options={"on_error": "skip"})


def test_a_stop_signal_in_the_cli_exits_with_its_status(monkeypatch, no_splits: Path, tmp_path: Path, capsys):
    import detloader.train as train_module

    def stopped(config, **callbacks):
        return {"stopped_by": "SIGTERM", "stopped_early": True, "steps": 3, "train_seconds": 1.0}

    monkeypatch.setattr(train_module, "train", stopped)
    assert main(["train", str(no_splits), "--out", str(tmp_path / "run"), *SMALL]) == 128 + signal.SIGTERM
    assert (
        f"stopped by SIGTERM after step 3; continue with --resume {tmp_path / 'run'}/last.pt" in capsys.readouterr().out
    )


# -- safe stop: a signal mid-epoch saves the step, and resuming sees the uninterrupted samples ---
SCRIPT = """
import json, os, sys, time, pathlib
from detloader.train import TrainConfig, train

data, out, record, workers, hold_at, resume = sys.argv[1:7]
config = TrainConfig(
    data=data, out=out, size=64, batch_size=4, epochs=2, width=4, num_workers=int(workers),
    warmup_steps=2, balance="inverse", evaluate=False, device="cpu",
    read_options={"cache": False, "workers": 1}, resume=resume or None,
)
with open(record, "a") as f:
    def on_step(info):
        f.write(json.dumps([info.global_step, info.image_ids]) + "\\n")
        f.flush()
        if info.global_step == int(hold_at):
            pathlib.Path(record + ".held").touch()
            time.sleep(3)  # the signal arrives during this step
    metrics = train(config, on_step=on_step)
print(json.dumps({"stopped_by": metrics["stopped_by"], "steps": metrics["steps"]}))
"""


def _steps(record: Path) -> list[tuple[int, tuple[int, ...]]]:
    return [(s, tuple(ids)) for s, ids in map(json.loads, record.read_text().splitlines())] if record.is_file() else []


def _train_process(data: Path, out: Path, record: Path, workers: int, hold_at: int = 0, resume: str = "",
                   **env_vars: str) -> subprocess.Popen:
    env = dict(os.environ, OMP_NUM_THREADS="1", **env_vars)
    args = [str(data), str(out), str(record), str(workers), str(hold_at), resume]
    return subprocess.Popen([sys.executable, "-c", SCRIPT, *args], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, start_new_session=True)


def _wait_held(proc: subprocess.Popen, record: Path) -> None:
    deadline = time.monotonic() + 240
    while not Path(f"{record}.held").exists():
        assert proc.poll() is None and time.monotonic() < deadline, proc.stderr.read().decode()[-3000:]
        time.sleep(0.1)


def _finish(proc: subprocess.Popen) -> dict:
    out, err = proc.communicate(timeout=240)
    assert proc.returncode == 0, err.decode()[-3000:]
    return json.loads(out.decode().strip().splitlines()[-1])


@pytest.mark.slow
@pytest.mark.timeout(400)
@pytest.mark.parametrize(
    ("workers", "signum", "group"), [(0, signal.SIGTERM, False), (2, signal.SIGTERM, True), (0, signal.SIGINT, False)]
)
def test_a_signal_mid_epoch_saves_the_step_and_resume_is_exact(
    no_splits: Path, tmp_path: Path, workers: int, signum: int, group: bool
):
    hold = 5  # mid-epoch 0 (7 or 8 steps per epoch)
    full = _finish(_train_process(no_splits, tmp_path / "full", tmp_path / "full.jsonl", workers))
    assert full["stopped_by"] is None and full["steps"] >= 14
    proc = _train_process(no_splits, tmp_path / "cut", tmp_path / "cut.jsonl", workers, hold_at=hold)
    _wait_held(proc, tmp_path / "cut.jsonl")
    # a scheduler signals the whole process group (loader workers too); a user the main process
    os.killpg(proc.pid, signum) if group else os.kill(proc.pid, signum)
    cut = _finish(proc)
    assert cut == {"stopped_by": signal.Signals(signum).name, "steps": hold}
    assert int(load_checkpoint(tmp_path / "cut" / "last.pt")["step"]) == hold
    rest = _finish(_train_process(no_splits, tmp_path / "cut", tmp_path / "rest.jsonl", workers,
                                  resume=str(tmp_path / "cut" / "last.pt")))
    assert rest["steps"] == full["steps"]
    assert _steps(tmp_path / "cut.jsonl") + _steps(tmp_path / "rest.jsonl") == _steps(tmp_path / "full.jsonl")


@pytest.mark.slow
@pytest.mark.distributed
@pytest.mark.timeout(400)
def test_sigterm_to_rank_0_stops_both_ranks_at_the_same_step(no_splits: Path, tmp_path: Path):
    port, hold, out = str(free_port()), 3, tmp_path / "cut"

    def ranks(name: str, hold_at: int = 0, resume: str = "") -> list[subprocess.Popen]:
        return [
            _train_process(no_splits, out, tmp_path / f"{name}{r}.jsonl", 0, hold_at=hold_at if r == 0 else 0,
                           resume=resume, MASTER_ADDR="127.0.0.1", MASTER_PORT=port, RANK=str(r),
                           LOCAL_RANK=str(r), WORLD_SIZE="2", LOCAL_WORLD_SIZE="2")
            for r in range(2)
        ]

    procs = ranks("cut", hold_at=hold)
    _wait_held(procs[0], tmp_path / "cut0.jsonl")
    os.kill(procs[0].pid, signal.SIGTERM)  # rank 0 only: rank 1 learns it at the step's end
    assert [_finish(p) for p in procs] == [{"stopped_by": "SIGTERM", "steps": hold}] * 2
    assert int(load_checkpoint(out / "last.pt")["step"]) == hold
    finished = [_finish(p) for p in ranks("rest", resume=str(out / "last.pt"))]
    assert finished[0] == finished[1] and finished[0]["stopped_by"] is None
    assert len(_steps(tmp_path / "cut1.jsonl")) + len(_steps(tmp_path / "rest1.jsonl")) == finished[0]["steps"]
