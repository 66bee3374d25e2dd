"""dlib imglab XML reader: boxes, labels, flags, parts, the iBUG 68-point preset, real data."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from helpers import write_image

from detloader import AnnotationError, detect_format, read_annotations
from detloader.annotations.landmarks import IBUG68
from detloader.cli import main

# streamed like CVAT: the XML file is closed however the stream ends
pytestmark = pytest.mark.filterwarnings("error::ResourceWarning")


def imglab_xml(images: str, *, stylesheet: bool = True) -> str:
    pi = "<?xml-stylesheet type='text/xsl' href='image_metadata_stylesheet.xsl'?>\n" if stylesheet else ""
    return (
        "<?xml version='1.0' encoding='ISO-8859-1'?>\n" + pi + "<dataset>\n<name>t</name>\n<comment>c</comment>\n"
        f"<images>\n{images}</images>\n</dataset>\n"
    )


def parts_xml(points: dict[str, tuple[float, float]]) -> str:
    return "".join(f"<part name='{n}' x='{x}' y='{y}'/>" for n, (x, y) in points.items())


def _dataset(tmp_path: Path, images: str, files: tuple[str, ...] = ("a.jpg", "b.jpg"), name: str = "faces.xml") -> Path:
    for f in files:
        write_image(tmp_path / f, (64, 48))
    path = tmp_path / name
    path.write_text(imglab_xml(images), encoding="latin-1")
    return path


def test_boxes_labels_flags_attributes(tmp_path):
    images = (
        "<image file='a.jpg' width='64' height='48'>"
        "<box top='2' left='4' width='10' height='20'/>"
        "<box top='5' left='6' width='8' height='8' ignore='1' pose='3' gender='female'><label>cat</label></box>"
        "<box top='1' left='1' width='3' height='3' difficult='1' truncated='1' occluded='1'/>"
        "</image>"
        "<image file='b.jpg' width='64' height='48'></image>"
    )
    path = _dataset(tmp_path, images)
    assert detect_format(path) == "imglab"
    index = read_annotations(path, default_class="face")
    assert len(index) == 2 and index.num_objects == 3
    a = index.image(0)
    np.testing.assert_array_equal(a.boxes, [[4, 2, 14, 22], [6, 5, 14, 13], [1, 1, 4, 4]])
    assert a.class_names == ["face", "cat", "face"]
    assert a.difficult.tolist() == [False, True, True]  # ignore -> difficult
    assert a.truncated.tolist() == [False, False, True]
    assert a.occluded.tolist() == [False, False, True]
    assert a.object_attributes == [{}, {"ignore": "1", "pose": "3", "gender": "female"}, {}]
    assert index.objects_per_image.tolist() == [3, 0]
    assert index.annotation_path(0) == "faces.xml#a.jpg"
    assert not index.problems


def test_default_class_is_object(tmp_path):
    path = _dataset(
        tmp_path, "<image file='a.jpg' width='64' height='48'><box top='1' left='1' width='5' height='5'/></image>"
    )
    assert read_annotations(path).classes == ("object",)


def test_parts_named_landmarks_and_not_present(tmp_path):
    pts = parts_xml({"left_eye": (10, 11), "right_eye": (20, 11), "nose": (2147483647, 2147483647)})
    path = _dataset(
        tmp_path,
        f"<image file='a.jpg' width='64' height='48'><box top='1' left='1' width='40' height='40'>{pts}</box></image>",
    )
    index = read_annotations(path)
    schema = index.landmark_schema
    assert schema.names == ("left_eye", "right_eye", "nose") and schema.flip_pairs == ((0, 1),)
    np.testing.assert_array_equal(index.landmarks[0], [[10, 11], [20, 11], [0, 0]])
    assert index.visibility[0].tolist() == [2, 2, 0]


def test_ibug68_preset_only_for_exactly_68_names(tmp_path):
    rng = np.random.default_rng(0)
    pts68 = {f"{i:02d}": tuple(rng.integers(5, 40, 2)) for i in range(68)}
    path = _dataset(
        tmp_path,
        "<image file='a.jpg' width='64' height='48'>"
        f"<box top='1' left='1' width='50' height='40'>{parts_xml(pts68)}</box></image>",
    )
    index = read_annotations(path)
    assert index.landmark_schema == IBUG68
    assert len(IBUG68.flip_pairs) == 29 and (36, 45) in IBUG68.flip_pairs and (0, 16) in IBUG68.flip_pairs
    perm = IBUG68.flip_permutation()
    assert (perm[perm] == np.arange(68)).all()  # an involution
    pts5 = {f"{i:02d}": (10 + i, 10) for i in range(5)}  # dlib's 5-point model: not iBUG
    path5 = _dataset(
        tmp_path / "five",
        "<image file='a.jpg' width='64' height='48'>"
        f"<box top='1' left='1' width='50' height='40'>{parts_xml(pts5)}</box></image>",
    )
    schema5 = read_annotations(path5).landmark_schema
    assert schema5.names == ("00", "01", "02", "03", "04") and schema5.flip_pairs == ()


def test_missing_size_read_from_header_and_problems_name_elements(tmp_path):
    images = (
        "<image file='a.jpg'><box top='1' left='1' width='5' height='5'/>"
        "<box top='x' left='1' width='5' height='5'/>"
        "<box top='1' left='1' width='0' height='5'/></image>"
        "<image file='gone.jpg' width='64' height='48'/>"
        "<image width='64' height='48'/>"
    )
    path = _dataset(tmp_path, images)
    index = read_annotations(path, on_error="skip")
    assert len(index) == 1 and index.num_objects == 1 and index.image(0).size == (64, 48)
    messages = [str(p) for p in index.problems]
    assert "faces.xml: image[1]: width=None height=None (read 64x48 from the image header)" in messages
    assert "faces.xml: image[1]/box[2]: top='x' is not a number (object skipped)" in messages
    assert "faces.xml: image[1]/box[3]: xmax=1 <= xmin=1 (object skipped)" in messages
    assert any(m.startswith("faces.xml: image[2]/file: file='gone.jpg' not found") for m in messages)
    assert "faces.xml: image[3]: file= is missing (image skipped)" in messages
    with pytest.raises(AnnotationError, match=r"image\[1\]/box\[2\]: top='x'"):
        read_annotations(path)


def test_truncated_file_keeps_earlier_images(tmp_path):
    write_image(tmp_path / "a.jpg")
    text = imglab_xml(
        "<image file='a.jpg' width='64' height='48'><box top='1' left='1' width='5' height='5'/></image>\n"
        "<image file='a.jpg'"
    )
    (tmp_path / "t.xml").write_text(text[: text.rindex("<image file='a.jpg'") + 20])
    index = read_annotations(tmp_path / "t.xml", on_error="skip")
    assert len(index) == 1
    assert index.problems.counts() == {"unparseable": 1}


def test_entity_declarations_refused(tmp_path):
    write_image(tmp_path / "a.jpg")
    bomb = (
        "<?xml version='1.0'?><!DOCTYPE dataset [<!ENTITY a 'aaaa'>]>"
        "<dataset><images><image file='a.jpg'>&a;</image></images></dataset>"
    )
    (tmp_path / "bomb.xml").write_text(bomb)
    index = read_annotations(tmp_path / "bomb.xml", format="imglab", on_error="skip")
    assert len(index) == 0 and index.problems.counts() == {"unsafe_xml": 1}


def test_folder_with_one_or_several_files(tmp_path):
    path = _dataset(tmp_path, "<image file='a.jpg' width='64' height='48'/>")
    assert detect_format(tmp_path) == "imglab"
    assert len(read_annotations(tmp_path)) == 1
    (tmp_path / "other.xml").write_text(path.read_text(encoding="latin-1"), encoding="latin-1")
    with pytest.raises(ValueError, match="holds 2 imglab files"):
        read_annotations(tmp_path)


def test_two_files_in_one_folder_keep_their_own_cache(tmp_path):
    one = _dataset(tmp_path, "<image file='a.jpg' width='64' height='48'/>", name="one.xml")
    two = tmp_path / "two.xml"
    two.write_text(
        imglab_xml("<image file='a.jpg' width='64' height='48'/><image file='b.jpg' width='64' height='48'/>")
    )
    first = read_annotations(one)
    second = read_annotations(two)
    assert (len(first), len(second)) == (1, 2)
    assert first._source_file != second._source_file
    assert read_annotations(one)._source_file == first._source_file  # a warm load, not a rebuild


def test_cache_follows_the_file(tmp_path):
    path = _dataset(tmp_path, "<image file='a.jpg' width='64' height='48'/>")
    assert len(read_annotations(path)) == 1
    path.write_text(
        imglab_xml("<image file='a.jpg' width='64' height='48'/><image file='b.jpg' width='64' height='48'/>")
    )
    assert len(read_annotations(path)) == 2


@pytest.mark.dataset
def test_real_dlib_faces(dlib_faces_root):
    train = read_annotations(dlib_faces_root / "training_with_face_landmarks.xml")
    test = read_annotations(dlib_faces_root / "testing_with_face_landmarks.xml")
    assert (len(train), len(test)) == (4, 5)
    for index in (train, test):
        assert not index.problems
        assert index.landmark_schema == IBUG68
        assert index.landmarks.shape == (index.num_objects, 68, 2)
        assert (index.visibility == 2).all()  # every face has its 68 points
        inside = (index.landmarks >= index.boxes[:, None, :2] - 15) & (index.landmarks <= index.boxes[:, None, 2:] + 15)
        assert inside.all()  # points lie on their face box (dlib's boxes are tight)
    plain = read_annotations(dlib_faces_root / "training.xml")
    assert plain.objects_per_image.tolist() == train.objects_per_image.tolist()
    assert np.abs(plain.boxes - train.boxes).max() <= 8  # the same faces, boxes a few pixels apart
    assert len(plain.landmark_schema) == 0


@pytest.mark.dataset
def test_real_dlib_faces_cli_json(dlib_faces_root, capsys):
    assert main(["index", str(dlib_faces_root / "testing_with_face_landmarks.xml"), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["format"] == "imglab" and data["images"] == 5
    assert len(data["landmarks"]["names"]) == 68 and len(data["landmarks"]["flip_pairs"]) == 29


def test_cli_index_json(tmp_path, capsys):
    path = _dataset(
        tmp_path,
        "<image file='a.jpg' width='64' height='48'>"
        "<box top='1' left='1' width='5' height='5'><label>k</label></box></image>",
    )
    assert main(["index", str(path), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["format"] == "imglab" and data["images"] == 1 and data["classes"] == {"k": 1}
