"""balance_report and group_totals: raw vs balanced per epoch, notes, units."""

from __future__ import annotations

import numpy as np
import pytest
from balance_helpers import LABELS, tiny_index

import detloader
from detloader.annotations.index import MISSING
from detloader.balance import BalancedBatchSampler, WeightedSampler, balance_groups, repeat_factors
from detloader.stats import balance_report, group_totals


def test_group_totals_objects_and_images():
    idx = tiny_index(LABELS)
    g = balance_groups(idx, "class")
    draws = np.array([2.0, 0, 1, 0, 5, 1])
    assert group_totals(g, draws, "objects").tolist() == [8, 0, 1]  # 2x3 a + 1 a + (c, a)
    assert group_totals(g, draws, "images").tolist() == [4, 0, 1]
    assert group_totals(g, np.ones(6)).tolist() == [6, 3, 1]


def test_balance_report_weighted_is_analytic():
    idx = tiny_index(LABELS)
    report = balance_report(idx, "inverse", seed=3)
    w = np.array([1 / 6, 1 / 3, 1 / 6, 1 / 3, 1 / 6, 1.0])  # inverse object counts, max per image
    p = w / w.sum()
    m = np.array([[3, 0, 0], [1, 1, 0], [1, 0, 0], [0, 2, 0], [0, 0, 0], [1, 0, 1]])
    np.testing.assert_allclose(report.expected, 6 * p @ m)
    assert report.raw.tolist() == [6, 3, 1]
    assert report.epoch_length == pytest.approx({"raw": 6.0, "balanced": 6.0})
    d = report.to_dict()
    assert set(d) >= {"raw", "balanced", "drawn", "imbalance_ratio"} and d["raw"] == {"a": 6, "b": 3, "c": 1}
    # the drawn column is a real epoch of the same sampler
    drawn = np.bincount(WeightedSampler(w, seed=3).indices(), minlength=6)
    np.testing.assert_allclose(report.drawn, drawn @ m)


def test_balance_report_repeat_factor_and_notes():
    idx = tiny_index(LABELS)
    report = balance_report(idx, "repeat_factor:0.5")
    r = repeat_factors(idx, 0.5)
    m = np.array([[3, 0, 0], [1, 1, 0], [1, 0, 0], [0, 2, 0], [0, 0, 0], [1, 0, 1]])
    np.testing.assert_allclose(report.expected, r @ m)
    assert report.epoch_length["balanced"] == pytest.approx(r.sum())
    assert not report.notes
    assert "every repeat factor is 1" in balance_report(idx, "repeat_factor").notes[0]


def test_balance_report_units_and_image_keys():
    idx = tiny_index(LABELS, image_labels=[0, 0, 1, 0, MISSING, 1])
    images = balance_report(idx, "inverse", unit="images", draw=False)
    assert images.raw.tolist() == [4, 2, 1] and images.drawn is None
    by_image = balance_report(idx, "inverse", by="image_class")
    assert by_image.unit == "images" and by_image.raw.tolist() == [3, 2]
    # inverse on image classes: equal expected shares for the image classes; the image
    # without a class keeps the background weight
    e = by_image.expected
    assert e[0] == pytest.approx(e[1])


def test_balance_report_of_a_batch_sampler(small_synth_root):
    idx = detloader.read_annotations(small_synth_root)
    from detloader.balance import class_members

    s = BalancedBatchSampler(class_members(idx)[1], 2, 2, num_batches=50, seed=0)
    report = balance_report(idx, s)
    assert report.strategy == "BalancedBatchSampler"
    assert report.epoch_length["balanced"] == pytest.approx(200)
    assert report.max_deviation() is not None
