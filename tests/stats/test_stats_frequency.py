"""LVIS frequency groups (rare 1-10, common 11-100, frequent over 100 training images): the
boundaries, the dataset's own field, the train split, and the epoch shares raw and balanced."""

from __future__ import annotations

import json

import numpy as np
import pytest
from balance_helpers import long_tail_index, tiny_index
from helpers import voc_dataset, voc_object, voc_xml

from detloader.annotations.index import AnnotationIndex
from detloader.balance import make_balanced_sampler
from detloader.cli import main
from detloader.errors import DetloaderValueError
from detloader.stats import balance_report, class_frequency, dataset_stats, frequency_summary, training_frequency


def _images_per_class(index: AnnotationIndex) -> list[int]:
    return [len({int(i) for i in index.object_image[index.labels == c]}) for c in range(len(index.classes))]


def test_boundaries_10_11_100_101_images():
    sizes = [1, 10, 11, 100, 101, 0]  # class k in the first sizes[k] images, twice in each
    labels = [[k for k, n in enumerate(sizes) for _ in range(2) if i < n] for i in range(101)]
    index = tiny_index(labels, ("one", "ten", "eleven", "hundred", "hundred1", "none"))
    assert _images_per_class(index) == sizes
    groups, source = training_frequency(index)
    assert groups == {"one": "r", "ten": "r", "eleven": "c", "hundred": "c", "hundred1": "f", "none": None}
    assert source == "all 101 images (no train split)"
    summary = frequency_summary(index, groups, source)
    assert summary["rare"] == {"classes": 2, "images": 10, "objects": 22, "names": ["one", "ten"]}
    assert summary["common"] == {"classes": 2, "images": 100, "objects": 222, "names": ["eleven", "hundred"]}
    assert summary["frequent"] == {"classes": 1, "images": 101, "objects": 202, "names": ["hundred1"]}
    assert summary["without_training_images"] == ["none"]


def test_long_tail_groups_follow_the_image_counts():
    index = long_tail_index(600, 80, seed=1)
    counts = _images_per_class(index)
    groups, _ = training_frequency(index)
    for name, n in zip(index.classes, counts):
        want = None if n == 0 else "r" if n <= 10 else "c" if n <= 100 else "f"
        assert groups[name] == want, (name, n)
    assert {"r", "c", "f"} <= set(groups.values())
    stats = dataset_stats(index)["frequency_groups"]
    assert sum(stats[g]["classes"] for g in ("rare", "common", "frequent")) == sum(n > 0 for n in counts)
    assert sum(stats[g]["objects"] for g in ("rare", "common", "frequent")) == index.num_objects


def test_the_train_split_decides():
    base = tiny_index([[0]] * 12 + [[1]] * 3 + [[0, 1, 1]] * 200)  # a: 12 train images, b: 3
    index = AnnotationIndex(root=base.root, arrays=base.arrays(), vocab=base.vocab,
                            splits={"train": np.arange(15), "val": np.arange(15, 215)})
    groups, source = training_frequency(index)
    assert groups == {"a": "c", "b": "r", "c": None} and source == "the train split (15 images)"
    val = index.split("val")  # its train split is empty: counted on its own images
    assert training_frequency(val)[0] == {"a": "f", "b": "f", "c": None}


def test_the_datasets_own_frequency_field():
    assert class_frequency(["a", "b"], [500, 0], {"a": "r", "b": "f"}) == {"a": "r", "b": "f"}
    with pytest.raises(DetloaderValueError, match=r"class 'b' has no frequency"):
        class_frequency(["a", "b"], [1, 1], {"a": "r"})
    with pytest.raises(DetloaderValueError, match=r"class 'a': frequency='rare' is not one of"):
        class_frequency(["a", "b"], [1, 1], {"a": "rare", "b": "c"})


@pytest.mark.parametrize("strategy", ["repeat_factor:0.05", "sqrt"])
def test_epoch_shares_raw_and_balanced(strategy):
    index = long_tail_index(500, 60, seed=2)
    report = balance_report(index, strategy, draw=False)
    groups, _ = training_frequency(index)
    letter = np.array([{"r": 0, "c": 1, "f": 2}[groups[c]] for c in index.classes])[index.labels]
    weight = np.asarray(make_balanced_sampler(index, strategy).expected_counts())[index.object_image]
    shares = report.to_dict()["frequency_shares"]
    for k, name in enumerate(("rare", "common", "frequent")):
        assert shares[name]["raw"] == pytest.approx((letter == k).mean(), abs=1e-4)
        assert shares[name]["balanced"] == pytest.approx(weight[letter == k].sum() / weight.sum(), abs=1e-4)
    assert shares["rare"]["balanced"] > 1.3 * shares["rare"]["raw"]  # balancing lifts the rare classes


def test_lvis_setting_parses_and_leaves_500_images_alone():
    """repeat_factor:0.001 (the LVIS paper's threshold) repeats classes in under 0.1 % of the
    images: none of 500 images, where each class present is in at least one."""
    report = balance_report(long_tail_index(500, 60, seed=2), "repeat_factor:0.001", draw=False)
    assert np.allclose(report.frequency_expected, report.frequency_raw)
    assert report.frequency_raw.sum() == pytest.approx(1.0)


def test_cli_stats_json_groups_and_shares(tmp_path, capsys):
    files = {f"t{i:02d}": voc_xml(f"t{i:02d}.jpg", [voc_object("a", (1, 1, 20, 20))]) for i in range(12)}
    files |= {f"r{i}": voc_xml(f"r{i}.jpg", [voc_object("b", (1, 1, 20, 20))]) for i in range(3)}
    files |= {f"v{i}": voc_xml(f"v{i}.jpg", [voc_object("c", (1, 1, 20, 20)), voc_object("a", (5, 5, 30, 30))])
              for i in range(2)}
    root = voc_dataset(tmp_path / "voc", files, splits={"train": [s for s in files if s[0] != "v"],
                                                        "val": ["v0", "v1"]})
    assert main(["stats", str(root), "--balance", "repeat_factor:0.001", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    groups = data["stats"]["frequency_groups"]
    assert groups["rare"] == {"classes": 1, "images": 3, "objects": 3, "names": ["b"]}
    assert groups["common"] == {"classes": 1, "images": 14, "objects": 14, "names": ["a"]}
    assert groups["frequent"]["classes"] == 0 and groups["without_training_images"] == ["c"]
    assert groups["source"] == "the train split (15 images)"
    shares = data["frequency_shares"]
    assert shares["rare"] == {"raw": pytest.approx(3 / 19, abs=1e-4), "balanced": pytest.approx(3 / 19, abs=1e-4)}
    assert shares["common"]["raw"] == pytest.approx(14 / 19, abs=1e-4)
    assert main(["stats", str(root), "--balance", "repeat_factor:0.5", "--json"]) == 0
    lifted = json.loads(capsys.readouterr().out)["frequency_shares"]
    assert lifted["rare"]["balanced"] > lifted["rare"]["raw"] == pytest.approx(3 / 19, abs=1e-4)
    assert main(["stats", str(root), "--split", "val", "--json"]) == 0  # groups from the train split still
    val = json.loads(capsys.readouterr().out)["stats"]["frequency_groups"]
    assert val["common"]["images"] == 2 and val["without_training_images"] == ["c"]
    assert main(["stats", str(root), "--balance", "repeat_factor:0.001"]) == 0
    out = capsys.readouterr().out
    assert "frequency groups by training images" in out and "1 classes in no group (no training image): c" in out
    assert "share of an epoch's objects by frequency group, raw -> balanced: rare 15.8 %" in out
