"""The Open Images reader (annotations/readers/openimages.py) on files written by the tests."""

from __future__ import annotations

import json

import numpy as np
import pytest
from helpers import OI_BOXES_HEADER, OI_LABELS_HEADER, oi_case, write_image, write_oi_case, write_rows

import detloader
from detloader.annotations.read import detect_format
from detloader.annotations.writers import write_annotations


def box(image, mid, x0, x1, y0, y1, occluded=0, truncated=0, group=0, depiction=0, inside=0):
    return (image, "xclick", mid, 1, x0, x1, y0, y1, occluded, truncated, group, depiction, inside)


def dataset(tmp_path, boxes, labels=(), classes=(("/m/car", "Car"), ("/m/dog", "Dog")), split="validation",
            sizes=None):
    """Boxes, labels and V6 class descriptions (no header) of one split, images of 200 x 100."""
    write_rows(tmp_path / f"{split}-annotations-bbox.csv", OI_BOXES_HEADER, boxes)
    if labels:
        write_rows(tmp_path / f"{split}-annotations-human-imagelabels-boxable.csv", OI_LABELS_HEADER, labels)
    write_rows(tmp_path / "class-descriptions-boxable.csv", None, classes)
    for image in {r[0] for r in [*boxes, *labels]}:
        write_image(tmp_path / split / f"{image}.jpg", (sizes or {}).get(image, (200, 100)))
    return tmp_path


def test_reads_boxes_flags_labels_and_hierarchy(tmp_path):
    case = oi_case(0)
    write_oi_case(tmp_path, case)
    for image, size in case["sizes"].items():
        write_image(tmp_path / "validation" / f"{image}.jpg", size)
    assert detect_format(tmp_path) == "openimages"  # predictions.csv (with Score) is not taken for boxes
    index = detloader.read_annotations(tmp_path, cache=False)
    assert index.classes == tuple(case["names"]) and len(index) == len(case["sizes"])
    assert list(index.splits) == ["val"] and len(index.split("val")) == len(index)
    assert index.meta["mids"]["Car"] == "/m/c1"
    hierarchy = index.meta["hierarchy"]
    assert hierarchy["Car"] == ["Toy", "Vehicle"] and hierarchy["Minibus"] == ["Bus", "Vehicle"]
    rows = list(case["boxes"])
    order = {image: i for i, image in enumerate(sorted(case["sizes"]))}
    rows.sort(key=lambda r: order[r[0]])  # the file's order: by ImageID
    w = np.array([case["sizes"][r[0]][0] for r in rows])
    h = np.array([case["sizes"][r[0]][1] for r in rows])
    expected = np.stack([[r[4] for r in rows] * w, [r[6] for r in rows] * h, [r[5] for r in rows] * w,
                         [r[7] for r in rows] * h], axis=1)
    np.testing.assert_allclose(index.boxes, expected, rtol=1e-6)
    np.testing.assert_array_equal(index.crowd, [bool(r[10]) for r in rows])
    np.testing.assert_array_equal(index.occluded, [bool(r[8]) for r in rows])
    names = dict(zip(case["mids"], case["names"]))
    for i, image in enumerate(sorted(case["sizes"])):
        for kind, confidence in (("present", 1), ("absent", 0)):
            want = sorted(index.classes.index(names[r[2]]) for r in case["labels"]
                          if r[0] == image and r[3] == confidence)
            assert index.class_list(kind, i).tolist() == want


