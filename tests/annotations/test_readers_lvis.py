"""LVIS v1 files as they ship: COCO-shaped, images named by coco_url in COCO's train2017/ and
val2017/, neg / not-exhaustive lists per image, frequency per category, the train + val pair."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from helpers import write_image

from detloader import detect_format, read_annotations

URL = "http://images.cocodataset.org"


def lvis_image(i: int, folder: str, neg=(), not_exhaustive=(), w: int = 64, h: int = 48) -> dict[str, Any]:
    return {"id": i, "coco_url": f"{URL}/{folder}/{i:012d}.jpg", "width": w, "height": h, "license": 1,
            "flickr_url": "", "date_captured": "", "neg_category_ids": list(neg),
            "not_exhaustive_category_ids": list(not_exhaustive)}


def lvis_ann(i: int, image: int, cat: int, bbox: list) -> dict[str, Any]:
    return {"id": i, "image_id": image, "category_id": cat, "bbox": bbox, "area": bbox[2] * bbox[3],
            "segmentation": [[bbox[0], bbox[1], bbox[0] + bbox[2], bbox[1], bbox[0], bbox[1] + bbox[3]]]}


CATEGORIES = [
    {"id": 1, "name": "aerosol_can", "frequency": "c", "synset": "a.n.01", "image_count": 20, "instance_count": 30},
    {"id": 3, "name": "alligator", "frequency": "r", "synset": "b.n.01", "image_count": 2, "instance_count": 2},
    {"id": 7, "name": "apple", "frequency": "f", "synset": "c.n.01", "image_count": 900, "instance_count": 4000},
]


def lvis_file(path: Path, images: list, annotations: list, categories: list = CATEGORIES) -> Path:
    """An LVIS file with the keys in LVIS's order (annotations before images)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    data = {"info": {}, "annotations": annotations, "images": images, "licenses": [], "categories": categories}
    path.write_text(json.dumps(data))
    return path


@pytest.fixture
def lvis_root(tmp_path) -> Path:
    root = tmp_path / "coco"
    for i in (1, 2, 3, 6):
        write_image(root / "train2017" / f"{i:012d}.jpg")
    write_image(root / "val2017" / f"{4:012d}.jpg")
    train = [lvis_image(1, "train2017", neg=[3]), lvis_image(2, "train2017", not_exhaustive=[7])]
    lvis_file(root / "annotations/lvis_v1_train.json", train,
              [lvis_ann(1, 1, 7, [1, 1, 10, 10]), lvis_ann(2, 2, 7, [2, 2, 5, 5]), lvis_ann(3, 2, 1, [0, 0, 8, 8])])
    val = [
        lvis_image(3, "train2017", neg=[1, 3, 3]),   # LVIS val images come from COCO train2017 too
        lvis_image(4, "val2017", not_exhaustive=[1]),
        lvis_image(6, "val2017"),                    # the url's folder is wrong: found in train2017/
        lvis_image(5, "val2017"),                    # nowhere
    ]
    lvis_file(root / "annotations/lvis_v1_val.json", val,
              [lvis_ann(4, 3, 7, [3, 3, 9, 9]), lvis_ann(5, 4, 3, [1, 2, 3, 4])])
    return root


def test_two_files_read_as_train_and_val_with_lists_and_frequency(lvis_root):
    assert detect_format(lvis_root) == "lvis"
    assert detect_format(lvis_root / "annotations/lvis_v1_val.json") == "lvis"
    index = read_annotations(lvis_root, on_error="skip", cache=False)
    assert index.meta["format"] == "lvis" and index.classes == ("aerosol_can", "alligator", "apple")
    assert index.category_ids.tolist() == [1, 3, 7]
    paths = index.image_paths()
    assert paths == ["train2017/000000000001.jpg", "train2017/000000000002.jpg", "train2017/000000000003.jpg",
                     "val2017/000000000004.jpg", "train2017/000000000006.jpg"]
    assert index.image_ids.tolist() == [1, 2, 3, 4, 6]
    assert {k: v.tolist() for k, v in index.splits.items()} == {"train": [0, 1], "val": [2, 3, 4]}
    assert index.meta["split_sources"] == {"train": "annotations/lvis_v1_train.json",
                                           "val": "annotations/lvis_v1_val.json"}
    names = [[[index.classes[c] for c in index.class_list(key, i)] for i in range(len(index))]
             for key in ("absent", "not_exhaustive", "present")]
    assert names[0] == [["alligator"], [], ["aerosol_can", "alligator"], [], []]
    assert names[1] == [[], ["apple"], [], ["aerosol_can"], []]
    assert names[2] == [[]] * 5
    assert index.meta["frequency"] == {"aerosol_can": "c", "alligator": "r", "apple": "f"}
    (missing,) = [p for p in index.problems if p.kind == "missing_image"]
    assert missing.file == "annotations/lvis_v1_val.json" and missing.element == "images[3]/coco_url"
    assert f"coco_url='{URL}/val2017/000000000005.jpg' not found in" in missing.message
    assert index.num_objects == 5 and not index.crowd.any() and index.area.tolist() == [100, 25, 64, 81, 12]


