"""Pascal VOC reader: dialects, layouts, landmarks, attributes, class maps, validation."""

from __future__ import annotations

import os
import warnings

import numpy as np
import pytest
from helpers import keypoints_xml, voc_dataset, voc_object, voc_xml, write_image
from hypothesis import given, settings
from hypothesis import strategies as st

import detloader
from detloader import FACE5, MISSING, AnnotationError, LandmarkSchema, read_annotations
from detloader.annotations.problems import AnnotationWarning
from detloader.annotations.readers.voc import _named_like


def _kinds(index) -> dict[str, int]:
    return index.problems.counts()


def test_labelimg_dialect_int_float_flags_verified(tmp_path):
    xml = voc_xml(
        "a.jpg",
        [
            voc_object("dog", (1, 2, 30, 40), truncated="1", pose="Left"),
            voc_object("cat", ("10.5", "4.25", "20.75", "30.0"), difficult="1", occluded="true"),
        ],
        verified=True,
    )
    root = voc_dataset(tmp_path, {"a": xml, "b": voc_xml("b.jpg", [voc_object("dog", (0, 0, 5, 5))])})
    index = read_annotations(root)
    assert len(index) == 2 and index.num_objects == 3
    assert index.classes == ("cat", "dog")
    a = index.image(0)
    assert a.path == root / "JPEGImages" / "a.jpg"
    assert a.size == (64, 48)
    np.testing.assert_array_equal(a.boxes, np.array([[1, 2, 30, 40], [10.5, 4.25, 20.75, 30]], np.float32))
    assert a.class_names == ["dog", "cat"]
    assert a.truncated.tolist() == [True, False]
    assert a.difficult.tolist() == [False, True]
    assert a.occluded.tolist() == [False, True]
    assert index.verified.tolist() == [True, False]
    assert a.object_attributes == [{"pose": "Left"}, {}]
    assert index.boxes.dtype == np.float32 and index.labels.dtype == np.int32
    assert not index.problems


def test_single_object_file_and_single_xml_path(tmp_path):
    write_image(tmp_path / "one.jpg")
    (tmp_path / "one.xml").write_text(voc_xml("one.jpg", [voc_object("x", (1, 1, 9, 9))]))
    index = read_annotations(tmp_path / "one.xml")
    assert len(index) == 1 and index.num_objects == 1
    assert index.image(0).path == tmp_path / "one.jpg"


def test_layout_xml_next_to_images_recursive(tmp_path):
    for sub in ("a", "b/c"):
        write_image(tmp_path / sub / "img.png")
        (tmp_path / sub / "img.xml").write_text(voc_xml("img.png", [voc_object("k", (2, 2, 8, 8))]))
    index = read_annotations(tmp_path)
    assert sorted(index.relative_image_path(i) for i in range(len(index))) == ["a/img.png", "b/c/img.png"]


def test_layout_annotations_and_images_folders_with_subfolders(tmp_path):
    for sub in ("day", "night"):
        write_image(tmp_path / "images" / sub / "x.jpg")
        ann = tmp_path / "annotations" / sub
        ann.mkdir(parents=True)
        (ann / "x.xml").write_text(voc_xml("x.jpg", [voc_object("k", (2, 2, 8, 8))]))
    index = read_annotations(tmp_path)
    assert [index.relative_image_path(i) for i in range(2)] == [
        os.path.join("images", "day", "x.jpg"),
        os.path.join("images", "night", "x.jpg"),
    ]


