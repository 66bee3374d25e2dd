"""Splits: found wherever the layout puts them (VOC ImageSets/Main, VOCdevkit below the path,
COCO files per split, train/ valid/ test/ folders, splits.json), their problems named, made
once (seeded, stratified) where the layout keeps them, recorded in meta["split_sources"]."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import numpy as np
import pytest
from helpers import voc_dataset, voc_object, voc_xml, write_image
from hypothesis import given, settings
from hypothesis import strategies as st

import detloader
from detloader import make_splits, read_annotations
from detloader.annotations.splits import SplitsExistError, split_role, stratified_split
from detloader.cli import main
from detloader.synth import make_synthetic


def _synth(root: Path, n: int = 20) -> Path:
    return make_synthetic(root, n, seed=0, size=(64, 48))


def _main_file(root: Path, name: str) -> Path:
    return root / "ImageSets" / "Main" / f"{name}.txt"


def _paths(index, ids) -> list[str]:
    return [index.relative_image_path(int(i)) for i in ids]


def _of(index, kind: str) -> list:
    return [p for p in index.problems if p.kind == kind]


def test_no_splits_says_how_to_make_them_then_make_splits_writes_imagesets(tmp_path):
    root = _synth(tmp_path / "voc")
    shutil.rmtree(root / "ImageSets")
    index = read_annotations(root)
    assert index.splits == {} and index.meta["split_sources"] == {}
    with pytest.raises(KeyError) as err:
        index.split("train")
    text = str(err.value)
    assert text.startswith("split='train' not found") and "has no splits" in text
    assert f"detloader split {root} --val 0.2" in text and "detloader.make_splits(index, val=0.2)" in text
    made = make_splits(index, val=0.25, seed=1)
    assert sorted(made.splits) == ["train", "val"] and 4 <= len(made.split("val")) <= 6  # rounded per class
    assert sorted(np.concatenate(list(made.splits.values())).tolist()) == list(range(20))
    assert made.meta["split_sources"] == {"train": "ImageSets/Main/train.txt", "val": "ImageSets/Main/val.txt"}
    assert not (root / "splits.json").exists() and not _main_file(root, "test").exists()
    again = read_annotations(root)  # the cache is rebuilt: the split files joined its key
    assert {k: v.tolist() for k, v in again.splits.items()} == {k: v.tolist() for k, v in made.splits.items()}
    assert again.meta["split_sources"] == made.meta["split_sources"]
    assert read_annotations(root).source_file is not None  # warm, same splits
    assert make_splits(index, val=0.25, seed=1).splits["val"].tolist() == made.splits["val"].tolist()
    with pytest.raises(SplitsExistError, match=r"splits already: train \(ImageSets/Main/train.txt\).*force=True"):
        make_splits(again, val=0.2)
    _main_file(root, "test.txt").with_name("testing.txt").write_text("00\n")  # not written again: removed
    forced = make_splits(read_annotations(root), val=0.2, test=0.1, force=True)
    assert sorted(forced.splits) == ["test", "train", "val"] and _main_file(root, "test").is_file()
    assert not _main_file(root, "testing").exists()
    test = _main_file(root, "test").read_text()
    kept = make_splits(read_annotations(root), val=0.25, force=True)  # the test split stays as it is
    assert sorted(kept.splits) == ["test", "train", "val"] and _main_file(root, "test").read_text() == test
    assert kept.splits["test"].tolist() == forced.splits["test"].tolist()
    pool = 20 - len(kept.split("test"))  # val is a fraction of the images outside test
    assert len(kept.split("val")) + len(kept.split("train")) == pool and abs(len(kept.split("val")) - pool / 4) <= 1


def test_cli_split_prints_sizes_classes_and_files_and_refuses_twice(tmp_path, capsys):
    root = _synth(tmp_path / "voc")
    shutil.rmtree(root / "ImageSets")
    assert main(["convert", str(root), "--to", "coco", str(tmp_path / "out"), "--split", "train"]) == 2
    err = capsys.readouterr().err
    assert "error: split='train' not found" in err and "detloader split" in err and '"' not in err
    assert main(["split", str(root), "--val", "0.2", "--test", "0.1", "--seed", "3"]) == 0
    out = capsys.readouterr().out
    assert "ImageSets/Main/test.txt" in out and "face" in out and "images" in out
    assert sorted(read_annotations(root).splits) == ["test", "train", "val"]
    assert main(["split", str(root)]) == 2
    assert "--force" in capsys.readouterr().err
    assert main(["split", str(root), "--force", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert sorted(data) == ["moved", "test", "train", "val"]  # test kept as it was
    assert data["val"]["images"] + data["train"]["images"] + data["test"]["images"] == 20
    assert set(data["moved"]) <= {"train -> val", "val -> train"} and data["moved"]
    assert data["val"]["written"] == "ImageSets/Main/val.txt" and set(data["val"]["objects"]) == {"face", "masked"}


def test_damaged_split_file_keeps_its_valid_lines_and_names_each_bad_one(tmp_path):
    files = {f"{i:02d}": voc_xml(f"{i:02d}.jpg", [voc_object("a", (1, 1, 5, 5))]) for i in range(6)}
    root = voc_dataset(tmp_path / "voc", files, splits={"train": ["00", "01", "02"]})
    _main_file(root, "val").write_text("03\n04 05\n\n05\n99\n03\n")
    _main_file(root, "a_train").write_text("00  1\n01 -1\n02 0\n")  # per-class: ignored
    index = read_annotations(root)
    assert sorted(index.splits) == ["train", "val"]
    assert _paths(index, index.splits["val"]) == [os.path.join("JPEGImages", f"{i}.jpg") for i in ("03", "05")]
    val = os.path.join("ImageSets", "Main", "val.txt")
    (bad,) = _of(index, "split_bad_line")
    assert (bad.file, bad.element, bad.severity) == (val, "line 2", "repaired") and "'04 05'" in bad.message
    (missing,) = _of(index, "split_mismatch")
    assert (missing.file, missing.element) == (val, "line 5") and "'99'" in missing.message
    (repeat,) = _of(index, "split_duplicate")
    assert repeat.element == "line 6" and "first at line 1" in repeat.message
    assert str(bad) == f"{val}: line 2: '04 05' is not one image id (line skipped)"


def test_image_in_train_and_val_is_a_named_overlap_trainval_is_not(tmp_path):
    files = {f"{i}": voc_xml(f"{i}.jpg") for i in range(4)}
    splits = {"train": ["0", "1", "2"], "val": ["2", "3"], "trainval": ["0", "1", "2", "3"]}
    index = read_annotations(voc_dataset(tmp_path / "voc", files, splits=splits))
    (overlap,) = _of(index, "split_overlap")
    val, train = (os.path.join("ImageSets", "Main", f"{n}.txt") for n in ("val", "train"))
    assert overlap.file == val and overlap.severity == "repaired"
    assert overlap.message == f"1 of 2 images of val ({val}) are also in train ({train}), as 'JPEGImages/2.jpg'"
    assert overlap.action == "kept in train, removed from val"
    assert index.splits["val"].tolist() == [3] and index.splits["train"].tolist() == [0, 1, 2]
    assert index.splits["trainval"].tolist() == [0, 1, 2, 3]  # no role: not compared
    assert index.meta["split_sources"]["val"] == f"{val}; 1 images also in train removed"
    assert [split_role(n) for n in ("Train", "valid", "validation", "val2017", "testing", "trainval")] == [
        "train", "val", "val", "val", "test", None]


def test_overlapping_splits_keep_an_image_in_test_then_train_then_val(tmp_path):
    files = {f"{i}": voc_xml(f"{i}.jpg") for i in range(6)}
    splits = {"train": ["0", "1", "2", "3"], "val": ["3", "4", "5"], "test": ["2", "3", "5"]}
    index = read_annotations(voc_dataset(tmp_path / "voc", files, splits=splits))
    assert {k: v.tolist() for k, v in index.splits.items()} == {"test": [2, 3, 5], "train": [0, 1], "val": [4]}
    found = {(p.action, p.message.split(" images of ")[0]) for p in _of(index, "split_overlap")}
    assert found == {
        ("kept in test, removed from train", "2 of 4"),  # never trained on
        ("kept in test, removed from val", "2 of 3"),
        # 3 is in all three: once out of train, train and val share nothing more
    }
    ids = np.concatenate(list(index.splits.values()))
    assert len(ids) == len(np.unique(ids))
    again = read_annotations(index.root)  # the cache keeps the settled splits and their problems
    assert {k: v.tolist() for k, v in again.splits.items()} == {k: v.tolist() for k, v in index.splits.items()}
    assert len(_of(again, "split_overlap")) == 2


def test_folder_holding_a_vocdevkit_is_read_as_its_year(tmp_path):
    year = tmp_path / "download" / "VOCdevkit" / "VOC2012"
    voc_dataset(year, {"a": voc_xml("a.jpg"), "b": voc_xml("b.jpg")}, splits={"train": ["a"], "val": ["b"]})
    index = read_annotations(tmp_path / "download")
    assert index.root == year.resolve()
    assert {k: v.tolist() for k, v in index.splits.items()} == {"train": [0], "val": [1]}
    assert index.meta["split_sources"]["val"] == os.path.join("ImageSets", "Main", "val.txt")


def _coco_file(path: Path, names: list[str]) -> None:
    data = {
        "images": [{"id": i, "file_name": n, "width": 64, "height": 48} for i, n in enumerate(names)],
        "annotations": [{"id": i, "image_id": i, "category_id": 1, "bbox": [1, 1, 10, 10]} for i in range(len(names))],
        "categories": [{"id": 1, "name": "cell"}],
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data))


def test_coco_files_per_split_are_one_dataset(tmp_path):
    for split, names in (("train2017", ["a.jpg", "b.jpg"]), ("val2017", ["c.jpg"])):
        _coco_file(tmp_path / "annotations" / f"instances_{split}.json", names)
        for name in names:
            write_image(tmp_path / "images" / split / name)
    index = read_annotations(tmp_path)
    assert len(index) == 3 and index.meta["format"] == "coco"
    assert {k: v.tolist() for k, v in index.splits.items()} == {"train": [0, 1], "val": [2]}
    assert index.relative_image_path(2) == os.path.join("images", "val2017", "c.jpg")
    assert index.meta["split_sources"] == {
        "train": os.path.join("annotations", "instances_train2017.json"),
        "val": os.path.join("annotations", "instances_val2017.json"),
    }
    _coco_file(tmp_path / "annotations" / "captions_val2017.json", ["c.jpg"])  # not a split name: refused
    with pytest.raises(ValueError, match="holds 3 COCO files .*; pass one of them"):
        read_annotations(tmp_path)


def test_coco_files_named_for_their_split_are_one_dataset(tmp_path, capsys):
    root = tmp_path / "custom"
    for split, names in (("train", ["a.jpg", "b.jpg"]), ("val", ["c.jpg"])):
        _coco_file(root / f"custom_{split}.json", names)
        for name in names:
            write_image(root / f"{split}2017" / name)
    index = read_annotations(root)
    assert {k: v.tolist() for k, v in index.splits.items()} == {"train": [0, 1], "val": [2]}
    assert index.relative_image_path(2) == os.path.join("val2017", "c.jpg") and not index.problems
    assert index.meta["split_sources"] == {"train": "custom_train.json", "val": "custom_val.json"}
    assert main(["index", str(root)]) == 0
    assert "splits: train 2 (custom_train.json), val 1 (custom_val.json)" in capsys.readouterr().out
    _coco_file(root / "other_test.json", ["a.jpg"])  # more than a split word differs: refused
    with pytest.raises(ValueError, match=r"holds 3 COCO files \(custom_train.json, custom_val.json, other_test.json\)"):
        read_annotations(root)
    (root / "other_test.json").rename(root / "custom_test_val.json")  # two split words: refused
    with pytest.raises(ValueError, match="holds 3 COCO files"):
        read_annotations(root)
    (root / "custom_test_val.json").rename(root / "custom-test.json")  # custom_{} and custom-{}
    with pytest.raises(ValueError, match="differ only by a split word"):
        read_annotations(root)


def test_train_valid_test_folders_are_splits_for_every_format(tmp_path):
    voc = tmp_path / "roboflow_voc"
    for folder, stem in (("train", "a"), ("train", "b"), ("valid", "c"), ("test", "d"), ("extra", "e")):
        write_image(voc / folder / f"{stem}.jpg")
        (voc / folder / f"{stem}.xml").write_text(voc_xml(f"{stem}.jpg", [voc_object("x", (1, 1, 5, 5))]))
    index = read_annotations(voc)
    assert {k: v.tolist() for k, v in index.splits.items()} == {"test": [1], "train": [2, 3], "val": [4]}
    assert index.meta["split_sources"] == {"test": "folder test/", "train": "folder train/", "val": "folder valid/"}
    (outside,) = _of(index, "split_unassigned")
    assert outside.file == os.path.join("extra", "e.xml") and outside.message.startswith("1 images lie outside")
    coco = tmp_path / "roboflow_coco"
    for folder, names in (("train", ["a.jpg", "b.jpg"]), ("valid", ["c.jpg"]), ("test", ["d.jpg"])):
        _coco_file(coco / folder / "_annotations.coco.json", names)
        for name in names:
            write_image(coco / folder / name)
    index = read_annotations(coco)
    assert len(index) == 4 and index.root == coco.resolve() and not index.problems
    assert {k: len(v) for k, v in index.splits.items()} == {"test": 1, "train": 2, "val": 1}
    assert index.meta["split_sources"]["val"] == os.path.join("valid", "_annotations.coco.json")
    yolo = tmp_path / "yolo"
    for split in ("train2017", "val2017"):
        write_image(yolo / "images" / split / f"{split}.jpg")
        (yolo / "labels" / split).mkdir(parents=True)
        (yolo / "labels" / split / f"{split}.txt").write_text("0 0.5 0.5 0.2 0.2\n")
    index = read_annotations(yolo)
    assert index.meta["split_sources"] == {"train": "folder images/train2017/", "val": "folder images/val2017/"}


def test_splits_json_is_made_for_other_layouts_and_read_by_every_later_read(tmp_path):
    root = tmp_path / "coco"
    names = [f"{i}.jpg" for i in range(10)]
    _coco_file(root / "annotations" / "export.json", names)
    for name in names:
        write_image(root / "images" / name)
    index = read_annotations(root)
    assert index.splits == {}
    made = make_splits(index, val=0.2, test=0.1, seed=0)
    data = json.loads((root / "splits.json").read_text())
    by = f"detloader {detloader.__version__}"
    assert data["made"] == {"by": by, "seed": 0, "val": 0.2, "test": 0.1, "stratified_by": "class"}
    assert sorted(data["splits"]) == ["test", "train", "val"] and "images/0.jpg" in sum(data["splits"].values(), [])
    source = f"splits.json (made by {by}, seed 0, val 0.2, test 0.1, stratified by class)"
    assert made.meta["split_sources"] == dict.fromkeys(["train", "val", "test"], source)
    for again in (read_annotations(root), read_annotations(root), read_annotations(root, cache=False)):
        assert {k: v.tolist() for k, v in again.splits.items()} == {k: v.tolist() for k, v in made.splits.items()}
        assert again.meta["split_sources"]["val"] == source
    moved = data["splits"]["train"][0]
    data["splits"]["val"] += [moved, "images/nope.jpg"]  # hand-edited: the cache follows
    (root / "splits.json").write_text(json.dumps(data))
    edited = read_annotations(root)
    assert edited.meta["split_sources"]["val"] == f"{source}; 1 images also in train removed"
    assert [p.element for p in _of(edited, "split_mismatch")] == [f"splits/val[{len(data['splits']['val']) - 1}]"]
    (overlap,) = _of(edited, "split_overlap")
    assert overlap.file == "splits.json" and moved in overlap.message and "also in train" in overlap.message
    assert overlap.action == "kept in train, removed from val" and moved not in _paths(edited, edited.splits["val"])
    (root / "splits.json").write_text('{"splits": ["x"]}')
    with pytest.raises(detloader.AnnotationError, match=r"splits.json: splits: \[\"x\"\] is not"):
        read_annotations(root)


def test_make_splits_puts_a_rare_class_in_every_split(tmp_path):
    files = {f"{i:02d}": voc_xml(f"{i:02d}.jpg", [voc_object("common", (1, 1, 5, 5))]) for i in range(17)}
    files.update({f"r{i}": voc_xml(f"r{i}.jpg", [voc_object("rare", (1, 1, 5, 5))]) for i in range(3)})
    index = read_annotations(voc_dataset(tmp_path / "voc", files))
    made = make_splits(index, val=0.2, test=0.1)
    for name in ("train", "val", "test"):
        assert made.split(name).class_counts()["rare"] == 1, name
    assert [len(made.split(name)) for name in ("train", "val", "test")] == [13, 4, 3]  # common: 12 3 2


@settings(max_examples=200, deadline=None)
@given(
    groups=st.lists(st.integers(0, 4), min_size=1, max_size=60),
    fractions=st.lists(st.sampled_from([0.0, 0.05, 0.1, 0.2, 0.5, 0.7]), min_size=1, max_size=4).filter(sum),
    seed=st.integers(0, 5),
)
def test_stratified_split_reaches_every_part_from_every_large_enough_group(groups, fractions, seed):
    groups = np.asarray(groups)
    named = {f"p{k}": f for k, f in enumerate(fractions)}
    parts = stratified_split(groups, named, np.random.default_rng(seed))
    assert sorted(np.concatenate(list(parts.values())).tolist()) == list(range(len(groups)))
    positive = [k for k, f in named.items() if f > 0]
    for g in np.unique(groups):
        if (groups == g).sum() >= len(positive):
            assert all((groups[parts[k]] == g).any() for k in positive), (g, parts)
    again = stratified_split(groups, named, np.random.default_rng(seed))
    assert all(np.array_equal(parts[k], again[k]) for k in named)


@pytest.mark.parametrize(
    ("images", "annotations", "may"),
    [
        (["JPEGImages/0001.jpg"], ["Annotations/0001.xml"], False),
        (["images/TRAIN/0001.jpg"], ["a.xml"], True),
        (["0001.jpg"], ["Valid/0001.xml"], True),
        (["te\u017ft/0001.jpg"], ["a.xml"], True),  # 'ſ' matches 's' under re.IGNORECASE: looked at
        ([], [], False),
    ],
)
def test_the_split_folder_shortcut_skips_only_paths_that_cannot_name_a_split(images, annotations, may):
    from detloader.annotations.fields import pack_strings
    from detloader.annotations.splits import _may_name_split_folders, split_role

    arrays = {}
    for name, paths in (("image_paths", images), ("annotation_paths", annotations)):
        arrays[f"{name}_blob"], arrays[f"{name}_offsets"] = pack_strings(paths)
    index = type("Paths", (), {"arrays": lambda self: arrays})()
    assert _may_name_split_folders(index) is may
    assert may or not any(split_role(part) for p in images + annotations for part in p.split("/"))