def test_bad_rows_are_problems_naming_file_line_and_value(tmp_path):
    boxes = [
        box("a", "/m/car", 0.1, 0.5, 0.1, 0.5, group=1, depiction=1),
        box("a", "/m/cat", 0.1, 0.5, 0.1, 0.5),  # line 3: no such class
        box("a", "/m/dog", "x", 0.5, 0.1, 0.5),  # line 4
        box("b", "/m/dog", 0.1, 0.5, 0.1, 0.5, occluded=7),  # line 5
        ("b", "xclick", "/m/dog", 1, 0.1),  # line 6: 5 values
        box("b", "/m/dog", 0.2, 0.6, 0.2, 0.6, truncated=-1),
    ]
    labels = [("a", "verification", "/m/dog", "0"), ("a", "verification", "/m/car", "0.5"),
              ("b", "verification", "/m/zebra", "1")]
    index = detloader.read_annotations(dataset(tmp_path, boxes, labels), cache=False, on_error="skip")
    found = {(p.file, p.element): p.message for p in index.problems}
    boxes_csv, labels_csv = "validation-annotations-bbox.csv", "validation-annotations-human-imagelabels-boxable.csv"
    assert found == {
        (boxes_csv, "line 3/LabelName"): "LabelName='/m/cat' is not in class-descriptions-boxable.csv",
        (boxes_csv, "line 4/XMin"): found[(boxes_csv, "line 4/XMin")],
        (boxes_csv, "line 5/IsOccluded"): "IsOccluded='7' is not 0, 1 or -1",
        (boxes_csv, "line 6"): "5 values, the header names 13: 'b,xclick,/m/dog,1,0.1'",
        (labels_csv, "line 3/Confidence"): "Confidence='0.5' is not 0 or 1",
    }
    assert "'x'" in found[(boxes_csv, "line 4/XMin")]
    assert len(index) == 2 and index.labels.tolist() == [0, 1, 1]
    assert index.crowd.tolist() == [True, False, False] and index.truncated.tolist() == [False] * 3
    np.testing.assert_allclose(index.boxes[0], [20, 10, 100, 50])
    assert index.class_list("absent", 0).tolist() == [1]
    assert index.meta["stats"] == {"labels_of_undescribed_classes": 1, "unknown_flag_values": 1}
    depiction = dict(index.vocab.object_attributes)["depiction"]
    assert depiction[index.object_attributes[0, 0]] == "1"


def test_a_file_out_of_image_order_stops_with_a_named_problem(tmp_path):
    boxes = [box("b", "/m/car", 0.1, 0.5, 0.1, 0.5), box("a", "/m/car", 0.1, 0.5, 0.1, 0.5)]
    with pytest.raises(ValueError, match=r"line 3/ImageID: ImageID='a' comes after 'b' \(line 2\)"):
        detloader.read_annotations(dataset(tmp_path, boxes), cache=False)


def test_a_display_name_of_two_classes_is_named_with_their_mids(tmp_path):
    classes = [("/m/bat1", "Bat"), ("/m/bat2", "Bat"), ("/m/dog", "Dog")]
    boxes = [box("a", "/m/bat2", 0.1, 0.5, 0.1, 0.5)]
    index = detloader.read_annotations(dataset(tmp_path, boxes, classes=classes), cache=False, on_error="skip")
    assert index.classes == ("Bat (/m/bat1)", "Bat (/m/bat2)", "Dog") and index.labels.tolist() == [1]
    assert [str(p) for p in index.problems] == [
        "class-descriptions-boxable.csv: line 1/DisplayName: DisplayName='Bat' also names /m/bat2 (line 2) "
        "(class named 'Bat (/m/bat1)')",
        "class-descriptions-boxable.csv: line 2/DisplayName: DisplayName='Bat' also names /m/bat1 (line 1) "
        "(class named 'Bat (/m/bat2)')",
    ]
    assert index.meta["mids"] == {"Bat (/m/bat1)": "/m/bat1", "Bat (/m/bat2)": "/m/bat2", "Dog": "/m/dog"}


def test_splits_pair_boxes_and_labels_and_labels_alone_are_read_when_the_image_is_there(tmp_path):
    dataset(tmp_path, [box("a", "/m/car", 0.1, 0.5, 0.1, 0.5)], [("a", "x", "/m/car", 1), ("c", "x", "/m/dog", 0),
                                                               ("d", "x", "/m/dog", 0)], split="train")
    (tmp_path / "train" / "d.jpg").unlink()  # labels of an image that is not here: counted, no problem
    dataset(tmp_path, [box("b", "/m/dog", 0.1, 0.5, 0.1, 0.5)], split="validation")
    index = detloader.read_annotations(tmp_path, cache=False)
    assert index.image_paths() == ["train/a.jpg", "train/c.jpg", "validation/b.jpg"]
    assert {k: v.tolist() for k, v in index.splits.items()} == {"train": [0, 1], "val": [2]}
    assert index.class_list("absent", 1).tolist() == [1] and not index.problems
    assert index.meta["stats"] == {"labels_of_images_not_found": 1}
    assert "hierarchy" not in index.meta  # no hierarchy file: classes scored flat


