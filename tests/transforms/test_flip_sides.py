"""Flips and names with a side: mirror classes swap, one-sided classes are never mirrored, landmarks
without flip pairs are named, and the training run's flip can be set or turned off."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from detloader import read_annotations
from detloader.annotations.landmarks import ClassFlip, FlipPairWarning, LandmarkSchema
from detloader.dataset import DetectionDataset
from detloader.errors import DetloaderValueError
from detloader.transforms import Compose, RandomAffine, RandomHorizontalFlip, Resize
from detloader.transforms.base import Annotated, may_mirror
from tests.helpers import keypoints_xml, voc_dataset, voc_object, voc_xml


@pytest.mark.parametrize(
    ("classes", "pairs", "one_sided"),
    [
        (("redleft", "redright", "green"), [("redleft", "redright")], []),
        (("redleft", "greenleft", "yellowleft", "red"), [], ["redleft", "greenleft", "yellowleft"]),
        (("left_hand", "right_hand", "face"), [("left_hand", "right_hand")], []),
        (("LeftArrow", "RightArrow"), [("LeftArrow", "RightArrow")], []),
        (("TurnLEFT", "turnright"), [("TurnLEFT", "turnright")], []),  # case-insensitive partner
        (("turn_left_then_right", "turn_right_then_left"), [("turn_left_then_right", "turn_right_then_left")], []),
        (("bright", "upright", "cleft_lip", "copyright", "playwright"), [], []),  # words, not sides
        (("soloRight", "car"), [], ["soloRight"]),
        (("hand_l", "hand_r", "r", "leftover", "birthright"), [("hand_l", "hand_r")], []),  # a lone letter pairs only
    ],
)
def test_class_sides_are_found_in_the_names(classes, pairs, one_sided):
    flip = ClassFlip.infer(classes)
    assert flip.named_pairs() == pairs
    assert [classes[i] for i in flip.one_sided] == one_sided


def test_given_class_pairs_are_the_whole_map_and_are_checked():
    flip = ClassFlip.from_pairs(("redleft", "redright", "yellowleft"), [("redleft", "redright")])
    assert flip.one_sided == () and flip.mirror(np.array([0, 1, 2])).tolist() == [1, 0, 2]
    with pytest.raises(DetloaderValueError, match=r"names 'blue', not one of \['a', 'b'\]"):
        ClassFlip.from_pairs(("a", "b"), [("a", "blue")])
    with pytest.raises(DetloaderValueError, match="twice"):
        ClassFlip.from_pairs(("a", "b", "c"), [("a", "b"), ("b", "c")])


@given(st.lists(st.sampled_from(["redleft", "redright", "left_hand", "right_hand", "car", "x_left", "Bright"]),
                unique=True, min_size=1), st.data())
def test_mirroring_twice_gives_the_labels_back(classes, data):
    flip = ClassFlip.infer(classes)
    labels = np.array(data.draw(st.lists(st.integers(0, len(classes) - 1), max_size=8)), dtype=np.int64)
    once = flip.mirror(labels)
    fixed = set(flip.one_sided)
    assert (once is None) == any(int(v) in fixed for v in labels)
    if once is not None:
        assert np.array_equal(flip.mirror(once), labels)
        # a mirror class is a name with its side swapped
        for before, after in zip(labels, once):
            if before != after:
                a, b = classes[before].lower(), classes[after].lower()
                assert a.replace("left", "\0").replace("right", "left").replace("\0", "right") == b


def _record(labels, flip: ClassFlip | None) -> Annotated:
    image = np.zeros((20, 40, 3), np.uint8)
    image[:, :10] = 255  # the left quarter is white
    boxes = [[2, 2, 8, 8]] * len(labels)
    return Annotated.create(image, boxes, labels, class_flip=flip)


def test_flip_swaps_mirror_classes_and_leaves_one_sided_images_alone():
    flip = ClassFlip.infer(("redleft", "redright", "yellowleft", "car"))
    rng = np.random.default_rng(0)
    out = RandomHorizontalFlip(p=1.0)(_record([0, 1, 3], flip), rng)
    assert out.labels.tolist() == [1, 0, 3] and out.boxes[0].tolist() == [32, 2, 38, 8]
    assert out.image[0, -1, 0] == 255 and out.affine[0] < 0
    kept = RandomHorizontalFlip(p=1.0)(_record([0, 2], flip), rng)  # yellowleft has no mirror class
    assert kept.labels.tolist() == [0, 2] and kept.boxes[0].tolist() == [2, 2, 8, 8]
    assert kept.image[0, 0, 0] == 255 and kept.affine[0] > 0


def test_affine_mirror_follows_the_same_rule():
    flip = ClassFlip.infer(("redleft", "redright", "yellowleft"))
    affine = RandomAffine(translate=0.0, scale=(1.0, 1.0), mirror=1.0, min_visibility=0.0)
    out = affine(_record([0, 1], flip), np.random.default_rng(0))
    assert out.affine[0] < 0 and out.labels.tolist() == [1, 0]
    kept = affine(_record([0, 2], flip), np.random.default_rng(0))
    assert kept.affine[0] > 0 and kept.labels.tolist() == [0, 2]


def test_what_mirrors():
    assert may_mirror(Compose([Resize(32), Compose([RandomHorizontalFlip()])]))
    assert not may_mirror(Compose([RandomHorizontalFlip(p=0.0), Resize(32)]))
    assert may_mirror(RandomAffine(mirror=0.5)) and not may_mirror(RandomAffine()) and not may_mirror(None)


def _traffic_lights(root: Path) -> Path:
    """Three images: a redleft arrow, a yellowleft arrow beside a plain red light, a plain green."""
    files = {
        "a": voc_xml("a.jpg", [voc_object("redleft", (4, 4, 20, 20))]),
        "b": voc_xml("b.jpg", [voc_object("yellowleft", (4, 4, 20, 20)), voc_object("red", (30, 4, 40, 20))]),
        "c": voc_xml("c.jpg", [voc_object("green", (4, 4, 20, 20))]),
    }
    return voc_dataset(root, files)


def test_dataset_warns_once_and_never_mirrors_one_sided_images(tmp_path: Path):
    index = read_annotations(_traffic_lights(tmp_path / "lights"))
    flip = Compose([RandomHorizontalFlip(p=1.0)])
    with pytest.warns(FlipPairWarning, match=r"classes 'redleft', 'yellowleft' are named for one side.*"
                      r"the 2 of 3 images holding them are never mirrored.*--class-flip-pairs none.*"
                      r"--hflip 0.*class_partner_missing"):
        ds = DetectionDataset(index, flip, seed=0)
    assert index.summary()["class_flips"] == {"pairs": [], "one_sided": ["redleft", "yellowleft"]}
    mirrored = {index.relative_image_path(i): ds[i].scale[0] < 0 for i in range(len(ds))}
    assert mirrored == {"JPEGImages/a.jpg": False, "JPEGImages/b.jpg": False, "JPEGImages/c.jpg": True}
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        DetectionDataset(index, Compose([RandomHorizontalFlip(p=0.0)]), seed=0)  # no flip: nothing to say
        said = DetectionDataset(index, flip, seed=0, class_flip_pairs=[])  # the user says: no sides
    assert all(said[i].scale[0] < 0 for i in range(len(said)))
    paired = DetectionDataset(index, flip, seed=0, class_flip_pairs=[("redleft", "yellowleft")])
    assert [index.classes[v] for v in paired[0].labels] == ["yellowleft"]


def test_landmarks_without_pairs_are_named_when_flipped(tmp_path: Path):
    points = keypoints_xml([("p0", 6, 6, 2), ("p1", 18, 6, 2), ("p2", 12, 16, 2)])
    root = voc_dataset(tmp_path / "pts", {"a": voc_xml("a.jpg", [voc_object("thing", (4, 4, 20, 20), extra=points)])})
    index = read_annotations(root)
    assert index.landmark_schema.names == ("p0", "p1", "p2") and index.landmark_schema.flip_pairs == ()
    flip = RandomHorizontalFlip(p=1.0)
    with pytest.warns(FlipPairWarning, match=r"landmarks 'p0', 'p1', 'p2' have no left/right flip pair.*"
                      r"flip_pairs=.*--flip-pairs A=B.*--flip-pairs none.*flip_pairs_missing"):
        DetectionDataset(index, flip, seed=0)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        DetectionDataset(index, None, seed=0)  # no transform, no flip: no warning
        symmetric = DetectionDataset(index, flip, seed=0, flip_pairs=[])
        paired = DetectionDataset(index, flip, seed=0, flip_pairs=[("p0", "p1")])
    assert symmetric[0].landmarks[0].tolist() == [[64 - 6, 6], [64 - 18, 6], [64 - 12, 16]]
    assert paired[0].landmarks[0].tolist() == [[64 - 18, 6], [64 - 6, 6], [64 - 12, 16]]
    with pytest.raises(DetloaderValueError, match="names 'eye', not one of"):
        DetectionDataset(index, flip, flip_pairs=[("eye", "p1")])


def test_a_schema_said_symmetric_round_trips():
    schema = LandmarkSchema.from_names(["p0", "p1"], [])
    assert schema.symmetric and schema.flip_problems() == []
    assert LandmarkSchema.from_dict(schema.to_dict()) == schema
    assert not LandmarkSchema.from_dict(LandmarkSchema.from_names(["p0", "p1"]).to_dict()).symmetric


def test_train_settings_record_the_flip(tmp_path: Path):
    from detloader.cli.parser import build_parser
    from detloader.cli.train import _config
    from detloader.train import TrainConfig
    from detloader.train.run_data import train_transform

    args = build_parser().parse_args(
        ["train", "--hflip", "0", "--class-flip-pairs", "redleft=redright,a=b", "--flip-pairs", "none",
         "--out", str(tmp_path)]
    )
    config = _config(args)
    assert config.hflip == 0.0 and config.flip_pairs == ()
    assert config.class_flip_pairs == (("redleft", "redright"), ("a", "b"))
    config.save(tmp_path / "config.json")
    saved = json.loads((tmp_path / "config.json").read_text())
    assert saved["hflip"] == 0.0 and saved["class_flip_pairs"] == [["redleft", "redright"], ["a", "b"]]
    assert TrainConfig.from_dict(saved) == config
    assert not may_mirror(train_transform(64, hflip=0.0)) and may_mirror(train_transform(64))
    with pytest.raises(DetloaderValueError, match=r"hflip=1.5 must be a probability"):
        TrainConfig(hflip=1.5)
    with pytest.raises(SystemExit):
        build_parser().parse_args(["train", "--class-flip-pairs", "redleft"])