def test_vocdevkit_with_one_year_and_splits(tmp_path):
    year = tmp_path / "VOCdevkit" / "VOC2007"
    files = {f"{i:04d}": voc_xml(f"{i:04d}.jpg", [voc_object("k", (1, 1, 5, 5))]) for i in range(4)}
    voc_dataset(year, files, splits={"train": ["0000", "0002"], "val": ["0001", "0003", "9999"]})
    (year / "ImageSets" / "Main" / "k_train.txt").write_text("0000  1\n0002 -1\n")
    index = read_annotations(tmp_path / "VOCdevkit")
    assert sorted(index.splits) == ["train", "val"]
    assert index.split("train").relative_image_path(1).endswith("0002.jpg")
    assert len(index.split("val")) == 2
    (mismatch,) = [p for p in index.problems if p.kind == "split_mismatch"]
    assert "9999" in mismatch.message and mismatch.file.endswith("val.txt")
    with pytest.raises(KeyError, match="split='test' not found; splits: train, val"):
        index.split("test")


def test_vocdevkit_with_two_years_is_refused(tmp_path):
    for year in ("VOC2007", "VOC2012"):
        voc_dataset(tmp_path / year, {"a": voc_xml("a.jpg")})
    with pytest.raises(ValueError, match="several VOC datasets"):
        read_annotations(tmp_path)


def test_filename_resolution_fallbacks(tmp_path):
    files = {
        "noext": voc_xml("noext", [voc_object("k", (1, 1, 5, 5))]),  # no extension
        "wrongext": voc_xml("wrongext.jpg", [voc_object("k", (1, 1, 5, 5))]),  # really a png
        "bypath": voc_xml("", [voc_object("k", (1, 1, 5, 5))], extra="<path>C:\\data\\bypath.bmp</path>"),
        "win": voc_xml("C:\\Users\\x\\win.jpg"),
    }
    root = voc_dataset(tmp_path, files, images=["noext.jpg", "wrongext.png", "bypath.bmp", "win.jpg"])
    index = read_annotations(root)
    assert not index.problems
    got = sorted(os.path.basename(index.relative_image_path(i)) for i in range(len(index)))
    assert got == ["bypath.bmp", "noext.jpg", "win.jpg", "wrongext.png"]


def test_missing_image_names_file_and_value(tmp_path):
    root = voc_dataset(tmp_path, {"a": voc_xml("ghost.jpg")}, images=[])
    (root / "JPEGImages").mkdir()
    with pytest.raises(AnnotationError) as err:
        read_annotations(root)
    text = str(err.value)
    assert "Annotations/a.xml" in text and "filename" in text and "ghost.jpg" in text
    assert err.value.problem.kind == "missing_image"
    index = read_annotations(root, on_error="skip")
    assert len(index) == 0 and _kinds(index) == {"missing_image": 1}
    index = read_annotations(root, check_images=False)
    assert len(index) == 1 and index.relative_image_path(0) == os.path.join("JPEGImages", "ghost.jpg")


def test_missing_or_zero_size_read_from_image_header(tmp_path):
    files = {
        "nosize": voc_xml("nosize.jpg", [voc_object("k", (1, 1, 50, 40))], size=None),
        "zero": voc_xml("zero.jpg", [voc_object("k", (1, 1, 50, 40))], size=(0, 0)),
    }
    root = voc_dataset(tmp_path, files, image_size=(80, 60))
    index = read_annotations(root)  # repairs never raise
    assert index.width.tolist() == [80, 80] and index.height.tolist() == [60, 60]
    problems = list(index.problems)
    assert [p.kind for p in problems] == ["missing_size", "missing_size"]
    assert all(p.severity == "repaired" and "80x60" in p.action for p in problems)
    assert "<size> is missing" in problems[0].message and "width='0'" in problems[1].message


