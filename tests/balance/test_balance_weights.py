"""Sampling weights: strategies, aggregation, repeat factors, strategy strings."""

from __future__ import annotations

import math

import numpy as np
import pytest
from balance_helpers import six_image_index, tiny_index
from hypothesis import given, settings
from hypothesis import strategies as st

import detloader
from detloader.balance.groups import balance_groups, group_counts
from detloader.balance.weights import image_weights, parse_strategy, repeat_factors, sample_weights, strategy_weights


@pytest.fixture
def index():
    return six_image_index()


def test_public_entry_is_exported():
    assert detloader.sample_weights is sample_weights
    assert "sample_weights" in detloader.__all__


def test_strategies_on_counts():
    counts = np.array([100, 25, 4, 0])
    np.testing.assert_allclose(strategy_weights(counts, "inverse"), [0.01, 0.04, 0.25, 0])
    np.testing.assert_allclose(strategy_weights(counts, "sqrt"), [0.1, 0.2, 0.5, 0])
    np.testing.assert_allclose(strategy_weights(counts, "power", power=2), [1e-4, 1.6e-3, 1 / 16, 0])
    np.testing.assert_allclose(strategy_weights(counts, "power", power=0), [1, 1, 1, 0])
    beta = 0.9
    expected = [(1 - beta) / (1 - beta**n) for n in (100, 25, 4)] + [0]
    np.testing.assert_allclose(strategy_weights(counts, "effective", beta=beta), expected)
    # effective number interpolates: beta -> 0 gives no re-weighting, beta -> 1 gives 1/n
    np.testing.assert_allclose(strategy_weights(counts, "effective", beta=0.0), [1, 1, 1, 0])
    ratio = strategy_weights(counts, "effective", beta=1 - 1e-12)
    np.testing.assert_allclose(ratio[:3] / ratio[0], [1, 4, 25], rtol=1e-6)


def test_strategy_arguments_are_checked():
    counts = np.array([3, 1])
    with pytest.raises(ValueError, match="needs power="):
        strategy_weights(counts, "power")
    with pytest.raises(ValueError, match="beta=1.0"):
        strategy_weights(counts, "effective", beta=1.0)
    with pytest.raises(ValueError, match="strategy='magic'"):
        strategy_weights(counts, "magic")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="needs class_weights"):
        strategy_weights(counts, "explicit", names=("a", "b"))


def test_explicit_weights_by_name_id_and_tuple(index):
    w = strategy_weights(np.zeros(3), "explicit", class_weights={"b": 2.0, 2: 5.0}, names=("a", "b", "c"))
    assert w.tolist() == [1.0, 2.0, 5.0]  # unlisted groups weigh 1
    g = balance_groups(index, ("class", "image_class"))
    w = strategy_weights(np.zeros(6), "explicit", class_weights={("c", "night"): 3.0}, names=g.names)
    assert w.tolist() == [1, 1, 1, 1, 1, 3]
    with pytest.raises(ValueError, match="'d' is not a group"):
        strategy_weights(np.zeros(3), "explicit", class_weights={"d": 1.0}, names=("a", "b", "c"))
    with pytest.raises(ValueError, match="must be finite"):
        strategy_weights(np.zeros(3), "explicit", class_weights={"a": -1.0}, names=("a", "b", "c"))


def test_classic_explicit_weights_per_label():
    """weights = [2 if label == 1 else 1 for label in labels], done by the library."""
    idx = tiny_index([[0], [1], [0], [1], [2]])
    w = sample_weights(idx, "class", "explicit", class_weights={"b": 2})
    assert w.tolist() == [1, 2, 1, 2, 1]


def test_aggregation_and_background(index):
    g = balance_groups(index, "class")
    gw = np.array([1.0, 10.0, 100.0])
    assert image_weights(g, gw, aggregate="max").tolist() == [1, 10, 1, 10, 1, 100]
    assert image_weights(g, gw, aggregate="sum").tolist() == [3, 11, 1, 20, 1, 101]
    assert image_weights(g, gw, aggregate="mean").tolist() == [1, 5.5, 1, 10, 1, 50.5]
    # empty image 4: the smallest weight of the groups that occur, or a stated value
    assert image_weights(g, gw, background=0.0)[4] == 0.0
    assert image_weights(g, np.array([5.0, 7.0, 9.0]))[4] == 5.0
    # a group switched off (weight 0) does not switch off the empty images
    assert image_weights(g, np.array([0.0, 7.0, 9.0]))[4] == 7.0
    with pytest.raises(ValueError, match="aggregate='median'"):
        image_weights(g, gw, aggregate="median")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="background=-1"):
        image_weights(g, gw, background=-1)


