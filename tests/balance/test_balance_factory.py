"""make_balanced_sampler: strategy strings, weights and samplers to a sampler."""

from __future__ import annotations

import numpy as np
import pytest
from torch.utils.data import SequentialSampler

import detloader
from detloader.balance import (
    BalancedBatchSampler,
    ClassAwareSampler,
    RepeatFactorSampler,
    WeightedSampler,
    class_members,
    make_balanced_sampler,
    sample_weights,
)


def test_make_balanced_sampler(small_synth_root):
    idx = detloader.read_annotations(small_synth_root)
    ready = SequentialSampler(range(3))
    assert make_balanced_sampler(idx, ready) is ready
    s = make_balanced_sampler(idx, "sqrt", seed=4)
    assert isinstance(s, WeightedSampler) and len(s) == len(idx) and s.seed == 4
    np.testing.assert_allclose(
        s.probabilities(), sample_weights(idx, "class", "sqrt") / sample_weights(idx, "class", "sqrt").sum()
    )
    assert isinstance(make_balanced_sampler(idx, "repeat_factor:0.5"), RepeatFactorSampler)
    assert isinstance(make_balanced_sampler(idx, "class_aware", by="image_class"), ClassAwareSampler)
    assert isinstance(make_balanced_sampler(idx, "power:0.3", num_samples=7), WeightedSampler)
    explicit = make_balanced_sampler(idx, {"sunglasses": 10.0})
    w = sample_weights(idx, "class", "explicit", class_weights={"sunglasses": 10.0})
    np.testing.assert_allclose(explicit.probabilities(), w / w.sum())
    for bad, match in [("magic", "balance='magic'"), ("power", "needs power"), (3, "balance=3"),
                       ("explicit", "needs the weights")]:
        with pytest.raises(ValueError, match=match):
            make_balanced_sampler(idx, bad)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="num_samples=5 with balance='repeat_factor'"):
        make_balanced_sampler(idx, "repeat_factor", num_samples=5)


def test_class_members_feed_the_class_samplers(small_synth_root):
    idx = detloader.read_annotations(small_synth_root)
    names, members = class_members(idx)
    s = BalancedBatchSampler.from_index(idx, 2, 2, seed=0)
    assert s.num_items <= len(idx) and len(s) >= 1
    assert ClassAwareSampler.from_index(idx).num_samples == len(np.unique(np.concatenate(members)))
