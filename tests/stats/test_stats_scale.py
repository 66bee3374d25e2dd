"""dataset_stats and class_counts on ~1,200 long-tail classes equal their numpy references."""

from __future__ import annotations

import numpy as np
import pytest
from balance_helpers import long_tail_index

from detloader.stats import dataset_stats
from detloader.stats.describe import class_figures


@pytest.fixture(scope="module")
def index():
    return long_tail_index(3000, 1200, seed=4)


def test_class_counts_equal_numpy_reference(index):
    k = len(index.classes)
    pairs = np.unique(index.object_image * k + index.labels)
    ref_images = np.bincount(pairs % k, minlength=k)
    ref_objects = np.bincount(index.labels, minlength=k)
    assert list(index.class_counts("images").values()) == ref_images.tolist()
    assert list(index.class_counts("objects").values()) == ref_objects.tolist()
    assert (ref_images == 0).sum() > 50 and ref_objects.max() > 500  # a long tail, some classes empty


def test_dataset_stats_per_class_figures_equal_numpy_reference(index):
    stats = dataset_stats(index)
    boxes = index.boxes.astype(np.float64)
    area = np.sqrt(np.clip((boxes[:, 2] - boxes[:, 0]) * (boxes[:, 3] - boxes[:, 1]), 0, None))
    k = len(index.classes)
    pairs = np.unique(index.object_image * k + index.labels)
    ref_images = np.bincount(pairs % k, minlength=k)
    assert len(stats["classes"]) == k
    for c, name in enumerate(index.classes):
        mask = index.labels == c
        assert stats["classes"][name] == {"objects": int(mask.sum()), "images": int(ref_images[c])}
        expected = round(float(np.median(area[mask])), 2) if mask.any() else None
        assert stats["box_sqrt_area_median"][name] == expected
    assert stats["empty_classes"] == [n for c, n in enumerate(index.classes) if not (index.labels == c).any()]


def test_class_figures_on_no_objects():
    objects, images, medians = class_figures(np.zeros(0, np.int32), np.zeros(0, np.int64), np.zeros(0), 3)
    assert objects.tolist() == images.tolist() == [0, 0, 0]
    assert np.isnan(medians).all()


def test_class_median_equals_np_median_with_ties_and_even_counts():
    rng = np.random.default_rng(5)
    labels = rng.integers(0, 7, 400)
    values = rng.integers(0, 6, 400).astype(np.float64) / 2  # many ties
    image = np.sort(rng.integers(0, 50, 400))
    _, _, medians = class_figures(labels, image, values, 8)
    for c in range(7):
        assert medians[c] == np.median(values[labels == c])
    assert np.isnan(medians[7])


@pytest.mark.parametrize("cpus", [1, 2, 4])
def test_box_quantiles_on_threads_equal_numpy(monkeypatch, cpus):
    """Past a million values the four box-size partitions run on threads: same figures."""
    from detloader.stats import describe

    monkeypatch.setattr(describe, "usable_cpus", lambda: cpus)
    rng = np.random.default_rng(3)
    columns = {name: (rng.gamma(2.0, 30.0, 300_000 + k), 2 + 2 * (k == 3)) for k, name in enumerate("whar")}
    got = describe._box_quantiles(columns)
    assert got.pop("quantiles") == list(describe.QUANTILES)
    for name, (values, digits) in columns.items():
        assert got[name] == [round(float(v), digits) for v in np.quantile(values, describe.QUANTILES)]
