"""COCO JSON reader: instances and person_keypoints, categories, crowd, layouts, problems."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from helpers import write_image

from detloader import AnnotationError, detect_format, read_annotations
from detloader.annotations.landmarks import COCO17, COCO17_NAMES
from detloader.cli import main


def coco(images: list, annotations: list, categories: list) -> dict[str, Any]:
    return {"info": {}, "licenses": [], "images": images, "annotations": annotations, "categories": categories}


def img(i: int, name: str, w: int = 64, h: int = 48, **kw: Any) -> dict[str, Any]:
    return {"id": i, "file_name": name, "width": w, "height": h, **kw}


def ann(i: int, image: int, cat: int, bbox: list, **kw: Any) -> dict[str, Any]:
    return {"id": i, "image_id": image, "category_id": cat, "bbox": bbox, "iscrowd": 0, "area": 1, **kw}


def _write(path: Path, data: dict, images: tuple[str, ...] = (), image_dir: Path | None = None) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data))
    for name in images:
        write_image((image_dir or path.parent) / name)
    return path


def test_instances_bbox_categories_with_gaps_and_empty_images(tmp_path):
    data = coco(
        [img(10, "a.jpg"), img(11, "b.jpg"), img(12, "c.jpg")],
        [ann(1, 10, 0, [1, 2, 10, 20]), ann(2, 10, 7, [5.5, 6, 3.25, 4]), ann(3, 12, 7, [0, 0, 64, 48], iscrowd=1)],
        [{"id": 0, "name": "person"}, {"id": 7, "name": "bicycle"}],
    )
    path = _write(tmp_path / "instances_val.json", data, ("a.jpg", "b.jpg", "c.jpg"))
    assert detect_format(path) == "coco"
    index = read_annotations(path)
    assert len(index) == 3 and index.num_objects == 3
    assert index.classes == ("person", "bicycle")  # category id order, not name order
    a = index.image(0)
    np.testing.assert_array_equal(a.boxes, np.array([[1, 2, 11, 22], [5.5, 6, 8.75, 10]], np.float32))
    assert a.class_names == ["person", "bicycle"]
    assert index.objects_per_image.tolist() == [2, 0, 1]
    assert index.image(2).crowd.tolist() == [True] and index.image(2).object_attributes == [{}]
    assert index.image_ids.tolist() == [10, 11, 12] and index.category_ids.tolist() == [0, 7]
    assert index.image(0).object_attributes == [{}, {}]
    assert index.annotation_path(1) == "instances_val.json#b.jpg"
    assert len(index.landmark_schema) == 0 and not index.problems


def test_declared_categories_without_objects_stay_in_the_vocabulary(tmp_path):
    data = coco(
        [img(1, "a.jpg")],
        [ann(1, 1, 3, [1, 2, 10, 20])],
        [{"id": 5, "name": "zebra"}, {"id": 3, "name": "ant"}, {"id": 9, "name": "unused"}],
    )
    index = read_annotations(_write(tmp_path / "instances.json", data, ("a.jpg",)), class_map={"zebra": "z"})
    assert index.classes == ("ant", "z", "unused")
    assert index.class_counts() == {"ant": 1, "z": 0, "unused": 0}


def test_person_keypoints_schema_flip_pairs_and_visibility(tmp_path):
    kps = [0.0] * 51
    kps[0:3] = [10, 11, 2]  # nose visible
    kps[3:6] = [12, 9, 1]  # left_eye hidden
    kps[6:9] = [99, 99, 0]  # right_eye absent: coordinates ignored
    data = coco(
        [img(1, "a.jpg")],
        [ann(1, 1, 1, [2, 2, 30, 40], keypoints=kps, num_keypoints=2)],
        [{"id": 1, "name": "person", "keypoints": list(COCO17_NAMES), "skeleton": [[16, 14]]}],
    )
    index = read_annotations(_write(tmp_path / "person_keypoints_val.json", data, ("a.jpg",)))
    assert index.landmark_schema == COCO17
    assert (1, 2) in index.landmark_schema.flip_pairs  # left_eye <-> right_eye
    assert index.visibility[0, :4].tolist() == [2, 1, 0, 0]
    np.testing.assert_array_equal(index.landmarks[0, :3], [[10, 11], [12, 9], [0, 0]])


def test_layout_annotations_folder_and_split_images(tmp_path):
    data = coco([img(1, "a.jpg")], [ann(1, 1, 1, [1, 1, 5, 5])], [{"id": 1, "name": "k"}])
    _write(tmp_path / "annotations" / "instances_val2017.json", data, ("a.jpg",), tmp_path / "val2017")
    assert detect_format(tmp_path) == "coco"
    index = read_annotations(tmp_path)
    assert index.root == tmp_path.resolve()
    assert index.image_path(0) == tmp_path / "val2017" / "a.jpg"
    assert index.annotation_path(0) == "annotations/instances_val2017.json#a.jpg"


def test_voc_folder_is_not_taken_for_coco(tmp_path):
    (tmp_path / "annotations").mkdir()
    (tmp_path / "annotations" / "a.xml").write_text("<annotation><filename>a.jpg</filename></annotation>")
    (tmp_path / "annotations" / "x.json").write_text('{"images": []}')
    assert detect_format(tmp_path) == "voc"


def test_attributes_flags_and_image_class(tmp_path):
    data = coco(
        [img(1, "a.jpg", attributes={"class": "indoor", "light": "dim"})],
        [ann(1, 1, 1, [1, 1, 5, 5], attributes={"occluded": True, "difficult": "1", "age": "child", "n": 3})],
        [{"id": 1, "name": "face"}],
    )
    index = read_annotations(_write(tmp_path / "x.json", data, ("a.jpg",)))
    a = index.image(0)
    assert a.image_class == "indoor" and a.attributes == {"light": "dim"}
    assert a.occluded.tolist() == [True] and a.difficult.tolist() == [True] and a.truncated.tolist() == [False]
    assert a.object_attributes == [{"age": "child", "n": "3"}]


def test_problems_name_json_positions(tmp_path):
    data = coco(
        [img(1, "a.jpg"), img(2, "gone.jpg"), img(1, "dup.jpg"), {"id": 3, "file_name": "a.jpg"}],
        [
            ann(1, 1, 5, [1, 1, 5, 5]),
            ann(2, 1, 1, [1, 1, 5]),
            ann(3, 99, 1, [1, 1, 5, 5]),
            ann(4, 1, 1, [1, "x", 5, 5]),
            ann(5, 1, 1, [10, 10, -3, 5]),
            ann(6, 1, 2, [1, 1, 5, 5], keypoints=[1, 2, 2, 3, 4]),
            ann(7, 1, 2, [1, 1, 5, 5], keypoints=[1, 2, 2, 3, 4, 2]),
            {"id": 8, "image_id": 1, "category_id": 1},
        ],
        [{"id": 1, "name": "k"}, {"id": 2, "name": "p", "keypoints": ["a", "b", "c"]}],
    )
    path = _write(tmp_path / "x.json", data, ("a.jpg",))
    index = read_annotations(path, on_error="skip")
    messages = [str(p) for p in index.problems]
    for expected in (
        "x.json: images[2]/id: id=1 repeats images[0] (image skipped)",
        "x.json: annotations[2]/image_id: image_id=99 is not in images (object skipped)",
        "x.json: annotations[0]/category_id: category_id=5 is not in categories (object skipped)",
        "x.json: annotations[1]/bbox: bbox=[1, 1, 5] is not [x, y, w, h] (object skipped)",
        "x.json: annotations[3]/bbox: y='x' is not a number (object skipped)",
        "x.json: annotations[4]/bbox: xmax=7 <= xmin=10 (object skipped)",
        "x.json: annotations[5]/keypoints: 5 values is not x,y,v triples (landmarks skipped)",
        "x.json: annotations[6]/keypoints: 2 points, category names 3 keypoints (landmarks skipped)",
        "x.json: annotations[7]/bbox: bbox is missing (object skipped)",
    ):
        assert expected in messages
    assert any(m.startswith("x.json: images[1]/file_name: file_name='gone.jpg' not found") for m in messages)
    assert len(index) == 1  # a.jpg twice (ids 1 and 3): the second is a duplicate image
    assert index.problems.counts()["duplicate_image"] == 2  # image id 1 twice; a.jpg twice
    assert index.num_objects == 2  # the two keypoint annotations keep their boxes
    with pytest.raises(AnnotationError, match=r"x.json: images\[2\]/id"):
        read_annotations(path)


def test_size_from_header_when_missing(tmp_path):
    data = coco([{"id": 1, "file_name": "a.jpg"}], [], [])
    index = read_annotations(_write(tmp_path / "x.json", data, ("a.jpg",)))
    assert index.image(0).size == (64, 48)
    assert index.problems.counts() == {"missing_size": 1} and not index.problems.errors


def test_broken_json_and_wrong_shape(tmp_path):
    (tmp_path / "x.json").write_text('{"images": [ {"id": 1,, } ]}')
    index = read_annotations(tmp_path / "x.json", format="coco", on_error="skip")
    assert len(index) == 0
    assert str(next(iter(index.problems))).startswith("x.json: line 1 column ")
    (tmp_path / "y.json").write_text('{"images": {"id": 1}}')
    with pytest.raises(AnnotationError, match="images is a dict, not a list"):
        read_annotations(tmp_path / "y.json")


def test_json_size_cap(tmp_path):
    data = coco([img(1, "a.jpg")], [], [])
    path = _write(tmp_path / "x.json", data, ("a.jpg",))
    with pytest.raises(AnnotationError, match="exceeds max_json_bytes=10"):
        read_annotations(path, max_json_bytes=10)


def test_category_without_keypoint_names_is_positional(tmp_path):
    data = coco(
        [img(1, "a.jpg")], [ann(1, 1, 1, [1, 1, 20, 20], keypoints=[3, 4, 2, 5, 6, 2])], [{"id": 1, "name": "k"}]
    )
    index = read_annotations(_write(tmp_path / "x.json", data, ("a.jpg",)))
    assert index.landmark_schema.names == ("p0", "p1")


def test_cli_index_json(tmp_path, capsys):
    data = coco([img(1, "a.jpg")], [ann(1, 1, 1, [1, 1, 5, 5])], [{"id": 1, "name": "k"}])
    path = _write(tmp_path / "x.json", data, ("a.jpg",))
    assert main(["index", str(path), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["format"] == "coco" and out["images"] == 1 and out["classes"] == {"k": 1}