@pytest.mark.parametrize(
    ("box", "kind", "message"),
    [
        ((12, 5, 10, 20), "empty_box", "xmax=10 <= xmin=12"),
        ((5, 20, 10, 20), "empty_box", "ymax=20 <= ymin=20"),
        (("nan", 5, 10, 20), "non_finite", "xmin=nan"),
        (("inf", 5, 10, 20), "non_finite", "xmin=inf"),
        (("abc", 5, 10, 20), "bad_value", "xmin='abc' is not a number"),
        (("", 5, 10, 20), "missing_field", "xmin is missing"),
        ((100, 100, 120, 120), "box_outside_image", "outside image width=64 height=48"),
    ],
)
def test_bad_boxes_are_reported_with_file_element_value(tmp_path, box, kind, message):
    objects = [voc_object("k", (1, 1, 5, 5)), voc_object("k", box)]
    root = voc_dataset(tmp_path, {"0001": voc_xml("0001.jpg", objects)})
    with pytest.raises(AnnotationError) as err:
        read_annotations(root)
    assert err.value.problem.kind == kind
    assert str(err.value).startswith("Annotations/0001.xml: object[2]/bndbox: ")
    assert message in str(err.value)
    index = read_annotations(root, on_error="skip")
    assert index.num_objects == 1 and _kinds(index) == {kind: 1}


def test_partly_outside_box_is_clipped_or_refused(tmp_path):
    root = voc_dataset(tmp_path, {"a": voc_xml("a.jpg", [voc_object("k", (-3, 10, 70, 20))])})
    index = read_annotations(root)
    np.testing.assert_array_equal(index.boxes, [[0, 10, 64, 20]])
    assert _kinds(index) == {"box_clipped": 1}
    with pytest.raises(AnnotationError, match="box_outside_image|outside image"):
        read_annotations(root, clip_boxes=False)


def test_one_based_conversion(tmp_path):
    root = voc_dataset(tmp_path, {"a": voc_xml("a.jpg", [voc_object("k", (1, 1, 64, 48))])})
    np.testing.assert_array_equal(read_annotations(root, one_based=True).boxes, [[0, 0, 64, 48]])


def test_warn_policy_emits_one_warning_and_keeps_the_rest(tmp_path):
    objects = [voc_object("k", (12, 5, 10, 20)), voc_object("k", (1, 1, 5, 5))]
    root = voc_dataset(tmp_path, {"a": voc_xml("a.jpg", objects), "b": voc_xml("b.jpg", objects)})
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        index = read_annotations(root, on_error="warn")
    relevant = [w for w in caught if issubclass(w.category, AnnotationWarning)]
    assert len(relevant) == 1 and "empty_box: 2" in str(relevant[0].message)
    assert relevant[0].filename == __file__  # the line that called read_annotations, not detloader's own
    assert index.num_objects == 2


def test_bad_arguments_echo_name_and_choices(tmp_path):
    root = voc_dataset(tmp_path, {"a": voc_xml("a.jpg")})
    with pytest.raises(ValueError, match=r"on_error='ignore' is not one of raise, skip, warn"):
        read_annotations(root, on_error="ignore")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"format='pascal' is not one of auto, (\w+, )*voc\b"):
        read_annotations(root, format="pascal")
    with pytest.raises(FileNotFoundError, match="does not exist"):
        read_annotations(tmp_path / "nope")
    with pytest.raises(ValueError, match="cache='yes'"):
        read_annotations(root, cache="yes")  # type: ignore[arg-type]


def test_unparseable_and_wrong_root_and_bad_flags(tmp_path):
    files = {
        "broken": "<annotation><filename>broken.jpg</filename><object>",
        "other": "<dataset><images/></dataset>",
        "flags": voc_xml("flags.jpg", [voc_object("k", (1, 1, 5, 5), difficult="maybe")]),
    }
    root = voc_dataset(tmp_path, files)
    index = read_annotations(root, on_error="skip")
    by_kind = {p.kind: p for p in index.problems}
    assert by_kind["unparseable"].file == os.path.join("Annotations", "broken.xml")
    assert by_kind["unparseable"].element.startswith("line ")
    assert "<dataset>" in by_kind["unsupported"].message
    assert by_kind["bad_value"].message == "difficult='maybe' is not 0/1"
    assert len(index) == 1 and index.num_objects == 1


