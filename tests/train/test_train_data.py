"""What the trainer feeds the model: the training augmentation keeps the picture; the validation
images are never training images."""

from __future__ import annotations

import json
import os
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
from helpers import voc_dataset, voc_object, voc_xml, write_image

from detloader import read_annotations
from detloader.cli import main
from detloader.train import TrainConfig
from detloader.train.checkpoint import load_checkpoint
from detloader.train.run_data import prepare_data
from detloader.transforms import ColorJitter


def test_colour_jitter_keeps_bright_images_bright():
    # Saturation used to overflow int16 (255 * 150 > 32767) and turn bright images black.
    image = np.full((8, 8, 3), (200, 180, 150), dtype=np.uint8)
    rng = np.random.default_rng(0)
    for _ in range(20):
        out = ColorJitter()(SimpleNamespace(image=image), rng).image  # reads only .image
        assert abs(float(out.mean()) - float(image.mean())) < 0.45 * float(image.mean())


def _yolo_val_is_train(root: Path, n: int = 10) -> Path:
    """A YOLO dataset whose data.yaml names the training images as val (``val: images``, as
    Ultralytics exports without a val split write it)."""
    for i in range(n):
        write_image(root / "images" / f"{i:02d}.jpg")
        (root / "labels").mkdir(parents=True, exist_ok=True)
        (root / "labels" / f"{i:02d}.txt").write_text(f"{i % 2} 0.5 0.5 0.4 0.4\n")
    (root / "data.yaml").write_text("train: images\nval: images\nnames: [a, b]\n")
    return root


def test_a_val_split_that_is_the_train_split_is_a_problem_and_never_validated_on(tmp_path: Path, capsys):
    root = _yolo_val_is_train(tmp_path / "yolo")
    index = read_annotations(root)
    (overlap,) = [p for p in index.problems if p.kind == "split_overlap"]
    assert str(overlap) == (
        "data.yaml: all 10 images of val (data.yaml: val) are also in train (data.yaml: train), as "
        "'images/00.jpg' (kept in train, removed from val; val is left empty)"
    )
    assert {k: len(v) for k, v in index.splits.items()} == {"train": 10, "val": 0}
    assert main(["validate", str(root), "--no-images"]) == 0  # a repair: named, not a failure
    assert "split_overlap" in capsys.readouterr().out
    data = prepare_data(TrainConfig(data=str(root), out=str(tmp_path / "run")))
    train, val = set(data.train.image_paths()), set(data.val.image_paths())
    assert len(train) == 8 and len(val) == 2 and not train & val
    assert data.split_info("val")["source"] == (
        "random 80/20 of split 'train' (data.yaml: train) (seed 0, stratified by class; the dataset's 'val' "
        "split has no image outside split 'train': data.yaml: val; 10 images also in train removed)"
    )


def test_a_test_split_that_is_the_train_split_leaves_nothing_to_train_on_and_says_so(tmp_path: Path):
    root = _yolo_val_is_train(tmp_path / "yolo", n=4)
    (root / "data.yaml").write_text("train: images\ntest: images\nnames: [a, b]\n")
    with pytest.raises(ValueError, match=r"no image to train on in split 'train': .*4 images also in test removed"):
        prepare_data(TrainConfig(data=str(root), out=str(tmp_path / "run")))


def test_a_val_split_inside_the_training_split_is_cut_from_it_whatever_their_names(tmp_path: Path):
    files = {s: voc_xml(f"{s}.jpg", [voc_object("cat", (1, 2, 30, 40))]) for s in "abcdefgh"}
    splits = {"train": "abcde", "val": "fg", "trainval": "abcdefg", "test": "h"}
    root = voc_dataset(tmp_path / "voc", files, splits=splits)
    (root / "ImageSets" / "Main" / "trainval.txt").write_text("a\nb\nc\nd\ne\nf\ng\nh\n")  # h: also in test
    config = TrainConfig(data=str(root), out=str(tmp_path / "run"), train_split="trainval", val_split="val")
    data = prepare_data(config)
    train, val = set(data.train.image_paths()), set(data.val.image_paths())
    assert not train & val and len(train | val) == 7 and os.path.join("JPEGImages", "h.jpg") not in train | val
    source = data.split_info("val")["source"]
    assert source.startswith("random 80/20 of split 'trainval' (ImageSets/Main/trainval.txt; 1 of its images also "
                             "in split 'test' left out; split 'test', 1 images, never trained on)")
    assert source.endswith("the dataset's 'val' split has no image outside split 'trainval': ImageSets/Main/val.txt)")
    (root / "ImageSets" / "Main" / "trainval.txt").write_text("a\nb\nc\nd\ne\nf\n")  # g: val's own
    data = prepare_data(config)
    assert data.val.image_paths() == [os.path.join("JPEGImages", "g.jpg")]
    assert data.split_info("val")["source"] == (
        "ImageSets/Main/val.txt; 1 of its images also in split 'trainval' left out")


@pytest.mark.slow
def test_a_run_on_a_yolo_export_whose_val_is_its_train_never_validates_on_a_training_image(tmp_path: Path, capsys):
    pytest.importorskip("faster_coco_eval")
    root = _yolo_val_is_train(tmp_path / "yolo", n=20)
    out = tmp_path / "run"
    small = ["--size", "64", "--batch-size", "4", "--width", "4", "--num-workers", "0", "--epochs", "1"]
    assert main(["train", str(root), "--out", str(out), *small]) == 0
    printed = " ".join(capsys.readouterr().out.split())
    assert "validating on split 'val': 4 images (random 80/20 of split 'train'" in printed
    assert "the dataset's 'val' split has no image outside split 'train'" in printed
    record = load_checkpoint(out / "last.pt")["data"]["splits"]
    train, val = (set(record[role]["paths"].split("\n")) for role in ("train", "val"))
    assert len(train) == 16 and len(val) == 4 and not train & val
    assert main(["evaluate", str(out / "last.pt"), str(root), "--json"]) == 0
    metrics = json.loads(capsys.readouterr().out)
    assert metrics["images"] == 4 and metrics["seen_in_training"] == 0
