"""``class_map`` keys that match no class are refused by name, once every file is read."""

from __future__ import annotations

import json
import pickle

import pytest
from helpers import voc_dataset, voc_object, voc_xml, write_image

import detloader
from detloader import ClassMapError, read_annotations


@pytest.fixture
def root(tmp_path):
    files = {
        "a": voc_xml("a.jpg", [voc_object("person", (1, 1, 5, 5))]),
        "b": voc_xml("b.jpg", [voc_object("car", (1, 1, 5, 5))]),
        "c": voc_xml("c.jpg", [voc_object("dog", (1, 1, 5, 5))]),
    }
    return voc_dataset(tmp_path, files)


def test_a_key_that_matches_no_class_is_refused_by_name(root):
    with pytest.raises(ClassMapError) as info:
        read_annotations(root, class_map={"persn": "human", "car": "vehicle", "xyz": None})
    err = info.value
    assert isinstance(err, ValueError) and detloader.ClassMapError is ClassMapError
    assert err.keys == ("persn", "xyz") and err.classes == ("car", "dog", "person")
    assert str(err) == (
        "class_map: 'persn' (did you mean 'person'?), 'xyz' matches no class in the files; "
        "classes found: 'car', 'dog', 'person'"
    )
    assert str(pickle.loads(pickle.dumps(err))) == str(err)


def test_a_key_may_match_a_class_of_any_file(root):
    # each file is its own chunk here: the check sees the classes of all of them
    index = read_annotations(root, class_map={"dog": "hound", "person": None}, workers=1)
    assert index.classes == ("car", "hound")


def test_refused_with_the_cache_too(root):
    assert read_annotations(root).classes == ("car", "dog", "person")  # cached without a class_map
    for _ in range(2):  # the bad class_map is never cached: the second read refuses as well
        with pytest.raises(ClassMapError, match="'persn'"):
            read_annotations(root, class_map={"persn": "human"})
    good = read_annotations(root, class_map={"person": "human"})
    assert read_annotations(root, class_map={"person": "human"})._source_file == good._source_file
    assert read_annotations(root, class_map={"person": "human"}).classes == ("car", "dog", "human")


def test_declared_classes_count_as_found(tmp_path):
    data = {
        "images": [{"id": 1, "file_name": "a.jpg", "width": 64, "height": 48}],
        "annotations": [],
        "categories": [{"id": 1, "name": "zebra"}],
    }
    write_image(tmp_path / "a.jpg")
    (tmp_path / "x.json").write_text(json.dumps(data))
    assert read_annotations(tmp_path / "x.json", class_map={"zebra": "z"}).classes == ("z",)
    with pytest.raises(ClassMapError, match=r"'zebr' \(did you mean 'zebra'\?\)"):
        read_annotations(tmp_path / "x.json", class_map={"zebr": "z"})


def test_the_list_of_classes_found_is_capped(tmp_path):
    objects = [voc_object(f"c{i:03d}", (1, 1, 5, 5)) for i in range(ClassMapError.SHOWN + 5)]
    root = voc_dataset(tmp_path, {"a": voc_xml("a.jpg", objects)})
    with pytest.raises(ClassMapError, match=r"'c039', \.\.\. \(45 in all\)$"):
        read_annotations(root, class_map={"nothing_like_it": None})
