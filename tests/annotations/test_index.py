"""AnnotationIndex: views, subsets, splits, counts, schema, memory per object."""

from __future__ import annotations

import numpy as np
import pytest
from helpers import voc_dataset, voc_object, voc_xml
from hypothesis import given, settings
from hypothesis import strategies as st

from detloader import FACE5, LandmarkSchema, read_annotations
from detloader.annotations.fields import pack_strings, unpack_string, unpack_strings
from detloader.annotations.index import _ranges
from detloader.annotations.landmarks import infer_flip_pairs


@pytest.fixture(scope="module")
def index(tmp_path_factory):
    root = tmp_path_factory.mktemp("idx")
    files = {}
    for i in range(10):
        objects = [voc_object("a" if (i + j) % 3 else "b", (j, j, j + 5, j + 6)) for j in range(i % 4)]
        files[f"{i:02d}"] = voc_xml(f"{i:02d}.jpg", objects)
    return read_annotations(voc_dataset(root, files, splits={"train": ["00", "03", "07"]}), cache=False)


def test_image_view_and_offsets(index):
    assert len(index) == 10 and index.num_objects == sum(i % 4 for i in range(10))
    view = index.image(3)
    assert view.id == 3 and len(view.boxes) == 3 and view.boxes.base is not None
    np.testing.assert_array_equal(view.boxes[1], [1, 1, 6, 7])
    assert index.image(-1).id == 9
    with pytest.raises(IndexError, match="image index i=10 out of range for 10 images"):
        index.image(10)
    assert index.object_image.tolist() == np.repeat(np.arange(10), [i % 4 for i in range(10)]).tolist()
    assert [v.id for v in index] == list(range(10))
    assert "AnnotationIndex(images=10" in repr(index) and "ImageView(id=3" in repr(view)


def test_subset_reorders_and_keeps_splits(index):
    sub = index.subset([7, 3, 3])
    assert len(sub) == 3
    np.testing.assert_array_equal(sub.image(0).boxes, index.image(7).boxes)
    np.testing.assert_array_equal(sub.image(2).boxes, index.image(3).boxes)
    assert sub.relative_image_path(0) == index.relative_image_path(7)
    assert sub.annotation_path(1) == index.annotation_path(3)
    assert sub.splits["train"].tolist() == [0, 1]
    with pytest.raises(IndexError, match="subset: image id 11 out of range"):
        index.subset([11])
    assert len(index.subset([])) == 0


@settings(max_examples=60, deadline=None)
@given(ids=st.lists(st.integers(-10, 9), max_size=25))
def test_subset_matches_per_image_views(index, ids):
    sub = index.subset(ids)
    for k, i in enumerate(ids):
        np.testing.assert_array_equal(sub.image(k).boxes, index.image(i).boxes)
        np.testing.assert_array_equal(sub.image(k).labels, index.image(i).labels)
    assert sub.num_objects == sum(len(index.image(i).boxes) for i in ids)


@settings(max_examples=40, deadline=None)
@given(start=st.integers(-10, 9), length=st.integers(1, 10))
def test_subset_of_consecutive_images_equals_the_gathered_one(index, start, length):
    """A run of consecutive images (taken by slices) gives the arrays that gathering them one by
    one gives (the run reversed, then reversed back: two gathers, no run)."""
    ids = [(start + k) % 10 for k in range(min(length, 10 - start % 10))]
    run = index.subset(ids)
    gathered = index.subset(ids[::-1]).subset(list(range(len(ids)))[::-1])
    assert run.arrays().keys() == gathered.arrays().keys()
    for name, value in run.arrays().items():
        np.testing.assert_array_equal(value, gathered.arrays()[name], err_msg=name)
        assert value.dtype == gathered.arrays()[name].dtype and value.flags.writeable, name
    assert run.image_paths() == [index.relative_image_path(i) for i in ids]


