"""CLI: synth, index --json, validate (table and exit status), demo."""

from __future__ import annotations

import json

import pytest
from helpers import voc_dataset, voc_object, voc_xml

from detloader.cli import main


def test_synth_then_index_json(tmp_path, capsys):
    assert main(["synth", str(tmp_path / "s"), "--images", "6", "--seed", "2"]) == 0
    capsys.readouterr()
    assert main(["index", str(tmp_path / "s"), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["images"] == 6
    assert sum(data["classes"].values()) == data["objects"]
    assert data["problems"] == {}
    assert set(data) >= {"images", "objects", "classes", "problems"}


def test_index_json_reports_problem_counts(tmp_path, capsys):
    objects = [voc_object("k", (5, 5, 2, 9)), voc_object("k", (1, 1, 4, 4))]
    root = voc_dataset(tmp_path, {"a": voc_xml("a.jpg", objects), "b": voc_xml("gone.jpg")}, images=["a.jpg"])
    assert main(["index", str(root), "--json"]) == 1  # errors found: items dropped
    data = json.loads(capsys.readouterr().out)
    assert data["problems"] == {"empty_box": 1, "missing_image": 1}
    assert data["objects"] == 1
    assert main(["index", str(root), "--on-error", "raise"]) == 2
    err = capsys.readouterr().err
    assert "Annotations/a.xml: object[1]/bndbox: xmax=2 <= xmin=5" in err


def test_validate_lists_every_problem_and_exit_status(tmp_path, capsys):
    objects = [voc_object("k", (5, 5, 2, 9)), voc_object("k", ("x", 1, 4, 4))]
    root = voc_dataset(tmp_path / "bad", {"a": voc_xml("a.jpg", objects), "b": voc_xml("b.jpg", objects)})
    assert main(["validate", str(root)]) == 1
    out = capsys.readouterr().out
    assert out.count("empty_box") >= 2 and out.count("bad_value") >= 2 and "4 errors" in out
    assert main(["validate", str(root), "--json"]) == 1
    assert len(json.loads(capsys.readouterr().out)["items"]) == 4
    good = voc_dataset(tmp_path / "good", {"a": voc_xml("a.jpg", [voc_object("k", (1, 1, 4, 4))])})
    assert main(["validate", str(good)]) == 0
    assert "no problems" in capsys.readouterr().out


def test_bad_argument_is_one_line(tmp_path, capsys):
    assert main(["index", str(tmp_path / "missing")]) == 2
    assert "does not exist" in capsys.readouterr().err


def test_demo_runs(tmp_path, capsys):
    assert main(["demo", "--out", str(tmp_path / "demo"), "--images", "24", "--tune-budget", "0", "--size", "96",
                 "--epochs", "1"]) == 0
    out = capsys.readouterr().out
    for step in ("synthesise", "index", "validate", "summary", "balance", "load"):
        assert step in out
    assert "images/s" in out and "WeightedSampler" in out


@pytest.mark.slow
def test_demo_with_tuning(tmp_path, capsys):
    assert main(["demo", "--out", str(tmp_path / "demo"), "--images", "40", "--tune-budget", "4", "--size", "96"]) == 0
    out = capsys.readouterr().out
    assert "recommended: make_loader(" in out and "num_workers='auto'" in out
