"""Objects with landmarks and no box: boxed by their points, by the image, or skipped
(``read_annotations(boxes_from_points=)``), the same way for every reader."""

from __future__ import annotations

import json

import numpy as np
import pytest
from helpers import keypoints_xml, voc_dataset, voc_xml, write_image
from hypothesis import given
from hypothesis import strategies as st

from detloader import AnnotationError, read_annotations
from detloader.annotations.checks import POINTS_BOX_MIN_SIDE, box_from_points
from detloader.annotations.problems import KINDS


def _points_object(name: str, points: list[tuple[str, float, float, int]]) -> str:
    return f"<object><name>{name}</name>{keypoints_xml(points)}</object>"


FACE = [("left_eye", 10, 12, 2), ("right_eye", 30, 14, 2), ("nose", 20, 25, 1), ("chin", 0, 0, 0)]


def test_enclosing_box_of_the_labelled_points():
    pts = [(10.0, 12.0), (30.0, 14.0), (20.0, 25.0)]
    assert box_from_points(pts, 64, 48, "enclose") == (10, 12, 30, 25)
    assert box_from_points(pts, 64, 48, "image") == (0, 0, 64, 48)
    assert box_from_points([], 64, 48, "enclose") is None
    assert box_from_points([], 64, 48, "image") == (0, 0, 64, 48)
    # one point: a minimum-size box centred on it; on the image's edge it stays inside
    assert box_from_points([(5.0, 5.0)], 64, 48, "enclose") == (4.5, 4.5, 5.5, 5.5)
    assert box_from_points([(0.0, 48.0)], 64, 48, "enclose") == (0.0, 47.0, 1.0, 48.0)
    # points on a vertical line: only the width is widened
    assert box_from_points([(7.0, 1.0), (7.0, 9.0)], 64, 48, "enclose") == (6.5, 1.0, 7.5, 9.0)
    with pytest.raises(ValueError, match="boxes_from_points='skip' is not one of"):
        box_from_points(pts, 64, 48, "skip")


@given(
    st.integers(1, 4000),
    st.integers(1, 4000),
    st.lists(st.tuples(st.floats(0, 1), st.floats(0, 1)), min_size=1, max_size=20),
)
def test_box_from_points_encloses_them_inside_the_image(w, h, unit):
    pts = [(x * w, y * h) for x, y in unit]
    x1, y1, x2, y2 = box_from_points(pts, w, h, "enclose")
    assert 0 <= x1 and 0 <= y1 and x2 <= w and y2 <= h
    assert all(x1 <= x <= x2 and y1 <= y <= y2 for x, y in pts)
    assert x2 - x1 >= min(POINTS_BOX_MIN_SIDE, w) - 1e-9 and y2 - y1 >= min(POINTS_BOX_MIN_SIDE, h) - 1e-9


def test_voc_keypoints_without_bndbox_are_kept(tmp_path):
    files = {
        "a": voc_xml("a.jpg", [_points_object("face", FACE), _points_object("face", [("nose", 40, 40, 2)])]),
        "b": voc_xml("b.jpg", [_points_object("face", FACE)]),
    }
    root = voc_dataset(tmp_path, files)
    index = read_annotations(root)
    assert index.num_objects == 3 and index.classes == ("face",)
    # the hidden nose counts (it has a position), the absent chin does not
    np.testing.assert_array_equal(index.boxes, [[10, 12, 30, 25], [39.5, 39.5, 40.5, 40.5], [10, 12, 30, 25]])
    nose = index.landmark_schema.names.index("nose")
    np.testing.assert_array_equal(index.landmarks[0, nose], [20, 25])
    assert index.visibility[0, nose] == 1
    # once per file, repaired: never fails a read
    assert [(p.file, p.kind, p.severity, p.message) for p in index.problems] == [
        ("Annotations/a.xml", "box_from_points", "repaired", "2 objects with landmarks and no box (first: object[1])"),
        ("Annotations/b.xml", "box_from_points", "repaired", "1 objects with landmarks and no box (first: object[1])"),
    ]
    assert "box_from_points" in KINDS
    assert index.meta["stats"]["boxes_from_points"] == 3

    whole = read_annotations(root, boxes_from_points="image")
    np.testing.assert_array_equal(whole.boxes, [[0, 0, 64, 48]] * 3)
    skipped = read_annotations(root, boxes_from_points="skip")
    assert skipped.num_objects == 0 and skipped.meta["stats"]["points_without_box_skipped"] == 3
    assert [p.action for p in skipped.problems] == ["skipped, boxes_from_points='skip'"] * 2
    assert not skipped.problems.errors

    with pytest.raises(ValueError, match="boxes_from_points='points' is not one of enclose, image, skip"):
        read_annotations(root, boxes_from_points="points")


