"""Faults of the inputs (issue 44, families 1, 2, 3, 5 and 9): names that are not UTF-8, COCO
values that break the columns, YOLO label lines and data.yaml bombs, hostile predictions and
absurd worker counts. Each ends with the right result or a named problem or error."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from helpers import voc_dataset, voc_object, voc_xml, write_image

from detloader import DetectionDataset, read_annotations

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
