"""Faults of the inputs (issue 44, families 1, 2, 3, 5 and 9): names that are not UTF-8, COCO
values that break the columns, YOLO label lines and data.yaml bombs, hostile predictions and
absurd worker counts. Each ends with the right result or a named problem or error."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest
from helpers import voc_dataset, voc_object, voc_xml, write_image

from detloader import AnnotationError, DetectionDataset, read_annotations
from detloader.annotations.readers import coco as coco_reader
from detloader.annotations.readers.yolo_config import expanded_values
from detloader.errors import PredictionError, YoloConfigError
from detloader.train.metrics import as_predictions, score_predictions

# -- 1. names that are not UTF-8 --------------------------------------------------------------
ODD = os.fsdecode(b"a\xffb")  # how Python names a file whose name holds the byte 0xff


def _yolo_dataset(root: Path, stems: list[str]) -> Path:
    (root / "labels" / "train").mkdir(parents=True)
    (root / "data.yaml").write_text("path: .\ntrain: images/train\nnames: [cat, dog]\n")
    for stem in stems:
        write_image(root / "images" / "train" / f"{stem}.jpg")
        (root / "labels" / "train" / f"{stem}.txt").write_text("0 0.5 0.5 0.2 0.2\n")
    return root


def _voc_odd(root: Path) -> Path:
    # VOC XML is UTF-8: the odd image is found by its annotation file's stem (no <filename>)
    files = {
        ODD: voc_xml("", [voc_object("cat", (1, 2, 30, 40))]),
        "ok": voc_xml("ok.jpg", [voc_object("dog", (1, 2, 30, 40))]),
    }
    return voc_dataset(root, files)


@pytest.mark.parametrize("fmt", ["voc", "yolo"])
@pytest.mark.parametrize("folder", ["plain", os.fsdecode(b"set\xfe")])
@pytest.mark.parametrize("beside", [False, True], ids=["cache-dir", "cache-beside"])
def test_names_not_utf8_read_cold_and_cached(tmp_path, monkeypatch, fmt, folder, beside):
    if beside:  # the cache in the dataset's own (odd) folder, its record in the user cache
        monkeypatch.delenv("DETLOADER_CACHE_DIR")
    root = tmp_path / folder
    _voc_odd(root) if fmt == "voc" else _yolo_dataset(root, [ODD, "ok"])
    odd_image = root / ("JPEGImages" if fmt == "voc" else "images/train") / f"{ODD}.jpg"
    for _ in ("cold", "cached"):
        index = read_annotations(root, on_error="raise")
        paths = [index.image_path(i) for i in range(len(index))]
        assert odd_image in paths and all(p.is_file() for p in paths)
        assert os.fsencode(odd_image) in [os.fsencode(p) for p in paths]  # the exact bytes
        annotation = index.annotation_path(paths.index(odd_image))
        assert os.fsencode(annotation).endswith(b"a\xffb." + (b"xml" if fmt == "voc" else b"txt"))
        assert not list(index.problems)
    assert type(index).__name__ == "MappedIndex"  # the second read came from the cache
    ds = DetectionDataset(index)
    assert [tuple(ds[i].image.shape) for i in range(len(ds))] == [(3, 48, 64)] * 2


@pytest.mark.filterwarnings("ignore:.*no val split")
@pytest.mark.parametrize("fmt", ["voc", "coco", "yolo"])
def test_writing_a_name_that_is_not_utf8_as_text_is_refused_before_anything_is_written(tmp_path, fmt):
    from detloader.annotations.writers.export import write_annotations

    index = read_annotations(_voc_odd(tmp_path / "src"))
    index.splits["train"] = np.arange(len(index))  # YOLO writes split lists: names as text
    out = tmp_path / "out"
    with pytest.raises(ValueError, match=r"a\\xffb.jpg': the image's name is not UTF-8 \(1 of 2 images so named\)"):
        write_annotations(index, out, fmt)
    assert not out.exists()
    odd_folder = read_annotations(voc_dataset(tmp_path / os.fsdecode(b"set\xfe"), {"x": voc_xml("x.jpg")}))
    written = write_annotations(odd_folder, out, fmt)  # the folder's name is not written: fine
    assert len(read_annotations(written)) == 1


# -- 2. COCO values that break the columns ----------------------------------------------------
def _coco(root: Path, data: dict) -> Path:
    for name in ("a.jpg", "b.jpg"):
        write_image(root / "images" / name)
    path = root / "annotations.json"
    path.write_text(json.dumps(data))
    return path


_IMAGES = [
    {"id": 1, "file_name": "a.jpg", "width": 64, "height": 48},
    {"id": 2, "file_name": "b.jpg", "width": 64, "height": 48},
]
_OBJECTS = [
    {"id": 7, "image_id": 1, "category_id": 1, "bbox": [1, 1, 10, 10]},
    {"id": 8, "image_id": 2, "category_id": 1, "bbox": [2, 2, 10, 10]},
]
_CATS = [{"id": 1, "name": "cat"}]


@pytest.fixture(params=["fast", "general"])
def coco_path(request, monkeypatch):
    """Both COCO paths: the typed fast one, and the general one (forced)."""
    if request.param == "general":
        monkeypatch.setattr(coco_reader, "parse_fast", lambda *a: False)
    return request.param


def _coco_read(path: Path):
    return read_annotations(path, cache=False, on_error="skip")


@pytest.mark.parametrize("huge", [2**70, -(2**63) - 1, 1e30])
def test_coco_image_id_beyond_64_bits_is_named(tmp_path, coco_path, huge):
    images = [dict(_IMAGES[0], id=huge), _IMAGES[1]]
    objects = [dict(_OBJECTS[0], image_id=huge), _OBJECTS[1]]
    index = _coco_read(_coco(tmp_path, {"images": images, "annotations": objects, "categories": _CATS}))
    assert len(index) == 1 and index.num_objects == 1
    shown = [str(p) for p in index.problems]
    assert shown[0] == (
        f"annotations.json: images[0]/id: id={huge!r} is outside the 64-bit integer range (image skipped)"
    )
    assert shown[1].startswith(f"annotations.json: annotations[0]/image_id: image_id={huge!r} is outside")
    with pytest.raises(AnnotationError, match=r"images\[0\]/id: id=1180591620717411303424"):
        read_annotations(_coco(tmp_path / "r", {"images": [dict(_IMAGES[0], id=2**70)]}), cache=False)


@pytest.mark.parametrize("objects", [_OBJECTS, []])
def test_coco_file_without_images_is_named(tmp_path, coco_path, objects):
    path = _coco(tmp_path, {"annotations": objects, "categories": _CATS})
    index = _coco_read(path)
    assert len(index) == 0
    assert [str(p) for p in index.problems] == [
        "annotations.json: images: images is missing (keys: annotations, categories) (file skipped)"
    ]
    with pytest.raises(AnnotationError, match="images is missing"):
        read_annotations(path, cache=False)


def test_coco_empty_images_with_objects_names_each_object(tmp_path, coco_path):
    index = _coco_read(_coco(tmp_path, {"images": [], "annotations": _OBJECTS, "categories": _CATS}))
    assert len(index) == 0
    assert [p.element for p in index.problems] == ["annotations[0]/image_id", "annotations[1]/image_id"]


def test_coco_repeated_annotation_ids_are_named_with_both_positions(tmp_path, coco_path):
    objects = [_OBJECTS[0], dict(_OBJECTS[1], id=7), dict(_OBJECTS[0]), {**_OBJECTS[1], "id": 9}]
    index = _coco_read(_coco(tmp_path, {"images": _IMAGES, "annotations": objects, "categories": _CATS}))
    assert index.num_objects == 3  # the exact copy (annotations[2]) counts once
    assert [str(p) for p in index.problems] == [
        "annotations.json: annotations[1]/id: id=7 repeats annotations[0] for another object (object kept)",
        "annotations.json: annotations[2]/id: id=7 repeats annotations[0], the same object again (object skipped)",
    ]
    assert {p.severity for p in index.problems} == {"repaired"}


@pytest.mark.parametrize("name", [{"x": 1}, ["a", "b"], True, 1.5])
def test_coco_category_name_that_is_not_text_is_named(tmp_path, coco_path, name):
    cats = [{"id": 1, "name": name}, {"id": 2, "name": "dog"}]
    objects = [_OBJECTS[0], dict(_OBJECTS[1], category_id=2)]
    index = _coco_read(_coco(tmp_path, {"images": _IMAGES, "annotations": objects, "categories": cats}))
    assert index.classes == ("dog",) and index.num_objects == 1
    shown = [str(p) for p in index.problems]
    assert shown[0] == f"annotations.json: categories[0]/name: name={name!r} is not a text (category skipped)"
    assert "annotations[0]/category_id: category_id=1 is not in categories" in shown[1]


# -- 3. YOLO: lines with extra values, data.yaml that expands ---------------------------------
@pytest.mark.parametrize(
    ("line", "expected"),
    [
        (
            "0 0.5 0.5 0.2 0.2 0.4 0.4",
            "labels/train/a.txt: line 2: 6 values after the class and no kpt_shape: a segment of 3 points "
            "(2 lines of this file) (boxed by the extent of its points; keypoints need kpt_shape in data.yaml)",
        ),
        (
            "0 0.5 0.5 0.2 0.2 0.4 0.4 2",
            "labels/train/a.txt: line 2: 7 values after the class: not cx cy w h nor a segment's x y pairs "
            "(keypoints need kpt_shape in data.yaml) (object skipped)",
        ),
    ],
)
def test_yolo_line_with_extra_values_and_no_kpt_shape_is_named(tmp_path, line, expected):
    root = _yolo_dataset(tmp_path / "d", ["a"])
    (root / "labels" / "train" / "a.txt").write_text(f"0 0.5 0.5 0.2 0.2\n{line}\n{line}\n")
    index = read_annotations(root, on_error="skip", cache=False)
    shown = [str(p) for p in index.problems]
    assert shown[0] == expected
    assert len(shown) == (1 if "segment of" in expected else 2)  # a segment: once per file


def _bomb(levels: int) -> str:
    lines = ['a: &a ["x", "x", "x", "x", "x", "x", "x", "x", "x"]']
    for prev, name in zip("abcdefghij", "bcdefghijk"[: levels - 1]):
        lines.append(f"{name}: &{name} [{', '.join(['*' + prev] * 9)}]")
    return "\n".join(lines) + f"\nnames: *{'abcdefghijk'[levels - 1]}\ntrain: images/train\n"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (_bomb(8), "data.yaml: expands to more than 1,000,000 values through YAML aliases"),  # 9**8 values
        (_bomb(10), "data.yaml: expands to more than 1,000,000 values through YAML aliases"),
        ("names: &a [x, *a]\ntrain: images/train\n", "data.yaml: a YAML alias .* refers to a value that holds it"),
        ("names: [cat, [dog, cow]]\ntrain: images/train\n", r"data.yaml: names\[1\] is a list, not a class name"),
        ("names: " + "[" * 20000 + "]" * 20000 + "\n", "data.yaml: not readable YAML: nested too deeply"),
    ],
    ids=["aliases-9**8", "aliases-9**10", "self", "nested-name", "deep"],
)
def test_yolo_data_yaml_that_expands_is_refused_by_name(tmp_path, text, message):
    root = _yolo_dataset(tmp_path / "d", ["a"])
    (root / "data.yaml").write_text(text)
    assert len(text) < 1024 or "[[[" in text
    with pytest.raises(YoloConfigError, match=message):
        read_annotations(root, cache=False)


def test_yolo_data_yaml_with_a_few_aliases_still_reads(tmp_path):
    root = _yolo_dataset(tmp_path / "d", ["a"])
    (root / "data.yaml").write_text("base: &n [cat, dog]\nnames: *n\ntrain: &t images/train\nval: *t\n")
    index = read_annotations(root, cache=False)
    assert index.classes == ("cat", "dog") and len(index) == 1


def test_expanded_values_counts_without_expanding():
    shared = ["x"] * 10
    # the dict, its key, the outer list and two copies of a list of 10
    assert expanded_values({"a": [shared, shared]}, 100) == 1 + 1 + 1 + 2 * 11
    assert expanded_values([shared] * 1000, 50) == 51  # stops just over the cap
    loop: list = []
    loop.append(loop)
    assert expanded_values({"k": loop}, 100) == -1


# -- 5. predictions that cannot be scored -----------------------------------------------------
@pytest.fixture
def two_images(tmp_path):
    files = {
        "a": voc_xml("a.jpg", [voc_object("cat", (10, 10, 30, 30))]),
        "b": voc_xml("b.jpg", [voc_object("cat", (5, 5, 25, 25))]),
    }
    return read_annotations(voc_dataset(tmp_path / "voc", files), cache=False)


_HIT = {"boxes": [[10, 10, 30, 30]], "scores": [0.9], "labels": [0]}


@pytest.mark.parametrize("image_id", [0.7, True, "0.5", [0], np.float64(1.5), np.array([0, 1])])
def test_prediction_image_id_that_is_no_integer_is_named(two_images, image_id):
    with pytest.raises(PredictionError, match=r"image_id=.* is not an integer image id"):
        score_predictions([dict(_HIT, image_id=image_id)], two_images)
    with pytest.raises(PredictionError, match=r"image_id=0.7 is not an integer image id"):
        score_predictions({0.7: _HIT}, two_images)  # the key, too, is never truncated


def test_prediction_integral_ids_of_any_type_are_read(two_images):
    pytest.importorskip("pycocotools")
    entries = [dict(_HIT, image_id=np.int64(0)), dict(_HIT, image_id=1.0, boxes=[[5, 5, 25, 25]])]
    assert score_predictions(entries, two_images)["precision"] == 1.0
    assert score_predictions({"0": _HIT, 1: dict(_HIT, image_id=1, boxes=[[5, 5, 25, 25]])}, two_images)["tp"] == 2


def test_prediction_id_that_differs_from_its_key_is_named(two_images):
    with pytest.raises(PredictionError, match="the entry under image_id=0 has image_id=1; give one id"):
        score_predictions({0: dict(_HIT, image_id=1), 1: _HIT}, two_images)
    own = as_predictions(dict(_HIT, image_id=1))
    with pytest.raises(PredictionError, match="the entry under image_id=0 has image_id=1"):
        score_predictions({0: own}, two_images)


@pytest.mark.parametrize(
    ("box", "message"),
    [
        ([1e30, 1e30, 2e30, 2e30], r"box 1 is \[1e\+30, 1e\+30, 2e\+30, 2e\+30\] \(2 such in 2 images\)"),
        ([0, 0, 1e30, 1e30], r"box 1 is \[0, 0, 1e\+30, 1e\+30\] \(2 such in 2 images\)"),
        ([0, 0, 2e5, 2e5], r"box 1 is \[0, 0, 200000, 200000\] \(2 such"),  # over COCO's largest area
        ([1e30, 1e30, 1e30, 1e30], r"box 1 is \[1e\+30, 1e\+30, 1e\+30, 1e\+30\]"),  # no area, no pixel either
        ([0, 0, float("inf"), 5], r"box 1 is \[0.0, 0.0, inf, 5.0\] \(2 such in 2 images\)"),
        ([float("nan"), 0, 5, 5], r"box 1 is \[nan, 0.0, 5.0, 5.0\] \(2 such"),
    ],
)
def test_prediction_boxes_beyond_any_image_are_counted_and_named(two_images, box, message):
    entries = {
        0: {"boxes": [[10, 10, 30, 30], box], "scores": [0.9, 0.95], "labels": [0, 0]},
        1: {"boxes": [[5, 5, 25, 25], box], "scores": [0.9, 0.95], "labels": [0, 0]},
    }
    with pytest.raises(PredictionError, match=r"image_id=0: " + message):
        score_predictions(entries, two_images)


def test_prediction_score_outside_0_1_is_counted(two_images):
    entries = {0: dict(_HIT, scores=[1e30]), 1: dict(_HIT, scores=[float("nan")])}
    with pytest.raises(PredictionError, match=r"image_id=0: score 1.00000001504\d+e\+30 is outside \[0, 1\] \(2 such"):
        score_predictions(entries, two_images)


def test_prediction_far_outside_the_image_is_a_false_positive(two_images):
    pytest.importorskip("pycocotools")
    entries = {0: {"boxes": [[10, 10, 30, 30], [5000, 5000, 5100, 5100]], "scores": [0.9, 0.95], "labels": [0, 0]}}
    metrics = score_predictions(entries, two_images)
    assert (metrics["tp"], metrics["fp"], metrics["precision"]) == (1, 1, 0.5)


# -- 9. absurd settings -----------------------------------------------------------------------
def test_num_workers_over_the_cpu_cap_is_refused_by_name(monkeypatch, small_synth_root, capsys):
    import resource

    from detloader import make_loader
    from detloader._system import cpus
    from detloader.cli import main
    from detloader.loader.make import check_num_workers
    from detloader.train import TrainConfig

    monkeypatch.setattr(cpus, "usable_cpus", lambda: 16)
    monkeypatch.setattr(resource, "getrlimit", lambda which: (resource.RLIM_INFINITY, resource.RLIM_INFINITY))
    assert check_num_workers(64) == 64 and check_num_workers(0) == 0
    expected = (
        "num_workers=100000 is over the cap of 64 (4 per usable CPU, 16 here, at least 32): more workers only "
        "wait for each other; use fewer, or num_workers='auto' (--num-workers auto)"
    )
    with pytest.raises(ValueError) as err:
        check_num_workers(100000)
    assert str(err.value) == expected
    with pytest.raises(ValueError, match="num_workers=65 is over the cap of 64"):
        TrainConfig(num_workers=65)
    index = read_annotations(small_synth_root)
    with pytest.raises(ValueError, match="num_workers=100000 is over the cap of 64"):
        make_loader(DetectionDataset(index), num_workers=100000)
    assert main(["train", str(small_synth_root), "--num-workers", "100000"]) == 2
    assert capsys.readouterr().err.strip().endswith(expected)
    monkeypatch.setattr(cpus, "usable_cpus", lambda: 1)
    assert check_num_workers(32) == 32  # a small machine still gets 32
    with pytest.raises(ValueError, match=r"num_workers=33 is over the cap of 32 \(4 per usable CPU, 1 here"):
        check_num_workers(33)


def test_num_workers_over_the_open_file_limit_is_refused_by_name(monkeypatch):
    import resource

    from detloader._system import cpus
    from detloader.loader.make import check_num_workers

    monkeypatch.setattr(cpus, "usable_cpus", lambda: 64)
    monkeypatch.setattr(resource, "getrlimit", lambda which: (1024, 4096))
    assert check_num_workers(128) == 128
    message = r"num_workers=129 is over the cap of 128 \(the open-file limit, ulimit -n 1024, at 8 descriptors"
    with pytest.raises(ValueError, match=message):
        check_num_workers(129)