def test_a_single_file_is_its_split_and_coco_files_beside_are_left(lvis_root):
    (lvis_root / "annotations/instances_val2017.json").write_text(
        json.dumps({"images": [], "annotations": [], "categories": []}))
    index = read_annotations(lvis_root / "annotations/lvis_v1_val.json", on_error="skip", cache=False)
    assert {k: v.tolist() for k, v in index.splits.items()} == {"val": [0, 1, 2]}  # not train by folder
    assert read_annotations(lvis_root, on_error="skip", cache=False).splits.keys() == {"train", "val"}


def test_bad_lists_and_frequencies_are_named(tmp_path):
    root = tmp_path / "ds"
    write_image(root / "train2017" / f"{1:012d}.jpg")
    image = lvis_image(1, "train2017", neg=[3, 99, "x", [1]])
    image["not_exhaustive_category_ids"] = 7
    categories = [dict(CATEGORIES[0], frequency="rare"), {k: v for k, v in CATEGORIES[1].items() if k != "frequency"},
                  CATEGORIES[2]]
    lvis_file(root / "lvis_v1_train.json", [image],
              [lvis_ann(1, 1, 7, [1, 1, 5, 5]), dict(lvis_ann(2, 1, 7, [2, 2, 6, 6]), area=-3)], categories)
    index = read_annotations(root, on_error="skip", cache=False)
    shown = sorted(str(p) for p in index.problems)
    assert shown == [
        "lvis_v1_train.json: annotations[1]/area: area=-3 is not a number >= 0 (box area used)",
        "lvis_v1_train.json: categories[0]/frequency: frequency='rare' is not one of 'r', 'c', 'f' "
        "(class in no frequency group)",
        "lvis_v1_train.json: categories[1]/frequency: frequency is missing (class in no frequency group)",
        "lvis_v1_train.json: images[0]/neg_category_ids[1]: 99 is not in categories (left out of the list)",
        "lvis_v1_train.json: images[0]/neg_category_ids[2]: 'x' is not in categories (left out of the list)",
        "lvis_v1_train.json: images[0]/neg_category_ids[3]: [1] is not in categories (left out of the list)",
        "lvis_v1_train.json: images[0]/not_exhaustive_category_ids: not_exhaustive_category_ids=7 is not a list "
        "of category ids (list skipped)",
    ]
    assert index.class_list("absent", 0).tolist() == [1] and index.area.tolist() == [25.0, -1.0]
    assert index.meta["frequency"] == {"aerosol_can": None, "alligator": None, "apple": "f"}


def test_general_path_gives_the_same_index(lvis_root):
    fast = read_annotations(lvis_root, on_error="skip", cache=False)
    slow = read_annotations(lvis_root, on_error="skip", cache=False, class_map={"apple": "apple"})  # no fast path
    assert fast.image_paths() == slow.image_paths() and fast.meta["frequency"] == slow.meta["frequency"]
    for key in ("absent", "not_exhaustive"):
        assert [a.tolist() for a in fast.class_lists(key)] == [a.tolist() for a in slow.class_lists(key)]
    assert [str(p) for p in fast.problems] == [str(p) for p in slow.problems]


def test_cache_keeps_lists_and_frequency(lvis_root, monkeypatch, tmp_path):
    monkeypatch.setenv("DETLOADER_CACHE_DIR", str(tmp_path / "cache"))
    built = read_annotations(lvis_root, on_error="skip")
    loaded = read_annotations(lvis_root, on_error="skip")
    assert loaded.source_file is not None and loaded.meta["frequency"] == built.meta["frequency"]
    assert [a.tolist() for a in loaded.class_lists("absent")] == [a.tolist() for a in built.class_lists("absent")]


def test_coco_export_keeps_the_lists_and_frequency(lvis_root, tmp_path):
    from detloader.annotations.writers import write_annotations

    index = read_annotations(lvis_root, on_error="skip", cache=False)
    out = write_annotations(index, tmp_path / "out", "coco")
    data = json.loads((out / "instances_val.json").read_text())
    assert data["images"][0]["neg_category_ids"] == [1, 3] and data["categories"][1]["frequency"] == "r"
    back = read_annotations(out, cache=False)
    assert back.meta["format"] == "lvis" and back.meta["frequency"] == index.meta["frequency"]
    for key in ("absent", "not_exhaustive"):
        assert [a.tolist() for a in back.class_lists(key)] == [a.tolist() for a in index.class_lists(key)]
    plain = read_annotations(tmp_path / "out", format="coco", cache=False)  # the COCO reader keeps them too
    assert [a.tolist() for a in plain.class_lists("absent")] == [a.tolist() for a in index.class_lists("absent")]
