"""balance_report and group_totals: raw vs balanced per epoch, notes, units."""

from __future__ import annotations

import numpy as np
import pytest
from balance_helpers import LABELS, tiny_index

import detloader
from detloader.annotations.index import MISSING
from detloader.balance import BalancedBatchSampler, WeightedSampler, balance_groups, repeat_factors
from detloader.stats import EmptyIndexError, balance_report, group_totals


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


def test_balance_report_of_no_images_says_so():
    with pytest.raises(EmptyIndexError, match="the index holds no images"):
        balance_report(tiny_index([]), "sqrt")
    assert issubclass(EmptyIndexError, ValueError)


def test_balance_report_warns_when_one_image_repeats_many_times():
    idx = tiny_index([[0]] * 200 + [[1]])  # class b: one object in img200
    report = balance_report(idx, "inverse", draw=False)
    # inverse weights 1/200 (a) and 1 (b): img200 is drawn 201 * 1 / (200/200 + 1) times
    assert report.most_repeated == "img200.jpg" and report.max_repeats == pytest.approx(100.5)
    (warning,) = report.warnings
    assert "img200.jpg is drawn 100.5 times per epoch" in warning and "sqrt or repeat_factor" in warning
    assert report.to_dict()["max_repeats"] == {"image": "img200.jpg", "expected": 100.5}
    assert report.to_dict()["warnings"] == [warning]
    assert "power:0.25" in balance_report(idx, "sqrt", draw=False).warnings[0]  # 13.3 times
    assert not balance_report(idx, "sqrt", draw=False, repeat_warning=20).warnings
    # the expectation follows the epoch length: half the draws, half the repeats
    assert balance_report(idx, "inverse", draw=False, num_samples=100).max_repeats == pytest.approx(50)


def test_balance_report_of_mild_strategies_has_no_warning():
    for strategy in ("inverse", "sqrt", "repeat_factor:0.5", "class_aware"):
        report = balance_report(tiny_index(LABELS), strategy, draw=False)
        assert report.most_repeated == "img5.jpg" and report.max_repeats < 3 and not report.warnings