def test_cli_boxes_from_points(tmp_path, capsys):
    from detloader.cli import main

    root = voc_dataset(tmp_path, {"a": voc_xml("a.jpg", [_points_object("face", FACE)])})
    assert main(["index", str(root), "--json", "--no-cache"]) == 0
    assert json.loads(capsys.readouterr().out)["objects"] == 1
    assert main(["index", str(root), "--json", "--no-cache", "--boxes-from-points", "skip"]) == 0
    assert json.loads(capsys.readouterr().out)["objects"] == 0


def test_voc_one_based_points_make_a_zero_based_box(tmp_path):
    root = voc_dataset(tmp_path, {"a": voc_xml("a.jpg", [_points_object("face", FACE[:3])])})
    index = read_annotations(root, one_based=True)
    np.testing.assert_array_equal(index.boxes, [[9, 11, 29, 24]])  # the points moved, once


def test_object_without_box_or_labelled_point(tmp_path):
    absent = _points_object("face", [("nose", -1, -1, 0)])
    bare = "<object><name>face</name></object>"
    root = voc_dataset(tmp_path, {"a": voc_xml("a.jpg", [absent, bare])})
    index = read_annotations(root, on_error="skip")
    assert index.num_objects == 0
    assert [str(p) for p in index.problems] == [
        "Annotations/a.xml: object[1]: no box and no labelled point to make one from (object skipped)",
        "Annotations/a.xml: object[2]: <bndbox> is missing (object skipped)",
    ]
    with pytest.raises(AnnotationError, match="no labelled point"):
        read_annotations(root)
    assert read_annotations(root, boxes_from_points="image", on_error="skip").num_objects == 1


def test_coco_keypoints_without_bbox(tmp_path):
    data = {
        "images": [{"id": 1, "file_name": "a.jpg", "width": 64, "height": 48}],
        "annotations": [
            {"id": 1, "image_id": 1, "category_id": 1, "keypoints": [10, 12, 2, 30, 14, 2, 0, 0, 0]},
            {"id": 2, "image_id": 1, "category_id": 1, "bbox": [], "keypoints": [5, 6, 2, 9, 7, 1, 0, 0, 0]},
            {"id": 3, "image_id": 1, "category_id": 1, "bbox": [1, 1, 4, 4]},
        ],
        "categories": [{"id": 1, "name": "face", "keypoints": ["a", "b", "c"]}],
    }
    write_image(tmp_path / "a.jpg")
    (tmp_path / "x.json").write_text(json.dumps(data))
    index = read_annotations(tmp_path / "x.json")
    np.testing.assert_array_equal(index.boxes, [[10, 12, 30, 14], [5, 6, 9, 7], [1, 1, 5, 5]])
    (problem,) = index.problems
    assert str(problem) == (
        "x.json: 2 objects with landmarks and no box (first: annotations[0]) "
        "(boxed by the extent of their points, boxes_from_points='enclose')"
    )
    del data["annotations"][2]["bbox"]  # no box and no keypoints: still an error
    (tmp_path / "x.json").write_text(json.dumps(data))
    with pytest.raises(AnnotationError, match=r"annotations\[2\]/bbox: bbox is missing"):
        read_annotations(tmp_path / "x.json")


def test_imglab_parts_without_a_rectangle(tmp_path):
    write_image(tmp_path / "a.jpg")
    (tmp_path / "d.xml").write_text(
        "<dataset><images><image file='a.jpg' width='64' height='48'>"
        "<box><label>face</label><part name='00' x='3' y='4'/><part name='01' x='13' y='24'/></box>"
        "<box top='1' left='2' width='3' height='4'/>"
        "</image></images></dataset>"
    )
    index = read_annotations(tmp_path / "d.xml")
    np.testing.assert_array_equal(index.boxes, [[3, 4, 13, 24], [2, 1, 5, 5]])
    assert index.classes == ("face", "object")
    assert index.problems.counts() == {"box_from_points": 1}
