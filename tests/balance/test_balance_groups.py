"""Balancing groups: per object and per image, product keys, counts, members."""

from __future__ import annotations

import pytest
from balance_helpers import six_image_index

from detloader.annotations.index import MISSING
from detloader.balance.groups import balance_groups, class_members, group_counts


@pytest.fixture
def index():
    return six_image_index()


def test_groups_per_object_and_per_image(index):
    g = balance_groups(index, "class")
    assert g.level == "object" and g.names == ("a", "b", "c")
    assert g.ids.tolist() == [0, 0, 0, 0, 1, 0, 1, 1, 2, 0]
    assert g.image_of.tolist() == [0, 0, 0, 1, 1, 2, 3, 3, 5, 5]
    h = balance_groups(index, "image_class")
    assert h.level == "image" and h.names == ("day", "night")
    assert h.ids.tolist() == [0, 0, 1, 0, MISSING, 1]
    a = balance_groups(index, "attribute:age")
    assert a.names == ("adult", "child") and a.ids.tolist() == [0, 0, 1, 0, MISSING, 1, 0, 0, 1, 0]


def test_product_key_broadcasts_image_values_to_objects(index):
    g = balance_groups(index, ("class", "image_class"))
    assert g.level == "object"
    assert g.names == ("a/day", "a/night", "b/day", "b/night", "c/day", "c/night")
    # image 2 (night) holds one 'a' -> a/night; image 5 (night) holds c and a
    assert [g.names[i] for i in g.ids] == [
        "a/day", "a/day", "a/day", "a/day", "b/day", "a/night", "b/day", "b/day", "c/night", "a/night",
    ]
    assert balance_groups(index, "class,image_class").names == g.names
    # a MISSING part makes the unit MISSING
    p = balance_groups(index, ("class", "attribute:age"))
    assert p.ids[4] == MISSING and (p.ids != MISSING).sum() == 9


@pytest.mark.parametrize(
    "by, match",
    [("colour", "expected 'class'"), ("attribute:size", "no object attribute 'size'"),
     ("image_attribute:x", "no image attribute 'x'"), ("class,class", "repeats"), ("", "expected")],
)
def test_bad_keys_name_the_choices(index, by, match):
    with pytest.raises(ValueError, match=match):
        balance_groups(index, by)


def test_counts_objects_and_images(index):
    g = balance_groups(index, "class")
    assert group_counts(g, "objects").tolist() == [6, 3, 1]
    assert group_counts(g, "images").tolist() == [4, 2, 1]
    assert group_counts(balance_groups(index, "image_class")).tolist() == [3, 2]
    with pytest.raises(ValueError, match="count='boxes'"):
        group_counts(g, "boxes")  # type: ignore[arg-type]


def test_class_members(index):
    names, members = class_members(index, "class")
    assert names == ("a", "b", "c")
    assert [m.tolist() for m in members] == [[0, 1, 2, 5], [1, 3], [5]]
    names, members = class_members(index, "image_class")
    assert [m.tolist() for m in members] == [[0, 1, 3], [2, 5]]
