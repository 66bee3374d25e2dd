"""Split folders one or two levels down: an export unpacked as ``train_zip/train/...`` and
``test_zip/test/...`` has a train and a test split, shown by ``detloader index``, and the
trainer never trains on a test image."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest
from helpers import voc_dataset, voc_object, voc_xml, write_image

from detloader import read_annotations
from detloader.cli import main
from detloader.train import TrainConfig
from detloader.train.run_data import prepare_data

N_TRAIN, N_TEST = 10, 15
LAYOUT = (("train_zip/train", "train", N_TRAIN), ("test_zip/test", "test", N_TEST))


def _voc_beside(root: Path, layout=LAYOUT) -> Path:
    """XML beside each image, in the folders of ``layout`` ((folder, stem prefix, count), ...)."""
    for folder, prefix, n in layout:
        for k in range(n):
            stem = f"{prefix}_{k}"
            write_image(root / folder / f"{stem}.jpg")
            obj = voc_object("cat" if k % 2 else "dog", (1, 2, 30, 40))
            (root / folder / f"{stem}.xml").write_text(voc_xml(f"{stem}.jpg", [obj]), encoding="utf-8")
    return root


def _yolo(root: Path, layout=LAYOUT) -> Path:
    """Ultralytics folders per split (``train_zip/train/images``, ``.../labels``), classes.txt at the root."""
    for folder, prefix, n in layout:
        for k in range(n):
            write_image(root / folder / "images" / f"{prefix}_{k}.jpg")
            label = root / folder / "labels" / f"{prefix}_{k}.txt"
            label.parent.mkdir(parents=True, exist_ok=True)
            label.write_text(f"{k % 2} 0.5 0.5 0.2 0.2\n")
    (root / "classes.txt").write_text("cat\ndog\n")
    return root


@pytest.fixture(params=["voc", "yolo"])
def nested(request: pytest.FixtureRequest, tmp_path: Path) -> Path:
    make = _voc_beside if request.param == "voc" else _yolo
    return make(tmp_path / f"export_{request.param}")


def _paths(index, ids) -> set[str]:
    return {index.relative_image_path(int(i)) for i in ids}


def test_split_folders_one_level_below_the_root_are_splits(nested: Path):
    index = read_annotations(nested)
    assert {k: len(v) for k, v in index.splits.items()} == {"train": N_TRAIN, "test": N_TEST}
    assert index.meta["split_sources"] == {"train": "folder train_zip/train/", "test": "folder test_zip/test/"}
    assert all(p.startswith(os.path.join("train_zip", "train", "")) for p in _paths(index, index.splits["train"]))
    assert all(p.startswith(os.path.join("test_zip", "test", "")) for p in _paths(index, index.splits["test"]))
    assert not [p for p in index.problems if p.kind.startswith("split_")]


def test_training_carves_its_validation_from_train_and_never_sees_a_test_image(nested: Path, tmp_path: Path):
    index = read_annotations(nested)
    config = TrainConfig(data=str(nested), out=str(tmp_path / "run"), read_options={"cache": False})
    data = prepare_data(config)
    trained, validated = set(data.train.image_paths()), set(data.val.image_paths())
    tests = _paths(index, index.splits["test"])
    assert len(tests) == N_TEST
    assert not trained & tests and not validated & tests and not trained & validated
    assert trained | validated == _paths(index, index.splits["train"])
    assert len(data.train) + len(data.val) == N_TRAIN and len(data.val) == N_TRAIN // 5
    source = data.split_info("train")["source"]
    assert source.startswith("random 80/20 of split 'train' (folder train_zip/train/;")
    assert f"split 'test', {N_TEST} images, never trained on" in source


def test_index_prints_and_reports_the_nested_splits(nested: Path, capsys: pytest.CaptureFixture[str]):
    assert main(["index", str(nested)]) == 0
    text = capsys.readouterr().out
    assert f"splits: test {N_TEST} (folder test_zip/test/), train {N_TRAIN} (folder train_zip/train/)" in text
    assert main(["index", str(nested), "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["splits"] == {"train": N_TRAIN, "test": N_TEST}
    assert summary["split_sources"] == {"train": "folder train_zip/train/", "test": "folder test_zip/test/"}


def test_a_split_name_three_folders_down_is_no_split(tmp_path: Path):
    only_deep = _voc_beside(tmp_path / "deep", (("a/b/test", "t", 2), ("a/b/other", "o", 2)))
    index = read_annotations(only_deep)
    assert index.splits == {} and index.meta["split_sources"] == {}
    mixed = _voc_beside(tmp_path / "mixed", (("train", "a", 3), ("x/y/test", "t", 2)))
    index = read_annotations(mixed)
    assert {k: len(v) for k, v in index.splits.items()} == {"train": 3}
    (outside,) = [p for p in index.problems if p.kind == "split_unassigned"]
    assert outside.message.startswith("2 images lie outside the split folders (train/)")


def test_an_image_below_two_split_folders_is_in_the_shallowest_split_only(tmp_path: Path):
    root = _voc_beside(tmp_path / "twice", (("train", "a", 3), ("train/test", "t", 2), ("valid", "v", 1)))
    index = read_annotations(root)
    assert {k: len(v) for k, v in index.splits.items()} == {"train": 5, "val": 1}
    assert index.meta["split_sources"] == {"train": "folder train/", "val": "folder valid/"}
    (nested,) = [p for p in index.problems if p.kind == "split_nested"]
    assert nested.message.startswith("2 images lie below two split folders")
    assert "below train/ and train/test/" in nested.message
    assert nested.severity == "repaired"


def test_a_test_image_a_split_file_also_lists_in_train_is_not_trained_on(tmp_path: Path):
    files = {s: voc_xml(f"{s}.jpg", [voc_object("cat", (1, 2, 30, 40))]) for s in "abcdef"}
    root = voc_dataset(tmp_path / "voc", files, splits={"train": "abcd", "val": "e", "test": "df"})
    config = TrainConfig(data=str(root), out=str(tmp_path / "run"), read_options={"cache": False})
    data = prepare_data(config)
    assert data.train.image_paths() == [os.path.join("JPEGImages", f"{s}.jpg") for s in "abc"]
    source = data.split_info("train")["source"]
    assert source == "ImageSets/Main/train.txt; 1 images also in test removed"  # by the index (split_overlap)
    assert data.val.image_paths() == [os.path.join("JPEGImages", "e.jpg")]


@pytest.mark.slow
def test_train_then_evaluate_the_test_split_of_a_nested_export(tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    pytest.importorskip("faster_coco_eval")
    root = _voc_beside(tmp_path / "export")
    out = tmp_path / "run"
    small = ["--size", "64", "--batch-size", "4", "--width", "4", "--num-workers", "0", "--epochs", "1"]
    assert main(["train", str(root), "--out", str(out), *small]) == 0
    assert "split 'test', 15 images, never trained on" in " ".join(capsys.readouterr().out.split())
    assert main(["evaluate", str(out / "last.pt"), str(root), "--split", "test", "--json"]) == 0
    metrics = json.loads(capsys.readouterr().out)
    assert metrics["images"] == N_TEST and metrics["seen_in_training"] == 0
    assert metrics["split"] == {"name": "test", "images": N_TEST, "source": "folder test_zip/test/"}


def test_split_force_keeps_the_test_split_and_cuts_train_val_from_the_rest(tmp_path: Path, capsys):
    root = _voc_beside(tmp_path / "export")
    test = _paths(read_annotations(root), read_annotations(root).splits["test"])
    assert main(["split", str(root), "--val", "0.2", "--force"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "test: splits.json (made by" in out and "test kept from folder test_zip/test/" in out
    assert f"2 of {N_TRAIN + N_TEST} images change split: train -> val 2" in out
    index = read_annotations(root)
    assert _paths(index, index.splits["test"]) == test  # as it was
    assert {k: len(v) for k, v in index.splits.items()} == {"train": 8, "val": 2, "test": N_TEST}
    assert not set(_paths(index, index.splits["train"])) & test and not index.problems
    assert main(["split", str(root), "--val", "0.2", "--test", "0.2", "--force", "--json"]) == 0  # a new test split
    data = json.loads(capsys.readouterr().out)
    assert sum(data[k]["images"] for k in ("train", "val", "test")) == N_TRAIN + N_TEST
    moved = data["moved"]
    assert sum(n for k, n in moved.items() if k.startswith("test -> ")) > 0 and all(" -> " in k for k in moved)
    again = read_annotations(root)
    changed = sum(again.splits[k].size - np.isin(again.splits[k], index.splits[k]).sum() for k in again.splits)
    assert sum(moved.values()) == changed  # every image that changed split, counted once
