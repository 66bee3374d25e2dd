"""Per-image class lists (absent / present / not_exhaustive) and the per-class frequency: from the
builder through merge, subset, split, the cache and a refresh's kept rows."""

from __future__ import annotations

import numpy as np
import pytest

from detloader.annotations.builder import ChunkBuilder
from detloader.annotations.cache import load_index_file, save_index
from detloader.annotations.checks import ReadOptions
from detloader.annotations.parse import merge
from detloader.annotations.refresh import _kept_partial
from detloader.balance.label_lists import labels_index
from detloader.errors import DetloaderError, DetloaderValueError


def _chunk(options: ReadOptions, file: str, images: list[dict], frequency: dict[str, str] | None = None):
    b = ChunkBuilder(options)
    b.begin_file(file)
    if frequency is not None:
        b.declare_classes(list(frequency), None, list(frequency.values()))
    for k, image in enumerate(images):
        assert b.add_image(f"{file}-{k}.jpg", 100, 100)
        for name in image.get("objects", ()):
            b.add_object((1, 1, 9, 9), name, element=f"o{k}")
        for key in ("absent", "present", "not_exhaustive"):
            if key in image:
                b.add_class_list(key, image[key])
    return b.finish()


def _lists(index, name: str) -> list[list[str]]:
    return [[index.classes[c] for c in index.class_list(name, i)] for i in range(len(index))]


IMAGES_A = [
    {"objects": ["cat"], "absent": ["dog", "zebra", "dog"], "not_exhaustive": ["cat"]},
    {"objects": ["dog"], "present": ["dog", "bird"]},
]
IMAGES_B = [{"absent": ["bird", "ant"]}, {"objects": ["ant"]}]


def _index(options: ReadOptions | None = None):
    options = options or ReadOptions(check_images=False)
    parts = [_chunk(options, "a.json", IMAGES_A), _chunk(options, "b.json", IMAGES_B)]
    return merge(parts, options, root=".", meta={"format": "test"})


def test_lists_are_merged_over_chunks_sorted_and_distinct():
    index = _index()
    assert index.classes == ("ant", "bird", "cat", "dog", "zebra")  # list-only classes are classes too
    assert _lists(index, "absent") == [["dog", "zebra"], [], ["ant", "bird"], []]
    assert _lists(index, "present") == [[], ["bird", "dog"], [], []]
    assert _lists(index, "not_exhaustive") == [["cat"], [], [], []]
    values, offsets = index.class_lists("absent")
    assert values.dtype == np.int32 and offsets.dtype == np.int64 and offsets.tolist() == [0, 2, 2, 4, 4]
    assert index.class_list("absent", -2).tolist() == [0, 1] and index.has_class_lists()
    with pytest.raises(DetloaderValueError, match="name='negative' is not one of absent, present, not_exhaustive"):
        index.class_list("negative", 0)
    with pytest.raises(IndexError, match="i=4 out of range"):
        index.class_list("absent", 4)


def test_subset_split_and_cache_keep_the_lists(tmp_path):
    index = _index()
    sub = index.subset([2, 0, 2])
    assert _lists(sub, "absent") == [["ant", "bird"], ["dog", "zebra"], ["ant", "bird"]]
    assert _lists(index.subset([]), "absent") == []
    index.splits = {"val": np.array([0, 2])}
    assert _lists(index.split("val"), "absent") == [["dog", "zebra"], ["ant", "bird"]]
    path = save_index(index, tmp_path / "x.dlindex", "key", record=False)
    loaded = load_index_file(path)
    for name in ("absent", "present", "not_exhaustive"):
        assert _lists(loaded, name) == _lists(index, name)
    assert "absent_classes" in loaded.arrays() and list(loaded.arrays()) == list(index.arrays())


def test_class_options_apply_to_the_lists():
    mapped = _index(ReadOptions(check_images=False, class_map=(("zebra", None), ("bird", "dog"))))
    assert _lists(mapped, "absent") == [["dog"], [], ["ant", "dog"], []]
    assert _lists(mapped, "present") == [[], ["dog"], [], []]  # bird and dog are one class now
    assert mapped.meta["stats"]["dropped_by_class_map"] == 1
    fixed = _index(ReadOptions(check_images=False, classes=("ant", "cat", "dog")))
    assert _lists(fixed, "absent") == [["dog"], [], ["ant"], []]
    assert fixed.meta["stats"]["class_list_outside_classes"] == 3  # zebra, bird twice


def test_a_list_needs_an_open_image_and_a_known_name():
    b = ChunkBuilder(ReadOptions(check_images=False))
    with pytest.raises(DetloaderError, match="add_class_list before add_image"):
        b.add_class_list("absent", ["a"])
    b.add_image("x.jpg", 10, 10)
    with pytest.raises(DetloaderError, match="name='neg' is not one of"):
        b.add_class_list("neg", ["a"])
    assert not b.add_image("y.jpg", 0, 10)  # rejected: no image to put a list on
    with pytest.raises(DetloaderError, match="before add_image"):
        b.add_class_list("absent", ["a"])


def test_frequency_is_kept_in_meta_and_a_clash_is_named(tmp_path):
    options = ReadOptions(check_images=False)
    parts = [
        _chunk(options, "train.json", IMAGES_A, {"cat": "f", "dog": "c", "zebra": "r"}),
        _chunk(options, "val.json", IMAGES_B, {"cat": "f", "dog": "r"}),
    ]
    index = merge(parts, options, root=".", meta={})
    assert index.meta["frequency"] == {"cat": "f", "dog": None, "zebra": "r", "ant": None, "bird": None}
    (problem,) = [p for p in index.problems if p.kind == "bad_value"]
    assert problem.file == "val.json" and problem.element == "categories/frequency"
    assert "class 'dog': frequency='r', but train.json gives frequency='c'" in problem.message
    loaded = load_index_file(save_index(index, tmp_path / "f.dlindex", "key", record=False))
    assert loaded.meta["frequency"] == index.meta["frequency"]
    assert "frequency" not in _index().meta  # no file declares one


def test_refresh_keeps_the_lists_of_unchanged_rows():
    index = _index()
    rows = np.array([1, 2])
    again = merge([_kept_partial(index, rows, [])], ReadOptions(check_images=False), root=".", meta={})
    assert again.classes == ("ant", "bird", "dog")  # the classes those rows use, objects and lists
    for name in ("absent", "present", "not_exhaustive"):
        assert _lists(again, name) == _lists(index.subset(rows), name)


def test_arrays_without_lists_give_empty_lists_and_bad_ids_are_refused():
    index = labels_index([0, 1], ["a", "b"])
    assert index.class_list("absent", 1).tolist() == [] and not index.has_class_lists()
    arrays = index.arrays()
    arrays["absent_classes"] = np.array([5], dtype=np.int32)
    arrays["absent_offsets"] = np.array([0, 1, 1], dtype=np.int64)
    with pytest.raises(DetloaderValueError, match="absent_classes holds class 5, not one of the 2 classes"):
        type(index)(root=".", arrays=arrays, vocab=index.vocab)
    arrays["absent_offsets"] = np.array([0, 1, 2], dtype=np.int64)
    with pytest.raises(DetloaderValueError, match="absent_offsets run 0..2, expected 0..1"):
        type(index)(root=".", arrays=arrays, vocab=index.vocab)
