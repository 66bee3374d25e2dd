"""detloader demo: the seed-to-result story, run small."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
from PIL import Image

from detloader.cli.parser import main
from detloader.show import grid_size


@pytest.mark.slow
def test_demo_runs_the_story_and_writes_its_pictures(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "demo"
    assert main(["demo", "--out", str(out), "--images", "40", "--epochs", "1", "--tune-budget", "1.5"]) == 0
    text = " ".join(capsys.readouterr().out.split())
    for step in ("1. synthesise", "2. index", "5. balance (sqrt)", "6. look at the data", "7. tune", "8. load",
                 "9. train", "10. evaluate"):
        assert step in text
    # the per-class evaluation table of the train CLI
    assert "AP@0.5" in text and "face" in text and "masked" in text and "box mAP@0.5" in text
    # the training run found the tuned settings of its own dataset through num_workers="auto"
    # ("tuned:", or "tuned, load changed:" when other jobs started meanwhile)
    assert "num_workers='auto': tuned" in text
    assert "== 1. synthesise == 40 images" in text  # not a terminal: short headings, not rules as wide as the page
    assert (out / "run" / "last.pt").is_file() and (out / "run" / "metrics.json").is_file()
    assert Image.open(out / "data.png").size == grid_size(16, 256, 4)
    assert Image.open(out / "augmented.png").size == grid_size(16, 256, 4)
    val = sum(1 for line in (out / "data" / "ImageSets" / "Main" / "val.txt").read_text().splitlines() if line)
    pairs = min(8, val)
    per_row = max(1, math.ceil(math.sqrt(pairs / 2)))
    assert Image.open(out / "run" / "predictions.png").size == grid_size(2 * pairs, 256, 2 * per_row)


def test_demo_refuses_too_few_images(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["demo", "--out", str(tmp_path), "--images", "3"]) == 2
    assert "--images=3" in capsys.readouterr().err
