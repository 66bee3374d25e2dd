"""A COCO file's images looked up in each folder's listing (ImageLocator(listed=True)) are found
as by one ``stat`` per candidate: the same index, the same problems, the same refusals."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from helpers import arrays_equal

from detloader import read_annotations
from detloader.annotations.readers import locate


def _dataset(tmp_path: Path) -> Path:
    """A COCO file of 400 images past every lookup rule: plain names, names with a folder,
    other extensions, missing, a FIFO, a folder, links, names leaving the dataset."""
    root = tmp_path / "d"
    images = root / "images"
    (images / "sub").mkdir(parents=True)
    (images / "dir.jpg").mkdir()
    os.mkfifo(images / "fifo.jpg")
    (tmp_path / "outside.jpg").touch()
    (images / "dangling.jpg").symlink_to(tmp_path / "nothing.jpg")
    (images / "linked.jpg").symlink_to(tmp_path / "outside.jpg")
    names = []
    for i in range(400):
        kind = i % 20
        if kind == 0:
            name = f"{i}.jpg"  # missing
        elif kind == 1:
            (images / "sub" / f"{i}.jpg").touch()
            name = f"sub/{i}.jpg"
        elif kind == 2:
            (images / f"{i}.png").touch()
            name = f"{i}.jpg"  # found by its stem
        elif kind == 3:
            (images / f"{i}.jpg").touch()
            name = f"elsewhere/{i}.jpg"  # found by its base name
        elif kind == 4:
            name = ["fifo.jpg", "dir.jpg", "dangling.jpg", "linked.jpg", "../outside.jpg"][i // 20 % 5]
        elif kind == 5:
            (images / f"{i}.jpg").touch()
            name = [f" {i}.jpg", f"./{i}.jpg", f"sub\\..\\{i}.jpg", f"../d/images/{i}.jpg", str(images / f"{i}.jpg")][
                i // 20 % 5
            ]
        else:
            (images / f"{i}.jpg").touch()
            name = f"{i}.jpg"
        names.append(name)
    records = [{"id": i + 1, "file_name": n, "width": 64, "height": 48} for i, n in enumerate(names)]
    objects = [{"id": i, "image_id": i + 1, "category_id": 1, "bbox": [1, 2, 10, 10]} for i in range(400)]
    (root / "annotations").mkdir()
    path = root / "annotations" / "instances_train.json"
    path.write_text(json.dumps({"images": records, "annotations": objects, "categories": [{"id": 1, "name": "a"}]}))
    return path


@pytest.mark.parametrize("outside", [False, True])
def test_listed_lookups_give_the_index_and_problems_of_one_stat_each(tmp_path, monkeypatch, outside):
    path = _dataset(tmp_path)
    listings = []
    real = locate._list_folder
    monkeypatch.setattr(locate, "_list_folder", lambda folder: listings.append(folder) or real(folder))
    listed = read_annotations(path, cache=False, on_error="skip", allow_outside_images=outside)
    assert len(listings) == len(set(listings)) and str(path.parents[1] / "images" / "sub") in listings
    monkeypatch.setattr(locate, "LIST_AFTER", 10**9)
    one_by_one = read_annotations(path, cache=False, on_error="skip", allow_outside_images=outside)
    assert arrays_equal(listed, one_by_one) and listed.image_paths() == one_by_one.image_paths()
    assert listed.problems.to_list() == one_by_one.problems.to_list()
    kinds = {p.kind for p in listed.problems}
    assert {"missing_image", "not_a_regular_file"} <= kinds and ("outside_dataset" in kinds) != outside
    assert 300 < len(listed) < 400


def test_a_plain_name_found_in_the_listing_costs_no_stat(tmp_path, monkeypatch):
    path = _dataset(tmp_path)
    stats = []
    real = locate.ImageLocator._exists
    monkeypatch.setattr(locate.ImageLocator, "_exists", lambda self, rel: stats.append(rel) or real(self, rel))
    read_annotations(path, cache=False, on_error="skip")
    numbered = [int(n) for rel in stats if (n := os.path.basename(rel).split(".")[0]).isdigit()]
    assert [i for i in numbered if i < locate.LIST_AFTER and i % 20 > 5]  # by stat before the listing
    assert not [i for i in numbered if i > locate.LIST_AFTER and i % 20 > 5]  # by the listing after