def test_group_of_boxes_convert_to_coco_crowd(tmp_path):
    data = dataset(tmp_path / "oi", [box("a", "/m/car", 0.1, 0.5, 0.1, 0.5, group=1),
                                     box("a", "/m/dog", 0.5, 0.9, 0.2, 0.8)])
    index = detloader.read_annotations(data, cache=False)
    out = write_annotations(index, tmp_path / "coco", "coco", images="copy")
    written = json.loads(next(out.rglob("*.json")).read_text() if out.is_dir() else out.read_text())
    assert [(a["iscrowd"], a["bbox"]) for a in written["annotations"]] == [(1, [20.0, 10.0, 80.0, 40.0]),
                                                                         (0, [100.0, 20.0, 80.0, 60.0])]
    back = detloader.read_annotations(out, cache=False)
    assert back.crowd.tolist() == [True, False] and back.classes == index.classes


def test_the_hierarchy_follows_class_map_and_a_bad_node_is_named(tmp_path):
    classes = [("/m/veh", "Vehicle"), ("/m/car", "Car"), ("/m/van", "Van")]
    data = dataset(tmp_path, [box("a", "/m/car", 0.1, 0.5, 0.1, 0.5), box("a", "/m/van", 0.5, 0.9, 0.1, 0.5)],
                   classes=classes)
    tree = {"LabelName": "/m/0bl9f", "Subcategory": [{"LabelName": "/m/veh", "Subcategory": [
        {"LabelName": "/m/car"}, {"LabelName": "/m/van"}]}]}
    (data / "bbox_labels_600_hierarchy.json").write_text(json.dumps(tree))
    index = detloader.read_annotations(data, cache=False, class_map={"Car": "Auto", "Van": None})
    assert index.classes == ("Vehicle", "Auto") and index.meta["hierarchy"] == {"Auto": ["Vehicle"]}
    assert index.meta["mids"] == {"Vehicle": "/m/veh", "Auto": "/m/car"}
    tree["Subcategory"][0]["Subcategory"].append({"Name": "x"})
    (data / "bbox_labels_600_hierarchy.json").write_text(json.dumps(tree))
    with pytest.raises(ValueError, match=r"bbox_labels_600_hierarchy.json: node \{'Name': 'x'\} has no LabelName"):
        detloader.read_annotations(data, cache=False)


def test_fiftyone_layout(tmp_path):
    write_rows(tmp_path / "labels" / "detections.csv", OI_BOXES_HEADER, [box("a", "/m/car", 0.1, 0.5, 0.1, 0.5)])
    write_rows(tmp_path / "labels" / "classifications.csv", OI_LABELS_HEADER, [("a", "x", "/m/dog", 0)])
    write_rows(tmp_path / "labels" / "segmentations.csv", "MaskPath,ImageID,LabelName,BoxID,BoxXMin,BoxXMax", [])
    write_rows(tmp_path / "metadata" / "classes.csv", None, [("/m/car", "Car"), ("/m/dog", "Dog")])
    (tmp_path / "metadata" / "hierarchy.json").write_text(json.dumps({"LabelName": "/m/0bl9f", "Subcategory": [
        {"LabelName": "/m/car"}, {"LabelName": "/m/dog"}]}))
    write_image(tmp_path / "data" / "a.jpg")
    index = detloader.read_annotations(tmp_path, cache=False)
    assert index.image_paths() == ["data/a.jpg"] and index.classes == ("Car", "Dog")
    assert index.class_list("absent", 0).tolist() == [1] and index.meta["hierarchy"] == {}


def test_an_annotations_folder_is_looked_in_unless_it_holds_voc_xml(tmp_path):
    """The boxes CSV in an annotations/ folder is found; one beside VOC's XML files in
    Annotations/ is not (that folder is VOC's, as COCO's detection takes it too)."""
    oi = tmp_path / "oi"
    dataset(oi / "annotations", [box("a", "/m/car", 0.1, 0.5, 0.1, 0.5)])
    assert detect_format(oi) == "openimages"
    assert detect_format(oi / "annotations") == "openimages"
    (oi / "annotations" / "a.xml").write_text("<annotation/>")
    assert detect_format(oi / "annotations") == "openimages"  # the folder itself, named
    assert detect_format(oi) == "voc"
