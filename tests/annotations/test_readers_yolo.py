"""YOLO reader: data.yaml, detection, pose (kpt_shape, flip_idx, kpt_names), layouts, lines."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import yaml
from helpers import write_image

from detloader import AnnotationError, detect_format, read_annotations
from detloader.annotations.readers.yolo import YoloConfigError, label_path
from detloader.cli import main


def _ultralytics(tmp_path: Path, labels: dict[str, str], config: dict, size=(100, 50)) -> Path:
    """images/<split>/<name>.jpg + labels/<split>/<name>.txt + data.yaml."""
    for rel, text in labels.items():
        write_image(tmp_path / "images" / f"{rel}.jpg", size)
        if text is not None:
            lbl = tmp_path / "labels" / f"{rel}.txt"
            lbl.parent.mkdir(parents=True, exist_ok=True)
            lbl.write_text(text)
    path = tmp_path / "data.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def test_detection_with_data_yaml_and_splits(tmp_path):
    labels = {
        "train/a": "0 0.5 0.5 0.2 0.4\n1 0.1 0.2 0.2 0.2\n",
        "train/b": "",
        "val/c": "1 0.25 0.5 0.5 1.0\n",
        "val/d": None,  # no label file: a background image
    }
    path = _ultralytics(tmp_path, labels, {"train": "images/train", "val": "images/val", "names": {0: "cat", 1: "dog"}})
    assert detect_format(path) == "yolo" and detect_format(tmp_path) == "yolo"
    index = read_annotations(tmp_path)
    assert len(index) == 4 and index.num_objects == 3
    assert index.classes == ("cat", "dog")
    np.testing.assert_allclose(index.image(0).boxes, [[40, 15, 60, 35], [0, 5, 20, 15]])
    assert index.image(0).class_names == ["cat", "dog"]
    np.testing.assert_allclose(index.image(2).boxes, [[0, 0, 50, 50]])
    assert {k: v.tolist() for k, v in index.splits.items()} == {"train": [0, 1], "val": [2, 3]}
    assert index.annotation_path(0) == "labels/train/a.txt"
    assert not index.problems.errors and index.problems.counts() == {
        "unannotated_image": 1
    }  # a background image, named


def test_label_path_rule():
    assert label_path("/d", "images/train/a.jpg") == "labels/train/a.txt"
    assert label_path("/d", "x/a.b.png") == "x/a.b.txt"
    assert label_path("/d", "images/x/images/a.jpg") == "images/x/labels/a.txt"  # the last /images/


def test_pose_kpt_shape_flip_idx_kpt_names(tmp_path):
    line = "0 0.5 0.5 0.8 0.8 0.3 0.4 2 0.7 0.4 1 0.0 0.0 0\n"
    config = {
        "train": "images/train",
        "names": ["face"],
        "kpt_shape": [3, 3],
        "flip_idx": [1, 0, 2],
        "kpt_names": {0: ["left_eye", "right_eye", "nose"]},
    }
    index = read_annotations(_ultralytics(tmp_path, {"train/a": line}, config))
    schema = index.landmark_schema
    assert schema.names == ("left_eye", "right_eye", "nose") and schema.flip_pairs == ((0, 1),)
    np.testing.assert_allclose(index.landmarks[0], [[30, 20], [70, 20], [0, 0]])
    assert index.visibility[0].tolist() == [2, 1, 0]
    config.pop("kpt_names")
    config["flip_idx"] = [2, 1, 0]
    (tmp_path / "data.yaml").write_text(yaml.safe_dump(config))
    schema = read_annotations(tmp_path).landmark_schema
    assert schema.names == ("p0", "p1", "p2") and schema.flip_pairs == ((0, 2),)


def test_pose_two_dims_zero_is_absent(tmp_path):
    config = {"train": "images/train", "names": ["h"], "kpt_shape": [2, 2]}
    index = read_annotations(_ultralytics(tmp_path, {"train/a": "0 0.5 0.5 1 1 0.1 0.2 0 0\n"}, config))
    assert index.visibility[0].tolist() == [2, 0]
    np.testing.assert_allclose(index.landmarks[0, 0], [10, 10])


@pytest.mark.parametrize(
    ("config", "message"),
    [
        ({"kpt_shape": [3, 4]}, r"kpt_shape=\[3, 4\] is not \[K, 2\] or \[K, 3\]"),
        ({"kpt_shape": [3, 3], "flip_idx": [1, 2, 0]}, r"flip_idx=\[1, 2, 0\] is not symmetric"),
        ({"kpt_shape": [3, 3], "flip_idx": [0, 1]}, r"flip_idx=\[0, 1\] is not a permutation of 0..2"),
        ({"names": "cat"}, r"names='cat' is neither a list nor a mapping"),
        ({"test": "nowhere"}, r"test: 'nowhere' is neither a folder nor a .txt list"),
    ],
)
def test_bad_data_yaml_is_an_error_naming_the_key(tmp_path, config, message):
    base = {"train": "images/train", "names": ["a"]}
    path = _ultralytics(tmp_path, {"train/a": ""}, {**base, **config})
    with pytest.raises(YoloConfigError, match=message):
        read_annotations(path)


def test_bad_lines_name_file_and_line(tmp_path):
    text = (
        "0 0.5 0.5 0.2 0.2\n"
        "7 0.5 0.5 0.2 0.2\n"
        "x 0.5 0.5 0.2 0.2\n"
        "0 0.5 abc 0.2 0.2\n"
        "0 0.5 0.5 0.2\n"
        "0 0.5 0.5 0 0.2\n"
        "1 0.1 0.1 0.3 0.1 0.2 0.4\n"
    )
    path = _ultralytics(tmp_path, {"train/a": text}, {"train": "images/train", "names": ["a", "b"]})
    index = read_annotations(path, on_error="skip")
    assert [str(p) for p in index.problems] == [
        "labels/train/a.txt: line 2: class=7 is not in names (0..1) (object skipped)",
        "labels/train/a.txt: line 3: class='x' is not a class id (object skipped)",
        "labels/train/a.txt: line 4: 'abc' is not a number (object skipped)",
        "labels/train/a.txt: line 5: 3 values after the class: not cx cy w h (object skipped)",
        "labels/train/a.txt: line 6: xmax=50 <= xmin=50 (object skipped)",
        "labels/train/a.txt: line 7: 6 values after the class and no kpt_shape: a segment of 3 points (1 line of "
        "this file) (boxed by the extent of its points; keypoints need kpt_shape in data.yaml)",
    ]
    assert index.num_objects == 2  # the good line and the segment (its extent)
    np.testing.assert_allclose(index.boxes[1], [10, 5, 30, 20])
    assert index.meta["stats"]["boxes_from_segments"] == 1
    with pytest.raises(AnnotationError, match="labels/train/a.txt: line 2: class=7"):
        read_annotations(path)


def test_edge_rounding_is_snapped_but_real_overflow_is_clipped(tmp_path):
    text = "0 0.1000004 0.5 0.200001 0.2\n0 0.95 0.5 0.2 0.2\n"  # x1 = -1e-7 (noise); x2 = 1.05
    path = _ultralytics(tmp_path, {"train/a": text}, {"train": "images/train", "names": ["a"]})
    index = read_annotations(path, on_error="skip")
    assert index.boxes[0, 0] == 0.0
    assert index.problems.counts() == {"box_clipped": 1}
    assert index.boxes[1, 2] == 100.0


def test_layout_without_yaml_names_file_and_labels_beside_images(tmp_path):
    write_image(tmp_path / "a.jpg", (100, 50))
    write_image(tmp_path / "b.png", (100, 50))
    (tmp_path / "a.txt").write_text("1 0.5 0.5 0.5 0.5\n")
    (tmp_path / "classes.txt").write_text("cat\ndog\n")
    assert detect_format(tmp_path) == "yolo"
    index = read_annotations(tmp_path)
    assert len(index) == 2 and index.num_objects == 1
    assert index.classes == ("cat", "dog") and index.labels.tolist() == [1]  # ids keep their names
    (tmp_path / "classes.txt").unlink()
    assert read_annotations(tmp_path, format="yolo").classes == ("1",)  # no names: the ids


def test_images_and_labels_folders_without_yaml(tmp_path):
    write_image(tmp_path / "images" / "a.jpg", (10, 10))
    (tmp_path / "labels").mkdir()
    (tmp_path / "labels" / "a.txt").write_text("0 0.5 0.5 1 1\n")
    (tmp_path / "labels" / "obj.names").write_text("thing\n")
    index = read_annotations(tmp_path)
    assert index.meta["format"] == "yolo" and index.classes == ("thing",)
    np.testing.assert_array_equal(index.boxes, [[0, 0, 10, 10]])


def test_split_list_files_and_unreadable_image(tmp_path):
    write_image(tmp_path / "images" / "a.jpg", (10, 10))
    (tmp_path / "images" / "bad.jpg").write_bytes(b"not an image")
    (tmp_path / "train.txt").write_text("./images/a.jpg\nimages/bad.jpg\n")
    (tmp_path / "data.yaml").write_text("train: train.txt\nnames: [a]\n")
    index = read_annotations(tmp_path, on_error="skip")
    assert len(index) == 1 and index.splits["train"].tolist() == [0]
    assert index.problems.counts() == {"missing_size": 1, "split_mismatch": 1}


def test_cache_rebuilds_when_a_label_changes(tmp_path):
    path = _ultralytics(tmp_path, {"train/a": "0 0.5 0.5 0.2 0.2\n"}, {"train": "images/train", "names": ["a"]})
    assert read_annotations(path).num_objects == 1
    (tmp_path / "labels" / "train" / "a.txt").write_text("0 0.5 0.5 0.2 0.2\n0 0.2 0.2 0.1 0.1\n")
    assert read_annotations(path).num_objects == 2


def test_cli_index_json(tmp_path, capsys):
    path = _ultralytics(
        tmp_path, {"train/a": "0 0.5 0.5 0.2 0.2\n"}, {"train": "images/train", "val": "images/train", "names": ["a"]}
    )
    assert main(["index", str(path), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["format"] == "yolo" and data["images"] == 1 and data["splits"] == {"train": 1, "val": 0}
    assert data["split_sources"]["val"] == "data.yaml: val; 1 images also in train removed"
