"""``detloader train`` and ``detloader evaluate`` on a tiny dataset."""

from __future__ import annotations

import io
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from rich.console import Console

from detloader.cli import COMMANDS, main
from detloader.cli.train import LOG_SECONDS, StepFigures, StepProgress, _duration
from detloader.synth import make_synthetic
from detloader.train import StepInfo

pytest.importorskip("faster_coco_eval")


def test_commands_are_listed_and_help_does_not_import_torch():
    assert "train" in COMMANDS and "evaluate" in COMMANDS
    code = (
        "import sys; from detloader.cli import build_parser; build_parser(); "
        "print('torch' in sys.modules, 'detloader.train' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["False", "False"]


@pytest.mark.slow
def test_train_then_evaluate(tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    data = make_synthetic(tmp_path / "faces", 40, seed=1, size=(96, 72))
    out = tmp_path / "run"
    common = ["--size", "64", "--batch-size", "4", "--width", "4", "--num-workers", "0", "--out", str(out)]
    assert main(["train", str(data), "--epochs", "1", "--balance", "sqrt", *common]) == 0
    text = capsys.readouterr().out
    assert "data wait" in text and "% of step time" in text and "mAP@0.5" in text and "sunglasses" in text
    assert {"last.pt", "metrics.json", "config.json"} <= {p.name for p in out.iterdir()}
    # the checkpoint's settings carry over to --resume; one more epoch from the end of the first
    assert (
        main(
            [
                "train",
                str(data),
                "--epochs",
                "2",
                "--resume",
                str(out / "last.pt"),
                "--out",
                str(out),
                "--json",
                "--num-workers",
                "0",
            ]
        )
        == 0
    )
    resumed = json.loads(capsys.readouterr().out)
    assert resumed["steps"] == 16 and len(resumed["epochs"]) == 2 and resumed["config"]["balance"] == "sqrt"
    assert main(["evaluate", str(out / "last.pt"), str(data), "--json"]) == 0
    metrics = json.loads(capsys.readouterr().out)
    assert metrics["images"] == 8 and metrics["map50"] == pytest.approx(resumed["map50"])
    assert (
        main(["evaluate", str(out / "last.pt"), str(data), "--split", "all", "--coco-json", str(tmp_path / "d.json")])
        == 0
    )
    assert "40 images" in capsys.readouterr().out
    assert {d["image_id"] for d in json.loads((tmp_path / "d.json").read_text())} <= set(range(1, 41))


def test_bad_arguments_are_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    assert main(["train", "--balance", "median", "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "balance='median'" in err and "sqrt" in err
    assert main(["evaluate", str(tmp_path / "missing.pt"), str(tmp_path)]) == 2
    assert "missing.pt" in capsys.readouterr().err


def test_a_progress_line_names_every_figure():
    figures = StepFigures(1, 12, 40, 107, 21.34, 0.123, 2.3414, 190.2)
    assert figures.line() == "epoch 1/12 step 40/107 37% 21.3 img/s data 12% loss 2.341 eta 3m10s"
    assert [_duration(s) for s in (0, 44.6, 59.6, 190.2, 3725, -1)] == ["0s", "45s", "1m00s", "3m10s", "1h02m", "0s"]


def _step(epoch: int, step: int, steps: int = 10, loss: float = 2.0) -> StepInfo:
    return StepInfo(epoch, step, steps, step, {"total": loss}, 1e-3, [0, 1, 2, 3], 0.25, 0.75, 0)


def test_progress_lines_every_n_steps_and_at_least_every_30_s():
    now = [0.0]
    out = Console(file=io.StringIO(), width=200)
    assert not out.is_terminal
    progress = StepProgress(out, epochs=2, log_every=3, world_size=2, clock=lambda: now[0])
    with progress:
        for step in range(1, 8):
            now[0] += 1.0  # a step of 1 s: 0.25 s waiting for data
            progress(_step(0, step, loss=float(step)))
        now[0] += LOG_SECONDS  # a slow step: a line although 8 is not a multiple of 3
        progress(_step(0, 8))
        now[0] += 1.0
        progress(_step(1, 1))  # a new epoch starts its own figures
    lines = out.file.getvalue().splitlines()
    # 4 images a step on each of 2 ranks, 1 s a step: 8 img/s; the mean loss of steps 1-3 is 2
    assert lines[:2] == [
        "epoch 1/2 step 3/10 30% 8.0 img/s data 25% loss 2.000 eta 7s",
        "epoch 1/2 step 6/10 60% 8.0 img/s data 25% loss 3.500 eta 4s",
    ]
    assert lines[2].startswith("epoch 1/2 step 8/10 80% 1.7 img/s data 25% loss 3.750 eta ")
    assert len(lines) == 3


def test_on_a_terminal_a_live_bar_instead_of_lines():
    out = Console(file=io.StringIO(), width=200, force_terminal=True, highlight=False)
    with StepProgress(out, epochs=2, log_every=1) as progress:
        for step in (1, 2):
            progress(_step(0, step))
        progress._bar.refresh()
        drawn = out.file.getvalue()
        progress.epoch_end()
        out.print("epoch 1/2: loss 2.000")
    assert "epoch 1/2" in drawn and "2/10" in drawn and "img/s data 25% loss 2.000 eta" in drawn
    text = out.file.getvalue()
    assert "step 2/10" not in text  # no plain lines
    assert text.rindex("━") < text.index("epoch 1/2: loss 2.000")  # the bar was gone before the epoch's line


@pytest.mark.slow
def test_train_in_a_pipe_prints_progress_lines(tmp_path: Path):
    data = make_synthetic(tmp_path / "faces", 24, seed=1, size=(64, 48))
    env = {k: v for k, v in os.environ.items() if k not in ("FORCE_COLOR", "TTY_COMPATIBLE")}
    env["PYTHONPATH"] = os.pathsep.join([str(Path(__file__).resolve().parents[2] / "src"), env.get("PYTHONPATH", "")])
    args = ["train", str(data), "--epochs", "1", "--size", "64", "--batch-size", "4", "--width", "4",
            "--num-workers", "0", "--no-eval", "--log-every", "2", "--out", str(tmp_path / "run")]
    done = subprocess.run([sys.executable, "-m", "detloader", *args], capture_output=True, text=True, env=env,
                          timeout=300)
    assert done.returncode == 0, done.stderr
    shown = re.compile(r"epoch 1/1 step (\d+)/(\d+) \d+% \d+\.\d img/s data \d+% loss \d+\.\d{3} eta \d+s")
    lines = done.stdout.splitlines()
    found = [(i, int(m.group(1)), int(m.group(2))) for i, m in enumerate(map(shown.fullmatch, lines)) if m]
    steps = found[0][2] if found else 0
    assert [step for _, step, _ in found] == list(range(2, steps + 1, 2)) and steps >= 4, done.stdout
    assert lines[found[-1][0] + 1].startswith("epoch 1/1: loss")  # then the epoch's line
    assert "\x1b" not in done.stdout  # plain lines, no bar drawn in the pipe
