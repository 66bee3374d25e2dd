"""ClassAwareSampler and members_from_labels: classes visited equally, members cycled."""

from __future__ import annotations

import numpy as np
from balance_helpers import P_MIN, chi_square_test, tiny_index

from detloader.balance import ClassAwareSampler, members_from_labels


def test_members_from_labels():
    assert [m.tolist() for m in members_from_labels([2, 0, -1, 2, 0])] == [[1, 4], [], [0, 3]]


def test_class_aware_visits_classes_equally_and_cycles_members():
    members = [[0, 1, 2, 3, 4, 5, 6, 7], [8, 9], [10]]  # very unequal classes
    s = ClassAwareSampler(members, num_samples=31, seed=0)
    idx = s.indices()
    cls = np.array([0] * 8 + [1] * 2 + [2])[idx]
    assert sorted(np.bincount(cls, minlength=3).tolist()) == [10, 10, 11]  # 31 / 3 each, +-1
    # within a class: every member once before any member twice
    first_eight = idx[cls == 0][:8]
    assert sorted(first_eight.tolist()) == list(range(8))
    # the expectation: each class gets num_samples / 3, shared equally by its members
    np.testing.assert_allclose(s.expected_counts(), [31 / 3 / 8] * 8 + [31 / 3 / 2] * 2 + [31 / 3])


def test_class_aware_frequencies_match_expectation():
    idx = tiny_index([[0, 0], [0], [0, 1], [1], [2], [0]])
    s = ClassAwareSampler.from_index(idx, num_samples=30_000, seed=2)
    counts = np.bincount(s.indices(), minlength=6)
    assert chi_square_test(counts, s.expected_counts()).p_value > P_MIN