def test_duplicate_image_keeps_first_annotation(tmp_path):
    files = {
        "a": voc_xml("same.jpg", [voc_object("k", (1, 1, 5, 5))]),
        "b": voc_xml("same.jpg", [voc_object("k", (2, 2, 6, 6)), voc_object("k", (1, 1, 3, 3))]),
    }
    root = voc_dataset(tmp_path, files, images=["same.jpg"])
    with pytest.raises(AnnotationError, match="b.xml: filename: image .*same.jpg.* already annotated by .*a.xml"):
        read_annotations(root)
    index = read_annotations(root, on_error="skip")
    assert len(index) == 1 and index.num_objects == 1
    np.testing.assert_array_equal(index.boxes, [[1, 1, 5, 5]])


def test_class_list_and_class_map(tmp_path):
    objects = [
        voc_object("Hund", (1, 1, 5, 5)),
        voc_object("dog", (1, 1, 5, 5)),
        voc_object("Katze", (1, 1, 5, 5)),
        voc_object("junk", (1, 1, 5, 5)),
        voc_object("bird", (1, 1, 5, 5)),
    ]
    root = voc_dataset(tmp_path, {"a": voc_xml("a.jpg", objects)})
    index = read_annotations(
        root,
        classes=["dog", "cat"],
        class_map={"Hund": "dog", "Katze": "cat", "junk": None},
        on_error="skip",
    )
    assert index.classes == ("dog", "cat")
    assert index.labels.tolist() == [0, 0, 1]
    (unknown,) = index.problems
    assert unknown.kind == "unknown_class" and unknown.element == "object[5]/name" and "'bird'" in unknown.message
    assert index.meta["stats"]["dropped_by_class_map"] == 1
    with pytest.raises(ValueError, match="holds a name twice"):
        read_annotations(root, classes=["dog", "dog"])


def test_unicode_class_names_and_encodings(tmp_path):
    xml = voc_xml("a.jpg", [voc_object("狗", (1, 1, 5, 5))])
    root = voc_dataset(tmp_path, {"a": "x"})
    (root / "Annotations" / "a.xml").write_bytes(('<?xml version="1.0" encoding="gbk"?>' + xml).encode("gbk"))
    index = read_annotations(root, class_map={"狗": "dog"})
    assert index.classes == ("dog",)


def test_keypoint_dialect_named(tmp_path):
    first = [("nose", 20, 20, 2), ("left_eye", 10, 10, 1), ("right_eye", 30, 10, 0), ("left_mouth", 12, 30, 2)]
    second = [("right_mouth", 25, 30, 2)]
    objects = [
        voc_object("face", (5, 5, 40, 40), extra=keypoints_xml(first)),
        voc_object("face", (5, 5, 40, 40), extra=keypoints_xml(second)),
    ]
    root = voc_dataset(tmp_path, {"a": voc_xml("a.jpg", objects)})
    index = read_annotations(root)
    assert index.landmark_schema == FACE5  # exactly FACE5's names: its order, not the file's
    lm, vis = index.landmarks[0], index.visibility[0]
    assert vis.tolist() == [1, 0, 2, 2, 0]
    np.testing.assert_array_equal(lm[[0, 2, 3]], [[10, 10], [20, 20], [12, 30]])
    np.testing.assert_array_equal(lm[[1, 4]], 0)
    assert index.visibility[1].tolist() == [0, 0, 0, 0, 2]


def test_keypoint_names_subset_keep_their_own_order(tmp_path):
    pts = [("nose", 20, 20, 2), ("left_eye", 10, 10, 2), ("right_eye", 30, 10, 2)]
    obj = voc_object("face", (5, 5, 40, 40), extra=keypoints_xml(pts))
    index = read_annotations(voc_dataset(tmp_path, {"a": voc_xml("a.jpg", [obj])}))
    assert index.landmark_schema.names == ("nose", "left_eye", "right_eye")
    assert index.landmark_schema.flip_pairs == ((1, 2),)


