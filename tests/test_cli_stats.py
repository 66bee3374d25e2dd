"""`detloader stats`: JSON, tables, plot, errors."""

from __future__ import annotations

import json
import sys

import pytest

import detloader
from detloader.cli import main


def test_cli_json_raw_and_balanced(small_synth_root, capsys):
    assert main(["stats", str(small_synth_root), "--balance", "sqrt", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    idx = detloader.read_annotations(small_synth_root)
    assert data["raw"] == idx.class_counts()
    assert set(data["balanced"]) == set(idx.classes)
    assert sum(data["balanced"].values()) == pytest.approx(sum(data["drawn"].values()), rel=0.5)
    assert data["unit"] == "objects" and data["stats"]["images"] == len(idx)


def test_cli_json_by_image_counts_images(small_synth_root, capsys):
    assert main(["stats", str(small_synth_root), "--by", "image", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    idx = detloader.read_annotations(small_synth_root)
    assert data["unit"] == "images" and data["balanced"] is None
    assert data["raw"] == idx.image_class_counts()


def test_cli_tables_and_plot(small_synth_root, tmp_path, capsys):
    out = tmp_path / "b.png"
    assert main(["stats", str(small_synth_root), "--balance", "repeat_factor:0.5", "--plot", str(out)]) == 0
    text = capsys.readouterr().out
    for word in ("object classes", "imbalance ratio", "landmark visibility", "box sizes", "balance repeat_factor:0.5"):
        assert word in text
    assert out.read_bytes()[:4] == b"\x89PNG"


def test_cli_plot_needs_balance_and_matplotlib(small_synth_root, tmp_path, capsys, monkeypatch):
    assert main(["stats", str(small_synth_root), "--plot", str(tmp_path / "x.png")]) == 2
    assert "--plot needs --balance" in capsys.readouterr().err
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    monkeypatch.setitem(sys.modules, "matplotlib.figure", None)
    monkeypatch.setitem(sys.modules, "matplotlib.backends.backend_agg", None)
    assert main(["stats", str(small_synth_root), "--balance", "sqrt", "--plot", str(tmp_path / "x.png")]) == 2
    assert "plotting needs matplotlib: pip install 'detloader[plot]'" in capsys.readouterr().err


def test_cli_bad_strategy_is_one_line(small_synth_root, capsys):
    assert main(["stats", str(small_synth_root), "--balance", "magic"]) == 2
    assert "balance='magic' is not one of" in capsys.readouterr().err


@pytest.mark.dataset
def test_cli_on_bccd(bccd_root, capsys):
    assert main(["stats", str(bccd_root), "--balance", "repeat_factor", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["raw"] == {"Platelets": 361, "RBC": 4153, "WBC": 372}
    assert data["balanced"] == {k: float(v) for k, v in data["raw"].items()}  # t = 0.001: all r = 1
    assert data["notes"]
