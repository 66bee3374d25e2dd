"""Text lists: ``path label`` classification lists, RetinaFace label.txt, WIDER FACE bbx_gt."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from helpers import write_image

from detloader import FACE5, MISSING, AnnotationError, detect_format, read_annotations
from detloader.annotations.readers.txt import detect_kind
from detloader.cli import main


def _images(root: Path, *names: str, size=(64, 48)) -> None:
    for name in names:
        write_image(root / name, size)


def test_classification_list_with_spaces_and_comments(tmp_path):
    _images(tmp_path, "cats/a 1.jpg", "dogs/b.png")
    (tmp_path / "list.txt").write_text("# path label\ncats/a 1.jpg cat\n\ndogs/b.png\tdog\n")
    assert detect_kind(tmp_path / "list.txt") == "list"
    assert detect_format(tmp_path / "list.txt") == "txt"
    index = read_annotations(tmp_path / "list.txt")
    assert len(index) == 2 and index.num_objects == 0
    assert index.image_classes == ("cat", "dog")
    assert [index.image(i).image_class for i in range(2)] == ["cat", "dog"]
    assert index.image(0).size == (64, 48)
    assert index.annotation_path(0) == "list.txt#cats/a 1.jpg"


def test_integer_labels_use_a_names_file(tmp_path):
    _images(tmp_path / "images", "a.jpg", "b.jpg")
    (tmp_path / "train.txt").write_text("a.jpg 1\nb.jpg 0\n")
    (tmp_path / "classes.txt").write_text("cat\ndog\n")
    index = read_annotations(tmp_path / "train.txt")
    assert [index.image(i).image_class for i in range(2)] == ["dog", "cat"]
    assert index.image_path(0) == tmp_path / "images" / "a.jpg"
    explicit = read_annotations(tmp_path / "train.txt", names=["x", "y"])
    assert explicit.image(0).image_class == "y"


def test_folder_of_split_lists_gives_splits(tmp_path):
    _images(tmp_path, "a.jpg", "b.jpg", "c.jpg")
    (tmp_path / "train.txt").write_text("a.jpg cat\nb.jpg dog\n")
    (tmp_path / "val.txt").write_text("c.jpg cat\n")
    assert detect_format(tmp_path) == "txt"
    index = read_annotations(tmp_path)
    assert len(index) == 3
    assert {k: v.tolist() for k, v in index.splits.items()} == {"train": [0, 1], "val": [2]}


def test_list_problems_name_line(tmp_path):
    _images(tmp_path, "a.jpg")
    (tmp_path / "classes.txt").write_text("cat\n")
    (tmp_path / "l.txt").write_text("a.jpg 0\nlonely\ngone.jpg 0\na.jpg 3\n")
    index = read_annotations(tmp_path / "l.txt", format="txt", kind="list", on_error="skip")
    assert [str(p) for p in index.problems] == [
        "l.txt: line 2: 'lonely' is not 'path label' (image skipped)",
        "l.txt: line 3: 'gone.jpg' not found in . (image skipped)",
        "l.txt: line 4: label=3 is not in names (0..0) (image skipped)",
    ]
    with pytest.raises(ValueError, match="kind='csv' is not one of list, retinaface, wider"):
        read_annotations(tmp_path / "l.txt", format="txt", kind="csv")


RETINA = """# 0--Parade/a.jpg
10 12 20 24 14.5 18.0 0.0 24.0 18.5 0.0 19.0 23.0 1.0 15.0 28.0 0.0 25.0 28.5 0.0 0.82
30 5 10 10 -1.0 -1.0 -1.0 -1.0 -1.0 -1.0 -1.0 -1.0 -1.0 -1.0 -1.0 -1.0 -1.0 -1.0 -1.0 -1.0
# 0--Parade/b.jpg
1 1 5 5
# 0--Parade/gone.jpg
1 1 5 5
# 0--Parade/b.jpg
"""


def test_retinaface_label_txt(tmp_path):
    _images(tmp_path / "images", "0--Parade/a.jpg", "0--Parade/b.jpg")
    (tmp_path / "label.txt").write_text(RETINA)
    assert detect_format(tmp_path) == "txt" and detect_kind(tmp_path / "label.txt") == "retinaface"
    index = read_annotations(tmp_path, on_error="skip")
    assert len(index) == 2 and index.num_objects == 3 and index.classes == ("face",)
    assert index.landmark_schema == FACE5
    a = index.image(0)
    np.testing.assert_array_equal(a.boxes, [[10, 12, 30, 36], [30, 5, 40, 15]])
    np.testing.assert_array_equal(a.landmarks[0], [[14.5, 18], [24, 18.5], [19, 23], [15, 28], [25, 28.5]])
    assert a.visibility.tolist() == [[2, 2, 1, 2, 2], [0, 0, 0, 0, 0]]
    kinds = index.problems.counts()
    assert kinds == {"missing_image": 1, "duplicate_image": 1}
    assert index.image_path(1) == tmp_path / "images" / "0--Parade" / "b.jpg"


def test_retinaface_bad_face_line(tmp_path):
    _images(tmp_path / "images", "a.jpg")
    (tmp_path / "label.txt").write_text("# a.jpg\n1 2 3\n1 x 3 4\n")
    with pytest.raises(AnnotationError, match=r"label.txt: line 2: 3 values: expected x y w h"):
        read_annotations(tmp_path / "label.txt")
    index = read_annotations(tmp_path / "label.txt", on_error="skip")
    assert [p.element for p in index.problems] == ["line 2", "line 3"]


WIDER = """0--Parade/a.jpg
2
10 12 20 24 0 0 0 0 0 0
30 5 10 10 2 1 1 1 2 1
0--Parade/b.jpg
0
0 0 0 0 0 0 0 0 0 0
0--Parade/a.jpg
1
1 1 4 4 0 0 0 0 1 0
"""


def test_wider_face_bbx_gt(tmp_path):
    _images(tmp_path / "images", "0--Parade/a.jpg", "0--Parade/b.jpg")
    (tmp_path / "wider_face_train_bbx_gt.txt").write_text(WIDER)
    path = tmp_path / "wider_face_train_bbx_gt.txt"
    assert detect_kind(path) == "wider"
    index = read_annotations(path, on_error="skip")
    assert len(index) == 2 and index.objects_per_image.tolist() == [2, 0]
    a = index.image(0)
    np.testing.assert_array_equal(a.boxes, [[10, 12, 30, 36], [30, 5, 40, 15]])
    assert a.difficult.tolist() == [False, True] and a.occluded.tolist() == [False, True]
    assert a.object_attributes[1] == {
        "blur": "heavy",
        "expression": "exaggerate",
        "illumination": "extreme",
        "invalid": "true",
        "occlusion": "heavy",
        "pose": "atypical",
    }
    assert index.problems.counts() == {"duplicate_image": 1}
    assert index.image_labels.tolist() == [MISSING, MISSING]


def test_wider_broken_count(tmp_path):
    _images(tmp_path, "a.jpg")
    (tmp_path / "gt.txt").write_text("a.jpg\n1\n1 1 4 4 0 0 0 0 0 0\nb.jpg\nmany\n")
    index = read_annotations(tmp_path / "gt.txt", format="txt", on_error="skip")
    assert len(index) == 1
    assert [str(p) for p in index.problems] == [
        "gt.txt: line 5: face count 'many' is not an integer (rest of the file skipped)"
    ]


def test_cli_index_json(tmp_path, capsys):
    _images(tmp_path, "a.jpg")
    (tmp_path / "train.txt").write_text("a.jpg cat\n")
    assert main(["index", str(tmp_path / "train.txt"), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["format"] == "txt" and data["images"] == 1 and data["image_classes"] == {"cat": 1}
