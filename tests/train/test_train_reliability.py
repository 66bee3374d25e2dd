"""Run folders and checkpoints under faults (issue 31, cases 4, 5, 7, 8): a full disk while saving,
links planted in a reused run folder, interrupted writes, hostile checkpoints, resumes with other
settings. Each ends with one named error (exit status 2 from the CLI, no traceback) and nothing lost."""

from __future__ import annotations

import errno
import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from detloader.cli import main
from detloader.errors import CheckpointError, DetloaderRuntimeWarning, DiskFullError, NotRegularFileError
from detloader.synth import make_synthetic
from detloader.train import TrainConfig, evaluate_checkpoint, load_checkpoint, train

SMALL = ["--size", "64", "--batch-size", "4", "--width", "4", "--num-workers", "0"]


@pytest.fixture(scope="module")
def faces(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """40 synthetic faces of 96 x 72 with train / val splits."""
    return make_synthetic(tmp_path_factory.mktemp("rel") / "faces", 40, seed=1, size=(96, 72))


@pytest.fixture(scope="module")
def base_run(faces: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A run stopped at step 2 of 16 (batch 4, 2 epochs): last.pt at step 2, previous.pt at step 1."""
    out = tmp_path_factory.mktemp("base") / "run"
    config = TrainConfig(data=str(faces), out=str(out), size=64, batch_size=4, epochs=2, width=4, num_workers=0,
                         warmup_steps=2, read_options={"cache": False}, evaluate=False, max_steps=2,
                         checkpoint_every=1)
    train(config)
    return out


@pytest.fixture
def run(base_run: Path, tmp_path: Path) -> Path:
    """A copy of :func:`base_run` of the test's own."""
    return Path(shutil.copytree(base_run, tmp_path / "work" / "run"))


def _temporaries(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if p.name.endswith(".tmp"))


def _error_line(err: str) -> str:
    assert "Traceback" not in err and err.startswith("detloader ")
    return " ".join(err.split())


# -- case 4: a full disk while saving a checkpoint ------------------------------------------------
FSIZE_SAVE = r"""
import resource, signal, sys
from detloader.errors import DiskFullError
from detloader.train import load_checkpoint, save_checkpoint
path = sys.argv[1]
state = load_checkpoint(path)
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails with EFBIG instead
limit = int(sys.argv[2])
resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
try:
    save_checkpoint(path, state)
except DiskFullError as err:
    print("DiskFullError", err.errno, err)
"""


def test_a_file_size_limit_while_saving_is_a_named_disk_full_error(run: Path):
    last, previous = run / "last.pt", run / "previous.pt"
    before = {p.name: p.read_bytes() for p in (last, previous)}
    done = subprocess.run(
        [sys.executable, "-c", FSIZE_SAVE, str(last), str(last.stat().st_size // 2)],
        capture_output=True, text=True, timeout=120, env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith(f"DiskFullError {errno.EFBIG} {last}: not written, the file size limit"), done.stdout
    assert "any previous file is unchanged" in done.stdout and "Traceback" not in done.stderr
    assert {p.name: p.read_bytes() for p in (last, previous)} == before
    assert _temporaries(run) == []
    assert int(load_checkpoint(last)["step"]) == 2


def _disk_full_save(obj, fh, *args, **kwargs):
    """What torch.save does on a full disk: some bytes out, then the writer's ENOSPC wrapped in a
    RuntimeError with a message that does not say so."""
    fh.write(b"\0" * 4096)
    try:
        raise OSError(errno.ENOSPC, "No space left on device")
    except OSError:
        raise RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 704 vs 598") from None


def test_a_full_disk_ends_training_with_the_named_error_and_the_last_checkpoint_kept(
    faces: Path, run: Path, monkeypatch: pytest.MonkeyPatch, capsys
):
    last = run / "last.pt"
    before = last.read_bytes()
    monkeypatch.setattr(torch, "save", _disk_full_save)
    code = main(["train", str(faces), "--resume", str(last), "--no-eval", "--max-steps", "3", "--num-workers", "0"])
    line = _error_line(capsys.readouterr().err)
    assert code == 2
    assert f"detloader train: error: {last}: not written, no space left on the device (" in line
    assert "MiB free on" in line and "any previous file is unchanged: free some space" in line
    assert last.read_bytes() == before and _temporaries(run) == []
    monkeypatch.undo()
    assert int(load_checkpoint(last)["step"]) == 2


def test_the_disk_full_error_is_found_through_torch_wrapping():
    from detloader._system.files import no_room_error

    try:
        _disk_full_save(None, open(os.devnull, "wb"))
    except RuntimeError as err:
        assert no_room_error(err) is not None and no_room_error(err).errno == errno.ENOSPC
    assert no_room_error(RuntimeError("unexpected pos")) is None
    assert isinstance(DiskFullError("x"), OSError)


# -- case 5: run files written whole, never through a link ----------------------------------------
@pytest.mark.parametrize("name", ["metrics.json", "config.json", ".train.owner.json", ".train.lock", "previous.pt"])
def test_a_link_planted_in_a_reused_run_folder_is_refused_and_its_target_untouched(
    faces: Path, run: Path, name: str, capsys
):
    outside = run.parent / "outside.json"
    outside.write_text("precious\n")
    (run / name).unlink(missing_ok=True)
    (run / name).symlink_to(Path("..") / "outside.json")
    last = (run / "last.pt").read_bytes()
    began = time.monotonic()
    code = main(["train", str(faces), "--resume", str(run / "last.pt"), "--no-eval", "--num-workers", "0"])
    line = _error_line(capsys.readouterr().err)
    assert code == 2 and time.monotonic() - began < 60
    assert f"{run / name}: a symbolic link (to {Path('..') / 'outside.json'}), not a regular file" in line
    assert "remove the link" in line
    assert outside.read_text() == "precious\n" and (run / "last.pt").read_bytes() == last
    assert (run / name).is_symlink()


def test_a_link_at_a_file_written_later_is_refused_by_the_writer(tmp_path: Path):
    from detloader._system.files import write_file

    outside = tmp_path / "outside.json"
    outside.write_text("precious")
    link = tmp_path / "run" / "metrics.json"
    link.parent.mkdir()
    link.symlink_to(outside)
    with pytest.raises(NotRegularFileError, match=r"metrics.json: a symbolic link \(to .*outside.json\)"):
        write_file(link, "{}", durable=True, no_follow=True)
    assert outside.read_text() == "precious" and _temporaries(link.parent) == []
    config_link = link.with_name("config.json")
    config_link.symlink_to(outside)
    with pytest.raises(NotRegularFileError, match=r"config.json: a symbolic link"):
        TrainConfig().save(config_link)
    assert outside.read_text() == "precious"


def test_an_interrupted_write_leaves_the_old_run_file_whole(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    path = tmp_path / "config.json"
    TrainConfig(epochs=3).save(path)
    old = path.read_text()

    def fail(*args, **kwargs):
        raise OSError(errno.EIO, "Input/output error")

    monkeypatch.setattr(os, "replace", fail)
    with pytest.raises(OSError, match="Input/output error"):
        TrainConfig(epochs=4).save(path)
    monkeypatch.undo()
    assert path.read_text() == old and json.loads(old)["epochs"] == 3 and _temporaries(tmp_path) == []


def test_run_files_are_written_whole(run: Path):
    config = json.loads((run / "config.json").read_text())
    assert config["max_steps"] == 2 and not (run / ".train.owner.json").exists() and _temporaries(run) == []


# -- case 7: a hostile or damaged checkpoint -----------------------------------------------------
def _hostile(run: Path, where: str, key: str, value) -> Path:
    state = load_checkpoint(run / "last.pt")
    state[where] = {**state[where], key: value}
    path = run.parent / "hostile" / "last.pt"
    path.parent.mkdir(exist_ok=True)
    torch.save(state, path)
    return path


@pytest.mark.parametrize(
    ("where", "key", "value", "said"),
    [
        ("model_config", "width", 10**6, "model_config width=1000000 is outside [4, 1024]"),
        ("model_config", "num_classes", 10**9, "model_config num_classes=1000000000 is outside [1, 100000]"),
        ("model_config", "head_width", "64", "model_config head_width='64' is outside [4, 4096]"),
        ("config", "width", 10**6, "config width=1000000 is outside [1, 1024]"),
        ("config", "size", 2**20, "config size=1048576 is outside [1, 8192]"),
        ("config", "read_options", ["images_by", "id"], "config read_options (list) is not a mapping"),
    ],
)
def test_a_checkpoint_asking_an_absurd_size_is_refused_before_anything_is_built(
    faces: Path, run: Path, where: str, key: str, value, said: str, capsys
):
    path = _hostile(run, where, key, value)
    began = time.monotonic()
    refused = re.escape(f"{path}: {said}") + ".*a damaged or hostile checkpoint, nothing was built"
    with pytest.raises(CheckpointError, match=refused):
        evaluate_checkpoint(path, faces, read_options={"cache": False})
    assert time.monotonic() - began < 10
    assert main(["evaluate", str(path), str(faces)]) == 2
    assert said in _error_line(capsys.readouterr().err)
    assert main(["train", str(faces), "--resume", str(path), "--no-eval", "--num-workers", "0"]) == 2
    assert said in _error_line(capsys.readouterr().err)


def test_a_checkpoint_whose_weights_do_not_fit_its_config_is_named(faces: Path, run: Path, capsys):
    mismatched = _hostile(run, "model_config", "head_width", 8)
    with pytest.raises(CheckpointError, match=re.escape(str(mismatched)) + r": its model state does not fit the model"):
        evaluate_checkpoint(mismatched, faces, read_options={"cache": False})
    odd = _hostile(run, "model_config", "num_classes", 7)
    assert main(["evaluate", str(odd), str(faces)]) == 2
    assert "model_config num_classes=7 does not match its" in _error_line(capsys.readouterr().err)


# -- case 8: resuming with other settings ---------------------------------------------------------
def test_a_resume_with_another_batch_size_is_refused_naming_it(faces: Path, run: Path, capsys):
    last = run / "last.pt"
    before = last.read_bytes()
    code = main(["train", str(faces), "--resume", str(last), "--batch-size", "8", "--no-eval", "--num-workers", "0"])
    line = _error_line(capsys.readouterr().err)
    assert code == 2 and last.read_bytes() == before
    assert "settings differ from the checkpoint's: batch_size 4 -> 8 (the steps per epoch and the sample order)" in line
    assert "would not be exact" in line and "--allow-setting-change" in line
    assert main(["train", str(faces), "--resume", str(last), "--width", "8", "--no-eval"]) == 2
    line = _error_line(capsys.readouterr().err)
    assert "width 4 -> 8 (the weights' shape) cannot change on resume" in line and "--width 4" in line


def test_an_allowed_batch_size_change_spans_the_schedule_over_the_steps_left(faces: Path, run: Path):
    from detloader.errors import ResumeSettingsError

    saved = TrainConfig.from_dict({**load_checkpoint(run / "last.pt")["config"], "max_steps": None})
    resumed = saved.replace(out=str(run), resume=str(run / "last.pt"), batch_size=8)
    with pytest.raises(ResumeSettingsError, match="batch_size 4 -> 8"):
        train(resumed)
    starts = []
    said = r"resumed at step 2 with other settings.*batch_size 4 -> 8.*spans 9 steps"
    with pytest.warns(UserWarning, match=said) as got:
        metrics = train(resumed.replace(allow_setting_change=True), on_start=starts.append)
    assert [w.filename for w in got if "resumed at step" in str(w.message)] == [__file__]  # names train's caller
    # 8 of epoch 0's 32 images were consumed at batch 4: 3 steps of 8 finish it, 4 more make epoch 1
    assert starts[0].start_step == 2 and starts[0].total_steps == 9 and metrics["steps"] == 9
    assert "batch_size 4 -> 8" in metrics["resume_changes"]
    assert json.loads((run / "config.json").read_text())["batch_size"] == 8


def test_a_new_lr_on_resume_is_what_the_optimizer_runs_with_and_is_said(faces: Path, run: Path, capsys):
    from detloader.train.loop import _schedule

    last = run / "last.pt"
    said = r"resumed at step 2 with other settings than the checkpoint's.*lr 0.003 -> 0.01 \(the optimiser's base"
    with pytest.warns(DetloaderRuntimeWarning, match=said + r".*spans 16 steps, the learning rate at this step 0.003"):
        code = main(["train", str(faces), "--resume", str(last), "--lr", "0.01", "--max-steps", "3", "--no-eval",
                     "--num-workers", "0"])
    assert code == 0 and "Traceback" not in capsys.readouterr().err
    state = load_checkpoint(last)
    config = TrainConfig.from_dict(state["config"])
    assert config.lr == 0.01 and json.loads((run / "config.json").read_text())["lr"] == 0.01
    assert json.loads((run / "metrics.json").read_text())["config"]["lr"] == 0.01
    group = state["optimizer"]["param_groups"][0]
    assert group["initial_lr"] == 0.01 and state["scheduler"]["base_lrs"] == [0.01]
    assert group["lr"] == pytest.approx(0.01 * _schedule(config, 16)(3))
    assert "lr 0.003 -> 0.01" in json.loads((run / "metrics.json").read_text())["resume_changes"]
