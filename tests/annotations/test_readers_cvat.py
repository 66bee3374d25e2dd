"""CVAT for images 1.1 reader: boxes, attributes, points, skeletons, tags, subsets, options."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from helpers import write_image

from detloader import AnnotationError, detect_format, read_annotations
from detloader.cli import main

# the reader closes the files it opens: an abandoned stream left to the garbage collector fails
pytestmark = pytest.mark.filterwarnings("error::ResourceWarning")

META = """
  <meta>
    <task>
      <name>faces</name>
      <labels>
        <label><name>face</name><type>rectangle</type>
          <attributes><attribute><name>age</name><input_type>select</input_type><values>adult
child</values></attribute></attributes>
        </label>
        <label><name>face5</name><type>skeleton</type><svg>&lt;circle data-label-name="nose"&gt;</svg></label>
        <label><name>right_eye</name><type>points</type><parent>face5</parent></label>
        <label><name>left_eye</name><type>points</type><parent>face5</parent></label>
        <label><name>nose</name><type>points</type><parent>face5</parent></label>
        <label><name>chin</name><type>points</type></label>
        <label><name>indoor</name><type>tag</type></label>
      </labels>
    </task>
  </meta>"""


def cvat_xml(images: str, meta: str = META) -> str:
    head = '<?xml version="1.0" encoding="utf-8"?>\n<annotations>\n  <version>1.1</version>'
    return f"{head}{meta}\n{images}\n</annotations>\n"


def image_xml(image_id: int, name: str, body: str = "", *, size: tuple[int, int] = (64, 48), extra: str = "") -> str:
    return f'<image id="{image_id}" name="{name}" width="{size[0]}" height="{size[1]}"{extra}>{body}</image>'


def box_xml(
    label: str, box: tuple, *, group: str | None = None, occluded: int = 0, attrs: dict | None = None, extra: str = ""
) -> str:
    x1, y1, x2, y2 = box
    g = f' group_id="{group}"' if group is not None else ""
    inner = "".join(f'<attribute name="{k}">{v}</attribute>' for k, v in (attrs or {}).items())
    return (
        f'<box label="{label}" source="manual" occluded="{occluded}" xtl="{x1}" ytl="{y1}" xbr="{x2}" ybr="{y2}"'
        f' z_order="0"{g}{extra}>{inner}</box>'
    )


def skeleton_xml(label: str, points: dict, *, group: str | None = None) -> str:
    g = f' group_id="{group}"' if group is not None else ""
    inner = ""
    for name, (x, y, outside, occluded) in points.items():
        inner += (
            f'<points label="{name}" source="manual" outside="{outside}" occluded="{occluded}" '
            f'points="{x},{y}"></points>'
        )
    return f'<skeleton label="{label}" source="manual" z_order="0"{g}>{inner}</skeleton>'


def _dataset(tmp_path: Path, images: str, names: tuple[str, ...] = ("a.jpg", "b.jpg"), meta: str = META) -> Path:
    for n in names:
        write_image(tmp_path / "images" / n)
    path = tmp_path / "annotations.xml"
    path.write_text(cvat_xml(images, meta), encoding="utf-8")
    return path


def test_boxes_attributes_flags_and_tags(tmp_path):
    body = (
        box_xml("face", (1.5, 2, 20, 30.25), occluded=1, attrs={"age": "child", "difficult": "true"})
        + box_xml("car", (30, 10, 60, 40), attrs={"truncated": "1"})
        + '<tag label="indoor" source="manual"><attribute name="light">dim</attribute></tag>'
    )
    path = _dataset(tmp_path, image_xml(0, "a.jpg", body) + image_xml(1, "b.jpg"))
    assert detect_format(path) == "cvat" and detect_format(tmp_path) == "cvat"
    index = read_annotations(tmp_path)
    assert len(index) == 2 and index.num_objects == 2
    a = index.image(0)
    assert a.path == tmp_path / "images" / "a.jpg"
    np.testing.assert_array_equal(a.boxes, np.array([[1.5, 2, 20, 30.25], [30, 10, 60, 40]], np.float32))
    assert a.class_names == ["face", "car"]
    assert a.occluded.tolist() == [True, False]
    assert a.difficult.tolist() == [True, False]
    assert a.truncated.tolist() == [False, True]
    assert a.object_attributes == [{"age": "child"}, {}]
    assert a.image_class == "indoor" and a.attributes == {"light": "dim"}
    assert index.image(1).image_class is None
    assert index.annotation_path(0) == "annotations.xml#a.jpg"
    assert not index.problems


def test_grouped_points_and_skeleton_follow_meta_order(tmp_path):
    body = (
        box_xml("face", (5, 5, 40, 40), group="1")
        + skeleton_xml(
            "face5", {"left_eye": (12, 10, 0, 0), "right_eye": (30, 10, 0, 1), "nose": (0, 0, 1, 0)}, group="1"
        )
        + '<points label="chin" source="manual" occluded="0" points="20,38" z_order="0" group_id="1"></points>'
    )
    index = read_annotations(_dataset(tmp_path, image_xml(0, "a.jpg", body), ("a.jpg",)))
    schema = index.landmark_schema
    assert schema.names == ("right_eye", "left_eye", "nose", "chin")  # the <meta> order
    assert schema.flip_pairs == ((0, 1),)
    np.testing.assert_array_equal(index.landmarks[0], [[30, 10], [12, 10], [0, 0], [20, 38]])
    assert index.visibility[0].tolist() == [1, 2, 0, 2]  # occluded, visible, outside, visible


def test_ungrouped_points_join_the_smallest_box_containing_them(tmp_path):
    body = (
        box_xml("face", (0, 0, 60, 46))
        + box_xml("face", (10, 10, 30, 30))
        + '<points label="chin" occluded="0" points="20,25"></points>'
        + '<points label="chin" occluded="0" points="50,40"></points>'
        + '<points label="chin" occluded="0" points="63,47.5"></points>'
    )
    path = _dataset(tmp_path, image_xml(0, "a.jpg", body), ("a.jpg",))
    index = read_annotations(path, on_error="skip", boxes_from_points="skip")
    chin = index.landmark_schema.names.index("chin")
    assert index.visibility[:, chin].tolist() == [2, 2]
    np.testing.assert_array_equal(index.landmarks[:, chin], [[50, 40], [20, 25]])
    problems = [str(p) for p in index.problems]
    assert problems == [
        "annotations.xml: 1 objects with landmarks and no box (first: image[id=0]/points[3]) "
        "(skipped, boxes_from_points='skip')"
    ]
    grouped_only = read_annotations(path, on_error="skip", link_points="group", boxes_from_points="skip")
    assert (grouped_only.visibility == 0).all() and grouped_only.meta["stats"]["points_without_box_skipped"] == 3


def test_points_that_no_box_takes_are_objects_of_their_label(tmp_path):
    """A points-only export: each <points> is an object of its label, boxed by its points."""
    body = (
        box_xml("face", (10, 10, 30, 30))
        + '<points label="chin" occluded="0" points="20,25"></points>'  # inside the box: joins it
        + '<points label="chin" occluded="0" points="63,47.5"></points>'  # one point, at the edge
        + '<points label="hand" occluded="0" points="40,5;50,20;44,12"></points>'
    )
    path = _dataset(tmp_path, image_xml(0, "a.jpg", body), ("a.jpg",))
    index = read_annotations(path)
    assert [index.classes[c] for c in index.labels] == ["face", "chin", "hand"]
    # a single point gets a 1-pixel box centred on it, kept inside the 64x48 image
    np.testing.assert_array_equal(index.boxes, [[10, 10, 30, 30], [62.5, 47, 63.5, 48], [40, 5, 50, 20]])
    slots = [index.landmark_schema.names.index(n) for n in ("p0", "p1", "p2")]
    np.testing.assert_array_equal(index.landmarks[2, slots], [[40, 5], [50, 20], [44, 12]])
    assert [(p.kind, p.severity, p.message) for p in index.problems] == [
        ("box_from_points", "repaired", "2 objects with landmarks and no box (first: image[id=0]/points[2])")
    ]
    whole = read_annotations(path, boxes_from_points="image")
    np.testing.assert_array_equal(whole.boxes[1:], [[0, 0, 64, 48], [0, 0, 64, 48]])
    assert "boxed by the whole image" in str(next(iter(whole.problems)))


def test_multi_point_points_element_is_positional(tmp_path):
    body = (
        box_xml("face", (0, 0, 60, 46), group="4")
        + '<points label="lm" occluded="0" points="1,2;3,4;5,6" group_id="4"/>'
    )
    index = read_annotations(_dataset(tmp_path, image_xml(0, "a.jpg", body), ("a.jpg",)), format="cvat")
    assert index.landmark_schema.names == ("p0", "p1", "p2")
    np.testing.assert_array_equal(index.landmarks[0], [[1, 2], [3, 4], [5, 6]])


def test_skeleton_without_box_becomes_an_object_boxed_by_its_points(tmp_path):
    body = skeleton_xml("face5", {"left_eye": (10, 12, 0, 0), "right_eye": (30, 14, 0, 0), "nose": (20, 25, 0, 1)})
    index = read_annotations(_dataset(tmp_path, image_xml(0, "a.jpg", body), ("a.jpg",)))
    assert index.classes == ("face5",)
    np.testing.assert_array_equal(index.boxes, [[10, 12, 30, 25]])
    assert index.meta["stats"]["boxes_from_points"] == 1


def test_subsets_become_splits_and_an_image_attribute(tmp_path):
    images = (
        image_xml(0, "a.jpg", extra=' subset="Train"')
        + image_xml(1, "b.jpg", extra=' subset="Validation"')
        + image_xml(2, "c.jpg", extra=' subset="Train"')
    )
    index = read_annotations(_dataset(tmp_path, images, ("a.jpg", "b.jpg", "c.jpg")))
    assert {k: v.tolist() for k, v in index.splits.items()} == {"Train": [0, 2], "Validation": [1]}
    assert index.image(1).attributes == {"subset": "Validation"}
    assert len(index.split("Train")) == 2


def test_images_by_id_for_renamed_exports(tmp_path):
    (tmp_path / "images").mkdir()
    write_image(tmp_path / "images" / "frame_000012.jpg")
    write_image(tmp_path / "images" / "7.png")
    images = image_xml(12, "cam/left/IMG_0001.jpg") + image_xml(7, "x/IMG_0002.jpg")
    path = tmp_path / "annotations.xml"
    path.write_text(cvat_xml(images))
    with pytest.raises(AnnotationError, match=r"image\[id=12\]: name='cam/left/IMG_0001.jpg' not found"):
        read_annotations(path)
    index = read_annotations(path, images_by="id")
    assert [p.name for p in (index.image_path(0), index.image_path(1))] == ["frame_000012.jpg", "7.png"]
    assert index.annotation_path(0) == "annotations.xml#cam/left/IMG_0001.jpg"
    with pytest.raises(ValueError, match="images_by='number' is not one of name, id"):
        read_annotations(path, images_by="number")


def test_rotation_unsupported_shapes_and_tracks(tmp_path):
    body = (
        box_xml("face", (10, 10, 30, 20), extra=' rotation="90.0"')
        + '<polygon label="face" points="1,1;5,1;5,5"/><polygon label="face" points="1,1;5,1;5,5"/>'
        + '<polyline label="face" points="1,1;5,5"/>'
    )
    images = (
        image_xml(0, "a.jpg", body)
        + '<track id="0" label="face"><box frame="0" xtl="1" ytl="1" xbr="2" ybr="2"/></track>'
    )
    index = read_annotations(_dataset(tmp_path, images, ("a.jpg",)), on_error="skip")
    np.testing.assert_allclose(index.boxes, [[15, 5, 25, 25]], atol=1e-5)  # 20x10 box turned upright
    assert index.meta["stats"]["ignored_polygon"] == 2
    messages = [str(p) for p in index.problems]
    assert (
        "annotations.xml: image[id=0]/box[1]/rotation: rotation=90 degrees (replaced by its axis-aligned bounds)"
        in messages
    )
    assert (
        "annotations.xml: polygon: 2 <polygon> shapes (first: image[id=0]/polygon[1]) carry no box (ignored)"
        in messages
    )
    assert any("CVAT for video is not read" in m for m in messages)
    errors = [str(p) for p in index.problems.errors]
    assert errors == [m for m in messages if "track" in m]  # shapes without boxes never fail a read


def test_problems_name_image_id_and_element(tmp_path):
    body = (
        box_xml("face", (5, 5, 2, 9))
        + box_xml("face", ("x", 1, 4, 4))
        + '<box xtl="1" ytl="1" xbr="3" ybr="3"/>'
        + '<tag label="indoor"/><tag label="outdoor"/>'
        + '<points label="chin" points="1;2"/>'
    )
    path = _dataset(tmp_path, image_xml(12, "a.jpg", body) + image_xml(13, "gone.jpg"), ("a.jpg",))
    index = read_annotations(path, on_error="skip")
    messages = [str(p) for p in index.problems]
    for expected in (
        "annotations.xml: image[id=12]/box[3]: label= is missing (object skipped)",
        "annotations.xml: image[id=12]/points[1]: points='1' is not x,y (points skipped)",
        "annotations.xml: image[id=12]/tag[2]: tag label='outdoor': the image already has class 'indoor' "
        "(one class per image) (tag ignored)",
    ):
        assert expected in messages
    assert "annotations.xml: image[id=12]/box[2]: xtl='x' is not a number (object skipped)" in messages
    assert "annotations.xml: image[id=12]/box[1]: xmax=2 <= xmin=5 (object skipped)" in messages
    assert any(m.startswith("annotations.xml: image[id=13]: name='gone.jpg' not found in images") for m in messages)
    assert index.num_objects == 0 and len(index) == 1


def test_group_with_two_boxes_is_reported(tmp_path):
    body = box_xml("face", (1, 1, 20, 20), group="3") + box_xml("face", (2, 2, 30, 30), group="3")
    body += '<points label="chin" points="10,10" group_id="3"/>'
    index = read_annotations(_dataset(tmp_path, image_xml(0, "a.jpg", body), ("a.jpg",)), on_error="skip")
    assert index.num_objects == 2 and index.problems.counts() == {"unsupported": 1}
    assert "group_id=3 holds 2 boxes" in str(next(iter(index.problems)))


def test_malformed_xml_keeps_images_before_the_error(tmp_path):
    text = cvat_xml(image_xml(0, "a.jpg", box_xml("face", (1, 1, 9, 9))) + '<image id="1" name="b.jpg"><box')
    for n in ("a.jpg", "b.jpg"):
        write_image(tmp_path / "images" / n)
    (tmp_path / "annotations.xml").write_text(text)
    index = read_annotations(tmp_path / "annotations.xml", on_error="skip")
    assert len(index) == 1 and index.num_objects == 1
    assert index.problems.counts() == {"unparseable": 1}
    assert str(next(iter(index.problems))).startswith("annotations.xml: line ")


def test_doctype_with_entities_is_refused(tmp_path):
    write_image(tmp_path / "images" / "a.jpg")
    text = (
        '<?xml version="1.0"?><!DOCTYPE annotations [<!ENTITY x "y">]><annotations>'
        + image_xml(0, "a.jpg")
        + "</annotations>"
    )
    (tmp_path / "annotations.xml").write_text(text)
    index = read_annotations(tmp_path / "annotations.xml", format="cvat", on_error="skip")
    assert len(index) == 0 and index.problems.counts() == {"unsafe_xml": 1}


def test_streaming_many_images(tmp_path):
    write_image(tmp_path / "images" / "a.jpg")
    body = "".join(
        image_xml(i, f"x{i}.jpg", box_xml("face", (1, 1, 9 + i % 5, 9)) + box_xml("car", (2, 2, 5, 5)))
        for i in range(3000)
    )
    (tmp_path / "annotations.xml").write_text(cvat_xml(body))
    index = read_annotations(tmp_path / "annotations.xml", check_images=False)
    assert len(index) == 3000 and index.num_objects == 6000
    assert index.boxes[0:10:2, 2].tolist() == [9, 10, 11, 12, 13]
    assert index.image_path(2999) == tmp_path / "images" / "x2999.jpg"


def test_cli_index_json(tmp_path, capsys):
    _dataset(tmp_path, image_xml(0, "a.jpg", box_xml("face", (1, 1, 9, 9))), ("a.jpg",))
    assert main(["index", str(tmp_path), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["format"] == "cvat" and data["images"] == 1 and data["classes"] == {"face": 1}


def test_unknown_format_option_is_refused(tmp_path):
    path = _dataset(tmp_path, image_xml(0, "a.jpg"), ("a.jpg",))
    with pytest.raises(
        ValueError, match="format option.s. images_bi not known to the cvat reader; valid: images_by, link_points"
    ):
        read_annotations(path, images_bi="id")
