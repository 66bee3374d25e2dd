"""``detloader train`` and ``detloader evaluate`` on a tiny dataset."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from detloader.cli import COMMANDS, main
from detloader.synth import make_synthetic

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