def test_missing_units_fall_back_to_background(index):
    # by age: image 1's second object has no age; image 4 is empty -> background
    w = sample_weights(index, "attribute:age", "inverse", background=0.5)
    # adult 6 objects, child 3 -> 1/6, 1/3; max per image
    np.testing.assert_allclose(w, [1 / 3, 1 / 6, 1 / 3, 1 / 6, 0.5, 1 / 3])
    # by image class: image 4 has none
    w = sample_weights(index, "image_class", "inverse")
    np.testing.assert_allclose(w, [1 / 3, 1 / 3, 1 / 2, 1 / 3, 1 / 3, 1 / 2])


def test_sample_weights_by_hand(index):
    w = sample_weights(index, "class", "inverse")  # objects a 6, b 3, c 1
    np.testing.assert_allclose(w, [1 / 6, 1 / 3, 1 / 6, 1 / 3, 1 / 6, 1.0])
    w = sample_weights(index, "class", "sqrt", count="images")  # images a 4, b 2, c 1
    np.testing.assert_allclose(w, [0.5, 1 / math.sqrt(2), 0.5, 1 / math.sqrt(2), 0.5, 1.0])
    w = sample_weights(index, "class", "power", power=1.5, aggregate="sum")
    np.testing.assert_allclose(w[:2], [3 * 6**-1.5, 6**-1.5 + 3**-1.5])
    assert w.dtype == np.float64 and w.shape == (6,)


def test_repeat_factors_lvis_rule(index):
    # f_a = 4/6, f_b = 2/6, f_c = 1/6; t = 0.5 -> r_a = 1, r_b = sqrt(1.5), r_c = sqrt(3)
    r = repeat_factors(index, 0.5)
    np.testing.assert_allclose(r, [1, math.sqrt(1.5), 1, math.sqrt(1.5), 1, math.sqrt(3)])
    np.testing.assert_allclose(sample_weights(index, "class", "repeat_factor", threshold=0.5), r)
    # LVIS default t = 0.001: nothing here is that rare
    assert (repeat_factors(index) == 1).all()
    with pytest.raises(ValueError, match="threshold=0"):
        repeat_factors(index, 0)


def test_parse_strategy():
    assert parse_strategy("sqrt") == ("sqrt", {})
    assert parse_strategy("power:0.25") == ("power", {"power": 0.25})
    assert parse_strategy("effective:0.99") == ("effective", {"beta": 0.99})
    assert parse_strategy("repeat_factor:0.1") == ("repeat_factor", {"threshold": 0.1})
    with pytest.raises(ValueError, match="only power"):
        parse_strategy("inverse:2")
    with pytest.raises(ValueError, match="not a number"):
        parse_strategy("power:x")


def test_synthetic_dataset_balances_by_product(small_synth_root):
    idx = detloader.read_annotations(small_synth_root)
    w = sample_weights(idx, ("class", "image_class"), "inverse")
    assert w.shape == (len(idx),) and (w > 0).all()
    # every image's weight is one of its (class, image class) groups' weights
    g = balance_groups(idx, ("class", "image_class"))
    gw = strategy_weights(group_counts(g), "inverse")
    for i in range(len(idx)):
        own = gw[g.ids[g.image_of == i]]
        assert w[i] == (own.max() if len(own) else gw[gw > 0].min())


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.integers(0, 3), min_size=1, max_size=40),
    st.sampled_from(["inverse", "effective"]),
)
def test_inverse_image_class_weights_balance_classes_exactly(image_labels, strategy):
    """Law: with one unit per image and inverse weights, every class present gets the same
    share of the draws (1 / classes present); effective is between that and no balancing."""
    idx = tiny_index([[] for _ in image_labels], image_labels=image_labels, image_classes=("p", "q", "r", "s"))
    w = sample_weights(idx, "image_class", strategy, beta=0.5)
    p = w / w.sum()
    labels = np.array(image_labels)
    shares = np.array([p[labels == c].sum() for c in np.unique(labels)])
    if strategy == "inverse":
        np.testing.assert_allclose(shares, 1 / len(shares))
    else:
        raw = np.array([(labels == c).mean() for c in np.unique(labels)])
        # closer to uniform than the raw shares, never over-correcting the order
        assert np.abs(shares - 1 / len(shares)).max() <= np.abs(raw - 1 / len(shares)).max() + 1e-12


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.lists(st.integers(0, 2), max_size=4), min_size=1, max_size=30),
    st.floats(0.01, 1.0),
)
def test_repeat_factor_laws(labels, threshold):
    """r >= 1; r = 1 for images whose groups are all at least t-frequent; factors follow the
    formula for the image's rarest group."""
    idx = tiny_index(labels)
    r = repeat_factors(idx, threshold)
    assert (r >= 1).all()
    n = len(labels)
    f = {c: sum(c in x for x in labels) / n for c in range(3)}
    for i, x in enumerate(labels):
        want = max([max(1.0, math.sqrt(threshold / f[c])) for c in x], default=1.0)
        assert r[i] == pytest.approx(want)
