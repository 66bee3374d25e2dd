"""`detloader stats`: JSON, tables, plot, errors."""

from __future__ import annotations

import json
import sys

import pytest
from helpers import voc_dataset, voc_object, voc_xml

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
    assert "--balance='magic' is not one of" in capsys.readouterr().err


@pytest.mark.dataset
def test_cli_on_bccd(bccd_root, capsys):
    assert main(["stats", str(bccd_root), "--balance", "repeat_factor", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["raw"] == {"Platelets": 361, "RBC": 4153, "WBC": 372}
    assert data["balanced"] == {k: float(v) for k, v in data["raw"].items()}  # t = 0.001: all r = 1
    assert data["notes"]


def test_cli_on_no_images_says_so(tmp_path, capsys):
    (tmp_path / "Annotations").mkdir()
    for argv in ([], ["--balance", "sqrt"], ["--json"]):
        assert main(["stats", str(tmp_path), *argv]) == 2
        err = capsys.readouterr().err
        assert "no images to describe: the annotations name no images" in err and "weights must be" not in err


def _one_rare_image(root):
    files = {f"i{k:02d}": voc_xml(f"i{k:02d}.jpg", [voc_object("car", (1, 1, 20, 20))]) for k in range(39)}
    files["rare"] = voc_xml("rare.jpg", [voc_object("bus", (1, 1, 20, 20))])
    return voc_dataset(root, files)


def test_cli_warns_of_an_image_drawn_over_and_over(tmp_path, capsys):
    root = _one_rare_image(tmp_path)
    assert main(["stats", str(root), "--balance", "inverse"]) == 0
    out = capsys.readouterr().out
    # inverse: the only bus image carries half the weight, 20 of the 40 draws
    assert "warning: JPEGImages/rare.jpg is drawn 20.0 times per epoch in expectation (over 10)" in out
    assert main(["stats", str(root), "--balance", "inverse", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["max_repeats"] == {"image": "JPEGImages/rare.jpg", "expected": 20.0} and len(data["warnings"]) == 1
    assert main(["stats", str(root), "--balance", "sqrt"]) == 0
    assert "warning:" not in capsys.readouterr().out  # 40 / (1 + 39 / sqrt(39)) = 5.5


def test_cli_plot_log_scale(tmp_path, capsys):
    root = _one_rare_image(tmp_path / "ds")
    for argv, log in (([], True), (["--log", "off"], False), (["--log"], True)):
        assert main(["stats", str(root), "--balance", "sqrt", "--plot", str(tmp_path / "b.png"), *argv]) == 0
        assert ("(log scale)" in capsys.readouterr().out) is log  # auto: raw 39 : 1


def _yolo_splits(root):
    """A data.yaml with a train split of 3 images (one holding the rare class 'b') and a val
    split of 2 images holding only 'a'."""
    from PIL import Image

    (root / "images").mkdir(parents=True)
    (root / "labels").mkdir()
    labels = {"t0": "0", "t1": "0", "t2": "1", "v0": "0", "v1": "0"}
    for name, cls in labels.items():
        Image.new("RGB", (32, 32)).save(root / "images" / f"{name}.png")
        (root / "labels" / f"{name}.txt").write_text(f"{cls} 0.5 0.5 0.2 0.2\n")
    (root / "train.txt").write_text("".join(f"./images/{n}.png\n" for n in ("t0", "t1", "t2")))
    (root / "val.txt").write_text("".join(f"./images/{n}.png\n" for n in ("v0", "v1")))
    (root / "data.yaml").write_text("train: train.txt\nval: val.txt\nnames:\n  0: a\n  1: b\n")
    return root / "data.yaml"


def test_cli_split_of_a_data_yaml_is_what_the_ultralytics_trainer_balances(tmp_path, capsys):
    yaml = _yolo_splits(tmp_path / "yolo")
    assert main(["stats", str(yaml), "--split", "train", "--balance", "inverse", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["raw"] == {"a": 2, "b": 1}
    assert out["balanced"]["b"] == pytest.approx(1.5) and out["balanced"]["a"] == pytest.approx(1.5)
    assert main(["stats", str(yaml), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["raw"] == {"a": 4, "b": 1}
    assert main(["stats", str(yaml), "--split", "nope"]) != 0
    assert "split='nope' not found" in capsys.readouterr().err
