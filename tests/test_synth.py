"""The synthetic dataset: deterministic, imbalanced as asked, with every feature the demo needs."""

from __future__ import annotations

import filecmp

import numpy as np
import pytest

from detloader import FACE5, read_annotations
from detloader.synth import make_synthetic


def test_deterministic_by_seed(tmp_path):
    a = make_synthetic(tmp_path / "a", 12, seed=4)
    b = make_synthetic(tmp_path / "b", 12, seed=4)
    c = make_synthetic(tmp_path / "c", 12, seed=5)
    cmp = filecmp.dircmp(a / "Annotations", b / "Annotations")
    assert not cmp.diff_files and not cmp.left_only
    assert not filecmp.dircmp(a / "JPEGImages", b / "JPEGImages").diff_files
    assert (a / "Annotations" / "synth_000003.xml").read_bytes() != (
        c / "Annotations" / "synth_000003.xml"
    ).read_bytes()


def test_contents_of_default_dataset(synth_root):
    index = read_annotations(synth_root)
    assert len(index) == 200 and not index.problems
    assert index.landmark_schema == FACE5
    assert index.classes == ("face", "masked", "sunglasses")
    assert set(index.image_classes) == {"indoor", "outdoor", "night"}
    assert (index.objects_per_image == 0).sum() > 0  # some images without objects
    vis = index.visibility
    assert (vis == 1).any() and (vis == 2).any()
    masked = index.labels == index.classes.index("masked")
    assert (vis[masked][:, 3:] == 1).all() or (vis[masked][:, 3:] <= 1).all()
    assert sorted(index.splits) == ["train", "val"] and len(index.splits["val"]) == 40
    first = index.image(0)
    assert first.path.is_file() and first.size == (320, 240)


@pytest.mark.slow
def test_class_imbalance_follows_frequencies(tmp_path):
    root = make_synthetic(tmp_path / "big", 3000, seed=1, write_images=False)
    index = read_annotations(root, check_images=False)
    shares = np.bincount(index.labels) / index.num_objects
    np.testing.assert_allclose(shares, [0.90, 0.08, 0.02], atol=0.015)


def test_image_pool_links(tmp_path):
    root = make_synthetic(tmp_path / "p", 10, seed=0, image_pool=3)
    assert (root / "JPEGImages" / "synth_000007.jpg").stat().st_ino == (
        root / "JPEGImages" / "synth_000001.jpg"
    ).stat().st_ino
    assert len(read_annotations(root)) == 10


def test_bad_arguments():
    with pytest.raises(ValueError, match="images=-1"):
        make_synthetic("unused", -1)
    with pytest.raises(ValueError, match="same length"):
        make_synthetic("unused", 1, classes=("a",), class_frequencies=(0.5, 0.5))
