"""Hostile input: bad values, paths that leave the dataset, and a generated corpus of broken
files. Every read either returns an index (problems reported, naming file, element and value)
or raises a documented detloader error; nothing else escapes a reader."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from helpers import voc_dataset, voc_object, voc_xml, write_image

from detloader import AnnotationError, read_annotations


def _read(path: Path, **kw):
    with pytest.warns(UserWarning):
        return read_annotations(path, on_error="warn", cache=False, **kw)


def _problems(index, kind: str | None = None) -> list[str]:
    return [str(p) for p in index.problems if kind is None or p.kind == kind]


# -- 1. one bad value never aborts the read ---------------------------------------------------
HUGE = ["inf", "1e309", str(2**31), str(2**64), "-inf", "nan"]


@pytest.mark.parametrize("value", HUGE)
def test_voc_huge_size_is_a_problem_not_an_overflow(tmp_path, value):
    files = {
        "a": voc_xml("a.jpg", [voc_object("cat", (1, 1, 9, 9))], extra="").replace("<width>64</width>", f"<width>{value}</width>"),
        "b": voc_xml("b.jpg", [voc_object("dog", (1, 1, 9, 9))]),
    }
    root = voc_dataset(tmp_path, files)
    index = _read(root)
    assert len(index) == 2  # the size came from the image header for a.jpg
    shown = _problems(index, "missing_size") + _problems(index, "bad_value")
    assert any("Annotations/a.xml" in s and value in s for s in shown), shown


@pytest.mark.parametrize("value", ["1e309", "inf", "nan", "abc", str(2**200)])
def test_voc_bad_coordinate_names_file_element_value(tmp_path, value):
    files = {"a": voc_xml("a.jpg", [voc_object("cat", (1, 1, value, 9)), voc_object("cat", (1, 1, 9, 9))])}
    index = _read(voc_dataset(tmp_path, files))
    assert index.num_objects == 1
    text = " ".join(_problems(index))
    assert "Annotations/a.xml" in text and "object[1]" in text


def _cvat(tmp_path: Path, images: str) -> Path:
    write_image(tmp_path / "images" / "a.jpg")
    write_image(tmp_path / "images" / "b.jpg")
    path = tmp_path / "annotations.xml"
    path.write_text(f"<annotations><version>1.1</version>{images}</annotations>", encoding="utf-8")
    return path


def _cvat_box(extra: str = "", box=(1, 1, 9, 9)) -> str:
    x1, y1, x2, y2 = box
    return f'<box label="face" occluded="0" xtl="{x1}" ytl="{y1}" xbr="{x2}" ybr="{y2}"{extra}></box>'


@pytest.mark.parametrize("value", HUGE)
def test_cvat_huge_size(tmp_path, value):
    path = _cvat(
        tmp_path,
        f'<image id="0" name="a.jpg" width="{value}" height="48">{_cvat_box()}</image>'
        f'<image id="1" name="b.jpg" width="64" height="48">{_cvat_box()}</image>',
    )
    index = _read(path)
    assert len(index) == 2
    assert any("annotations.xml" in s and value in s for s in _problems(index)), _problems(index)


@pytest.mark.parametrize("rotation", ["inf", "nan", "1e309", "-inf", "abc"])
def test_cvat_rotation_not_finite(tmp_path, rotation):
    path = _cvat(
        tmp_path,
        f'<image id="0" name="a.jpg" width="64" height="48">{_cvat_box(f" rotation={chr(34)}{rotation}{chr(34)}")}'
        f"{_cvat_box()}</image>",
    )
    index = _read(path)
    assert index.num_objects == 1
    shown = _problems(index)
    assert any("annotations.xml" in s and "rotation" in s and rotation in s for s in shown), shown


@pytest.mark.parametrize("value", ["1e309", "inf", str(2**31), str(2**64)])
def test_cvat_huge_image_id(tmp_path, value):
    path = _cvat(tmp_path, f'<image id="{value}" name="a.jpg" width="64" height="48">{_cvat_box()}</image>')
    index = _read(path) if False else read_annotations(path, on_error="skip", cache=False)
    assert len(index) == 1


def _coco(tmp_path: Path, images: list, annotations: list, categories=None) -> Path:
    write_image(tmp_path / "images" / "a.jpg")
    write_image(tmp_path / "images" / "b.jpg")
    data = {"images": images, "annotations": annotations, "categories": categories or [{"id": 1, "name": "cat"}]}
    path = tmp_path / "annotations.json"
    path.write_text(json.dumps(data, allow_nan=True).replace('"__INF__"', "Infinity").replace('"__BIG__"', "1e309"))
    return path


def _img(i, name, w=64, h=48):
    return {"id": i, "file_name": name, "width": w, "height": h}


def _ann(i, image, cat, bbox):
    return {"id": i, "image_id": image, "category_id": cat, "bbox": bbox, "iscrowd": 0}


@pytest.mark.parametrize("value", ["__INF__", "__BIG__", 2**31, 2**64, -(2**70), 1e300, True, [64], {"w": 64}])
def test_coco_huge_or_wrong_size(tmp_path, value):
    path = _coco(tmp_path, [_img(1, "a.jpg", w=value), _img(2, "b.jpg")], [_ann(1, 1, 1, [1, 1, 5, 5]), _ann(2, 2, 1, [1, 1, 5, 5])])
    index = _read(path)
    assert len(index) == 2
    assert any("annotations.json" in s and "images[0]" in s for s in _problems(index)), _problems(index)


@pytest.mark.parametrize("value", [[1], {"a": 1}, "__INF__", "__BIG__", 1.5, None, True, 2**70])
@pytest.mark.parametrize("where", ["image_id", "category_id", "id"])
def test_coco_ids_of_the_wrong_type(tmp_path, where, value):
    images = [_img(1, "a.jpg"), _img(2, "b.jpg")]
    anns = [_ann(1, 1, 1, [1, 1, 5, 5]), _ann(2, 2, 1, [1, 1, 5, 5])]
    anns[0][where] = value
    index = read_annotations(_coco(tmp_path, images, anns), on_error="skip", cache=False)
    assert index.num_objects >= 1
    if where != "id":
        assert any("annotations[0]" in s for s in _problems(index)), _problems(index)


@pytest.mark.parametrize("value", [[1], {"a": 1}, "__INF__", 1.5, True])
def test_coco_image_and_category_ids_of_the_wrong_type(tmp_path, value):
    images = [_img(value, "a.jpg"), _img(2, "b.jpg")]
    cats = [{"id": value, "name": "dog"}, {"id": 1, "name": "cat"}]
    anns = [_ann(1, 2, 1, [1, 1, 5, 5])]
    index = read_annotations(_coco(tmp_path, images, anns, cats), on_error="skip", cache=False)
    assert index.num_objects == 1
    shown = _problems(index)
    assert any("images[0]" in s for s in shown) and any("categories[0]" in s for s in shown), shown


@pytest.mark.parametrize("value", ["__INF__", "__BIG__", "nan", 1e300, [1], {"x": 1}])
def test_coco_bbox_values(tmp_path, value):
    path = _coco(tmp_path, [_img(1, "a.jpg")], [_ann(1, 1, 1, [1, 1, value, 5]), _ann(2, 1, 1, [1, 1, 5, 5])])
    index = read_annotations(path, on_error="skip", cache=False)
    assert index.num_objects == 1
    assert any("annotations[0]" in s for s in _problems(index))


def test_raise_policy_raises_annotation_error_naming_the_file(tmp_path):
    path = _coco(tmp_path, [_img(1, "a.jpg")], [_ann(1, 1, [7], [1, 1, 5, 5])])
    with pytest.raises(AnnotationError, match=r"annotations.json: annotations\[0\]/category_id: category_id=\[7\]"):
        read_annotations(path, cache=False)


# -- 7. paths that leave the dataset are reported, never followed -----------------------------
def _outside(tmp_path: Path) -> tuple[Path, Path]:
    """A dataset folder ``ds`` and an image beside it, outside the dataset."""
    secret = write_image(tmp_path / "secret.jpg")
    ds = tmp_path / "ds"
    write_image(ds / "images" / "a.jpg")
    return ds, secret


@pytest.mark.parametrize("kind", ["relative", "absolute"])
def test_coco_file_name_outside_the_dataset(tmp_path, kind):
    ds, secret = _outside(tmp_path)
    name = "../../secret.jpg" if kind == "relative" else str(secret)
    data = {"images": [_img(1, name), _img(2, "a.jpg")], "annotations": [], "categories": []}
    (ds / "annotations.json").write_text(json.dumps(data))
    index = read_annotations(ds / "annotations.json", on_error="skip", cache=False)
    assert [index.relative_image_path(i) for i in range(len(index))] == ["images/a.jpg"]
    shown = _problems(index, "outside_dataset")
    assert shown and "annotations.json: images[0]/file_name" in shown[0] and name in shown[0]
    with pytest.raises(AnnotationError, match="leaves the dataset"):
        read_annotations(ds / "annotations.json", cache=False)


def test_coco_escaping_name_whose_base_name_is_inside_is_repaired(tmp_path):
    ds, _ = _outside(tmp_path)
    data = {"images": [_img(1, "../../../../a.jpg")], "annotations": [], "categories": []}
    (ds / "annotations.json").write_text(json.dumps(data))
    index = read_annotations(ds / "annotations.json", cache=False)  # a repair never raises
    assert index.relative_image_path(0) == "images/a.jpg"
    assert [p.severity for p in index.problems if p.kind == "outside_dataset"] == ["repaired"]


def test_absolute_name_inside_the_dataset_is_fine(tmp_path):
    ds, _ = _outside(tmp_path)
    data = {"images": [_img(1, str(ds / "images" / "a.jpg"))], "annotations": [], "categories": []}
    (ds / "annotations.json").write_text(json.dumps(data))
    index = read_annotations(ds / "annotations.json", cache=False)
    assert index.relative_image_path(0) == "images/a.jpg" and not index.problems


@pytest.mark.parametrize("fmt", ["voc", "cvat", "imglab", "txt"])
def test_other_formats_do_not_follow_escaping_names(tmp_path, fmt):
    ds, secret = _outside(tmp_path)
    name = "../../secret.jpg"
    if fmt == "voc":
        (ds / "Annotations").mkdir()
        (ds / "JPEGImages").mkdir()
        (ds / "Annotations" / "x.xml").write_text(voc_xml(name, [voc_object("cat", (1, 1, 9, 9))]))
        path = ds
    elif fmt == "cvat":
        path = ds / "annotations.xml"
        path.write_text(f'<annotations><version>1.1</version><image id="0" name="{name}" width="64" height="48"></image></annotations>')
    elif fmt == "imglab":
        path = ds / "faces.xml"
        path.write_text(f"<?xml version='1.0'?><dataset><images><image file='{name}' width='64' height='48'/></images></dataset>")
    else:
        path = ds / "list.txt"
        path.write_text(f"{name} cat\nimages/a.jpg cat\n")
    index = read_annotations(path, on_error="skip", cache=False)
    assert all("secret" not in index.relative_image_path(i) for i in range(len(index)))
    assert any(p.kind == "outside_dataset" for p in index.problems), index.problems.summary()


# -- the last line of defence: a reader gap costs one file, never the read ------------------
def test_unforeseen_reader_error_becomes_a_problem_of_that_file(tmp_path, monkeypatch):
    from detloader.annotations.readers import voc

    files = {"a": voc_xml("a.jpg", [voc_object("cat", (1, 1, 9, 9))]), "b": voc_xml("b.jpg", [voc_object("cat", (1, 1, 9, 9))])}
    root = voc_dataset(tmp_path, files)
    real = voc.parse_object

    def boom(obj, where, b):
        if b.file.endswith("a.xml"):
            raise TypeError("unforeseen")
        return real(obj, where, b)

    monkeypatch.setattr(voc, "parse_object", boom)
    index = read_annotations(root, on_error="skip", cache=False, workers=1)
    assert index.num_objects == 1
    (p,) = [p for p in index.problems if p.kind == "reader_error"]
    assert p.file == "Annotations/a.xml" and "TypeError: unforeseen" in p.message
