"""RepeatFactorSampler: stochastic rounding, shuffling."""

from __future__ import annotations

import numpy as np

from detloader.balance import RepeatFactorSampler


def test_repeat_factor_sampler_rounds_stochastically():
    r = np.array([1.0, 1.5, 2.25, 3.0, 0.5])
    s = RepeatFactorSampler(r, seed=1)
    extra = np.zeros(5)
    epochs = 2000
    for epoch in range(epochs):
        s.set_epoch(epoch)
        counts = np.bincount(s.indices(), minlength=5)
        assert (counts >= np.floor(r)).all() and (counts <= np.ceil(r)).all()
        assert len(s) == counts.sum()
        extra += counts - np.floor(r)
    # extra copies ~ Binomial(epochs, frac(r)): within 4 sd
    frac = r - np.floor(r)
    sd = np.sqrt(epochs * frac * (1 - frac))
    keep = sd > 0
    assert (np.abs(extra - epochs * frac)[keep] / sd[keep]).max() < 4
    assert (extra[~keep] == 0).all()
    np.testing.assert_allclose(s.expected_counts(), r)


def test_repeat_factor_sampler_shuffles():
    s = RepeatFactorSampler(np.full(50, 2.0), seed=0)
    idx = s.indices()
    assert sorted(idx.tolist()) == sorted(list(range(50)) * 2)
    assert idx.tolist() != sorted(idx.tolist())
    assert RepeatFactorSampler(np.full(50, 2.0), shuffle=False).indices().tolist() == sorted(idx.tolist())