def test_random_split_reproducible_disjoint_complete(index):
    a = index.random_split({"train": 0.7, "val": 0.3}, seed=5)
    b = index.random_split({"train": 0.7, "val": 0.3}, seed=5)
    c = index.random_split({"train": 0.7, "val": 0.3}, seed=6)
    paths = lambda ix: [ix.relative_image_path(i) for i in range(len(ix))]  # noqa: E731
    assert paths(a["train"]) == paths(b["train"])
    assert len(a["train"]) == 7 and len(a["val"]) == 3
    assert sorted(paths(a["train"]) + paths(a["val"])) == paths(index)
    assert paths(a["train"]) != paths(c["train"]) or paths(a["val"]) != paths(c["val"])
    with pytest.raises(ValueError, match="stratify='x'"):
        index.random_split({"a": 1}, stratify="x")
    with pytest.raises(ValueError, match="must be >= 0"):
        index.random_split({"a": -1, "b": 2})


def test_random_split_stratified_by_rarest_class(index):
    parts = index.random_split({"train": 0.5, "val": 0.5}, seed=0, stratify="class")
    rare = index.classes.index("b")
    with_b = lambda ix: int(sum((ix.image(i).labels == rare).any() for i in range(len(ix))))  # noqa: E731
    assert abs(with_b(parts["train"]) - with_b(parts["val"])) <= 1


def test_counts(index):
    counts = index.class_counts()
    assert sum(counts.values()) == index.num_objects
    per_image = index.class_counts("images")
    assert all(per_image[c] <= counts[c] for c in counts)
    assert per_image == {
        name: int(sum((index.image(i).labels == k).any() for i in range(len(index))))
        for k, name in enumerate(index.classes)
    }
    with pytest.raises(ValueError, match="unit='boxes'"):
        index.class_counts("boxes")
    with pytest.raises(KeyError, match="object attribute 'zzz' not found"):
        index.attribute_counts("zzz")


def test_memory_per_object(synth_root):
    index = read_annotations(synth_root)
    k = len(index.landmark_schema)
    sizes = index.nbytes()
    per_object_fields = ("boxes", "labels", "difficult", "truncated", "occluded", "object_attributes")
    per_object = sum(sizes[f] for f in per_object_fields) / index.num_objects
    assert per_object <= 64
    assert sizes["landmarks"] + sizes["visibility"] == index.num_objects * k * 9


def test_landmark_schema_rules():
    assert FACE5.flip_permutation().tolist() == [1, 0, 2, 4, 3]
    assert infer_flip_pairs(["l_ear", "nose", "r_ear", "eye_L", "eye_R", "LeftHand", "RightHand"]) == (
        (0, 2),
        (3, 4),
        (5, 6),
    )
    schema = LandmarkSchema.from_names(["a", "b", "c"], flip_pairs=[("a", "c")])
    assert schema.flip_pairs == ((0, 2),)
    assert LandmarkSchema.from_dict(schema.to_dict()) == schema
    with pytest.raises(ValueError, match="repeat"):
        LandmarkSchema(("a", "a"))
    with pytest.raises(ValueError, match=r"flip pair \(0, 3\)"):
        LandmarkSchema(("a", "b"), ((0, 3),))
    with pytest.raises(ValueError, match="names 'z'"):
        LandmarkSchema.from_names(["a", "b"], flip_pairs=[("a", "z")])


@given(st.lists(st.tuples(st.integers(0, 50), st.integers(0, 5)), max_size=20))
def test_ranges_helper(pairs):
    starts = np.array([s for s, _ in pairs], dtype=np.int64)
    lengths = np.array([n for _, n in pairs], dtype=np.int64)
    expected = [v for s, n in pairs for v in range(s, s + n)]
    assert _ranges(starts, lengths).tolist() == expected


@settings(max_examples=300, deadline=None)
@given(st.lists(st.one_of(st.binary(max_size=12), st.text(max_size=8)), max_size=12))
def test_packed_strings_are_each_string_encoded_alone(items):
    """pack_strings / unpack_strings (one joined encode and split) give what an encode and a
    decode per string give, for any bytes a file name can hold (surrogate escapes) and NULs."""
    strings = [s.decode("utf-8", "surrogateescape") if isinstance(s, bytes) else s for s in items]
    blob, offsets = pack_strings(strings)
    encoded = [s.encode("utf-8", "surrogateescape") for s in strings]
    assert blob.dtype == np.uint8 and blob.tobytes() == b"".join(encoded)
    assert offsets.tolist() == np.cumsum([0, *map(len, encoded)]).tolist()
    assert unpack_strings(blob, offsets) == strings
    assert [unpack_string(blob, offsets, i) for i in range(len(strings))] == strings