def test_keypoint_dialect_child_elements_and_custom_names(tmp_path):
    kp = (
        "<keypoints><keypoint><name>tail</name><x>3</x><y>4</y></keypoint>"
        "<keypoint><name>l_ear</name><x>5</x><y>6</y><visible>false</visible></keypoint>"
        "<keypoint><name>r_ear</name><x>7</x><y>8</y></keypoint></keypoints>"
    )
    root = voc_dataset(tmp_path, {"a": voc_xml("a.jpg", [voc_object("cat", (1, 1, 20, 20), extra=kp)])})
    index = read_annotations(root)
    assert index.landmark_schema.names == ("tail", "l_ear", "r_ear")
    assert index.landmark_schema.flip_pairs == ((1, 2),)
    assert index.visibility[0].tolist() == [2, 1, 2]


def test_retinaface_lm_dialect(tmp_path):
    coords = [(10, 11), (30, 11), (20, 20), (-1, -1), (28, 30)]
    lm = "<lm>" + "".join(f"<x{i}>{x}</x{i}><y{i}>{y}</y{i}>" for i, (x, y) in enumerate(coords, 1)) + "</lm>"
    with_lm = voc_object("face", (5, 5, 40, 40), extra=f"<has_lm>1</has_lm>{lm}")
    without = voc_object("face", (5, 5, 40, 40), extra="<has_lm>0</has_lm>")
    root = voc_dataset(tmp_path, {"a": voc_xml("a.jpg", [with_lm, without])})
    index = read_annotations(root)
    assert index.landmark_schema == FACE5
    assert index.visibility.tolist() == [[2, 2, 2, 0, 2], [0, 0, 0, 0, 0]]
    np.testing.assert_array_equal(index.landmarks[0, 4], [28, 30])


def test_comma_list_dialect_with_and_without_schema(tmp_path):
    obj = voc_object("face", (5, 5, 40, 40), extra="<keypoints>10,11, 30,11,-1,-1</keypoints>")
    root = voc_dataset(tmp_path, {"a": voc_xml("a.jpg", [obj])})
    index = read_annotations(root)
    assert index.landmark_schema.names == ("p0", "p1", "p2")
    assert index.visibility.tolist() == [[2, 2, 0]]
    schema = LandmarkSchema.from_names(["left_eye", "right_eye", "chin"])
    index = read_annotations(root, landmark_schema=schema)
    assert index.landmark_schema.flip_pairs == ((0, 1),)
    with pytest.raises(AnnotationError, match=r"object\[1\]/keypoints: 3 points, landmark schema has 5"):
        read_annotations(root, landmark_schema=FACE5)


def test_landmark_outside_image_keeps_slot_with_visibility_zero(tmp_path):
    pts = [("left_eye", 10, 10, 2), ("right_eye", 99, 10, 2)]
    root = voc_dataset(tmp_path, {"a": voc_xml("a.jpg", [voc_object("f", (1, 1, 40, 40), extra=keypoints_xml(pts))])})
    with pytest.raises(
        AnnotationError, match=r"object\[1\]/keypoints/keypoint\[2\]: right_eye: x=99 y=10 outside image width=64"
    ):
        read_annotations(root)
    index = read_annotations(root, on_error="skip")
    assert index.visibility.tolist() == [[2, 0]] and index.num_objects == 1


def test_unknown_landmark_name_with_schema(tmp_path):
    pts = [("left_eye", 10, 10, 2), ("ear", 12, 10, 2)]
    root = voc_dataset(tmp_path, {"a": voc_xml("a.jpg", [voc_object("f", (1, 1, 40, 40), extra=keypoints_xml(pts))])})
    index = read_annotations(root, landmark_schema=FACE5, on_error="skip")
    assert [p.kind for p in index.problems] == ["unknown_landmark"]
    assert index.visibility.tolist() == [[2, 0, 0, 0, 0]]


