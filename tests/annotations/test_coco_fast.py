"""The fast COCO path (typed decode, numpy columns) gives the general path's index and problems."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
from helpers import arrays_equal, write_image
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from detloader import read_annotations
from detloader.annotations.readers import coco as coco_fast
from detloader.annotations.readers import coco as coco_mod


def _messy(tmp_path: Path, seed: int) -> Path:
    """Images and objects with every problem the fast path must name as the general path does."""
    rng = random.Random(seed)
    images, objects = [], []
    for i in range(40):
        record = {"id": i + 1, "file_name": f"{i % 37}.jpg", "width": 64, "height": 48}
        kind = rng.random()
        if kind < 0.05:
            record.pop("width")  # size from the image header
        elif kind < 0.08:
            record["width"] = "wide"
        elif kind < 0.1:
            record["file_name"] = "absent.jpg"
        elif kind < 0.12:
            record["id"] = i  # repeats an earlier id (or a fresh one)
        elif kind < 0.14:
            record.pop("id")
        elif kind < 0.16:
            record["attributes"] = {"class": "day"}
        images.append(record)
    for j in range(300):
        x, y, w, h = (round(rng.uniform(-10, 70), 2) for _ in range(4))
        if rng.random() < 0.6:
            x, y, w, h = rng.randint(0, 30), rng.randint(0, 20), rng.randint(1, 30), rng.randint(1, 20)
        record = {
            "id": j,
            "image_id": rng.randint(0, 42),
            "category_id": rng.choice([1, 2, 5, 9]),
            "bbox": [x, y, w, h],
        }
        if rng.random() < 0.2:
            record["iscrowd"] = rng.choice([0, 1, 2, None])
        if rng.random() < 0.1:
            record["keypoints"] = []
        if rng.random() < 0.05:
            record["bbox"] = [x, y, 0, h]
        if rng.random() < 0.04:
            record["id"] = rng.randint(0, j)  # repeats an earlier id, for another object
        objects.append(record)
        if rng.random() < 0.03:
            objects.append(dict(record, id=record["id"]))  # the same object again
    categories = [{"id": 5, "name": "b"}, {"id": 1, "name": "a"}, {"id": 2, "name": "a"}, {"id": 7, "name": "unused"}]
    folder = tmp_path / f"d{seed}"
    for i in range(36):  # 36.jpg is missing
        write_image(folder / f"{i}.jpg")
    path = folder / "instances.json"
    path.write_text(json.dumps({"images": images, "annotations": objects, "categories": categories}))
    return path


def _general(monkeypatch: pytest.MonkeyPatch, path: Path, **kw):
    with monkeypatch.context() as m:
        m.setattr(coco_mod, "parse_fast", lambda *a: False)
        return read_annotations(path, cache=False, on_error="skip", **kw)


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("clip", [True, False])
def test_fast_path_gives_the_general_paths_index_and_problems(tmp_path, monkeypatch, seed, clip):
    path = _messy(tmp_path, seed)
    used = []
    real = coco_fast.parse_fast
    monkeypatch.setattr(coco_mod, "parse_fast", lambda *a: used.append(real(*a)) or used[-1])
    fast = read_annotations(path, cache=False, on_error="skip", clip_boxes=clip)
    assert used == [True]
    general = _general(monkeypatch, path, clip_boxes=clip)
    assert arrays_equal(fast, general) and fast.vocab == general.vocab
    assert fast.problems.to_list() == general.problems.to_list()
    assert fast.num_objects > 50 and len(fast.problems) > 10
    assert {p.kind for p in fast.problems} >= {"bad_value", "empty_box", "missing_image", "duplicate_object"}


@pytest.mark.parametrize(
    "change",
    [
        lambda o: o.update(keypoints=[1, 2, 2]),
        lambda o: o.update(attributes={"occluded": "1"}),
        lambda o: o.update(category_id=1.0),
        lambda o: o.update(bbox=[1, 2, 3]),
        lambda o: o.update(iscrowd=True),
        lambda o: o.pop("image_id"),
    ],
)
def test_a_record_outside_the_typed_shape_takes_the_general_path(tmp_path, monkeypatch, change):
    path = _messy(tmp_path, 0)
    data = json.loads(path.read_text())
    change(data["annotations"][3])
    path.write_text(json.dumps(data))
    used = []
    real = coco_fast.parse_fast
    monkeypatch.setattr(coco_mod, "parse_fast", lambda *a: used.append(real(*a)) or used[-1])
    index = read_annotations(path, cache=False, on_error="skip")
    assert used == [False]
    general = _general(monkeypatch, path)
    assert arrays_equal(index, general) and index.problems.to_list() == general.problems.to_list()


def test_class_options_take_the_general_path(tmp_path, monkeypatch):
    path = _messy(tmp_path, 1)
    used = []
    real = coco_fast.parse_fast
    monkeypatch.setattr(coco_mod, "parse_fast", lambda *a: used.append(real(*a)) or used[-1])
    index = read_annotations(path, cache=False, on_error="skip", class_map={"a": "b"})
    assert used == [False] and index.classes == ("b", "unused")


_VALUES = st.one_of(
    st.integers(-3, 80), st.floats(-5, 90, allow_nan=False), st.sampled_from([0, 1, 2, None, 1e40, -0.0, 2**70])
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_any_box_file_reads_the_same_on_both_paths(tmp_path, monkeypatch, data):
    folder = tmp_path / f"h{data.draw(st.integers(0, 10**9))}"
    for name in ("a.jpg", "b.jpg"):
        write_image(folder / name)
    images = [
        {"id": 1, "file_name": "a.jpg", "width": data.draw(st.sampled_from([64, 0, None, 64.0, 100])), "height": 48},
        {"id": data.draw(st.sampled_from([2, 1, None])), "file_name": "b.jpg", "width": 64, "height": 48},
    ]
    objects = [
        {
            "image_id": data.draw(st.sampled_from([1, 2, 3])),
            "category_id": data.draw(st.sampled_from([1, 2, 4])),
            "bbox": [data.draw(_VALUES) for _ in range(4)],
            "iscrowd": data.draw(st.sampled_from([0, 1, 3, None])),
        }
        for _ in range(data.draw(st.integers(0, 12)))
    ]
    categories = [{"id": 1, "name": "a"}, {"id": 2, "name": data.draw(st.sampled_from(["b", "a", " c "]))}]
    path = folder / "instances.json"
    path.write_text(json.dumps({"images": images, "annotations": objects, "categories": categories}))
    fast = read_annotations(path, cache=False, on_error="skip")
    general = _general(monkeypatch, path)
    assert arrays_equal(fast, general) and fast.vocab == general.vocab
    assert fast.problems.to_list() == general.problems.to_list()