def test_attributes_on_objects_and_image_with_image_class(tmp_path):
    img_attrs = (
        "<attributes><attribute><name>class</name><value>indoor</value></attribute>"
        "<attribute><name>weather</name><value>rain</value></attribute></attributes>"
    )
    obj_attrs = "<attributes><attribute><name>age</name><value>child</value></attribute></attributes>"
    files = {
        "a": voc_xml("a.jpg", [voc_object("f", (1, 1, 9, 9), extra=obj_attrs)], extra=img_attrs),
        "b": voc_xml("b.jpg", [voc_object("f", (1, 1, 9, 9))]),
    }
    index = read_annotations(voc_dataset(tmp_path, files))
    assert index.image_classes == ("indoor",)
    assert index.image_labels.tolist() == [0, MISSING]
    assert index.image(0).image_class == "indoor" and index.image(1).image_class is None
    assert index.image(0).attributes == {"weather": "rain"}
    assert index.image(0).object_attributes == [{"age": "child"}]
    assert index.attribute_counts("age") == {"child": 1}
    assert read_annotations(tmp_path, image_class_attribute="weather").image_classes == ("rain",)


def test_empty_dataset_and_images_without_objects(tmp_path):
    root = voc_dataset(tmp_path, {"a": voc_xml("a.jpg"), "b": voc_xml("b.jpg")})
    index = read_annotations(root)
    assert len(index) == 2 and index.num_objects == 0
    assert index.boxes.shape == (0, 4) and index.landmarks.shape == (0, 0, 2)
    assert index.image(1).boxes.shape == (0, 4)
    empty = tmp_path / "empty"
    (empty / "Annotations").mkdir(parents=True)
    assert len(read_annotations(empty)) == 0


def test_public_api_names():
    for name in detloader.__all__:
        assert hasattr(detloader, name), name


def test_listing_names_only_finds_what_a_stamped_listing_finds(tmp_path):
    """The image folder is listed without a stat per file: same files, same problems."""
    import os

    from detloader.annotations.readers.common import scan_files

    images = tmp_path / "JPEGImages"
    (images / "sub").mkdir(parents=True)
    for name in ("a.jpg", "sub/b.JPG", "c.txt"):
        (images / name).write_bytes(b"x")
    os.mkfifo(images / "pipe.jpg")
    (images / "link.jpg").symlink_to(images / "a.jpg")
    (images / "dangling.jpg").symlink_to(tmp_path / "gone.jpg")
    found: dict[bool, tuple] = {}
    for stamps in (True, False):
        problems: list = []
        listed = scan_files(images, (".jpg",), root=tmp_path, problems=problems, stamps=stamps)
        found[stamps] = ([rel for rel, *_ in listed], [(p.kind, p.file) for p in problems])
        assert all(entry[1:] == (0, 0, 0, 0) for entry in listed) != stamps
    assert found[True] == found[False]
    assert found[False][0] == ["JPEGImages/a.jpg", "JPEGImages/link.jpg", "JPEGImages/sub/b.JPG"]
    assert sorted(found[False][1]) == [("not_a_regular_file", "JPEGImages/pipe.jpg"),
                                       ("unreadable_file", "JPEGImages/dangling.jpg")]


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.lists(st.sampled_from(["a", "ab", "b", "a.b", "ba", ".a", "a\nb"]), min_size=1, max_size=3),
             max_size=12),
    st.sets(st.sampled_from(["a", "ab", "b", ".", "a.", "ba", "x"]), max_size=10),
)
def test_named_like_is_a_startswith_per_file(parts, starts):
    """The text search for files whose name starts with a given stem equals a ``startswith``
    per file, whatever the folders, dots, newlines and number of stems."""
    files = sorted({os.sep.join(p) for p in parts})
    expected = [rel for rel in files if rel.rpartition(os.sep)[2].startswith(tuple(starts))] if starts else []
    assert _named_like(files, starts) == expected
