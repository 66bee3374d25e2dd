"""The chi-square goodness-of-fit test: critical values, closed forms, pooling."""

from __future__ import annotations

import math

import pytest
from balance_helpers import chi_square_sf, chi_square_test
from hypothesis import given, settings
from hypothesis import strategies as st


@pytest.mark.parametrize(
    "x, dof",
    [(3.841458820694124, 1), (5.991464547107979, 2), (18.307038053275146, 10), (124.34211340400407, 100)],
)
def test_chi_square_critical_values(x, dof):
    """Tabulated 95 % critical values give p = 0.05."""
    assert chi_square_sf(x, dof) == pytest.approx(0.05, rel=1e-9)


@settings(max_examples=80, deadline=None)
@given(st.floats(1e-6, 400.0))
def test_chi_square_closed_forms(x):
    """dof 2: exp(-x/2); dof 1: erfc(sqrt(x/2)); dof 4: (1 + x/2) exp(-x/2)."""
    assert chi_square_sf(x, 2) == pytest.approx(math.exp(-x / 2), rel=1e-10, abs=1e-300)
    assert chi_square_sf(x, 1) == pytest.approx(math.erfc(math.sqrt(x / 2)), rel=1e-9, abs=1e-300)
    assert chi_square_sf(x, 4) == pytest.approx((1 + x / 2) * math.exp(-x / 2), rel=1e-9, abs=1e-300)


def test_chi_square_test_pools_small_cells_and_rejects_the_impossible():
    r = chi_square_test([10, 20, 30, 1, 0], [10, 20, 30, 0.6, 0.4])
    assert r.cells == 4 and r.dof == 3 and r.statistic == pytest.approx(0.0)
    assert chi_square_test([5, 5, 1], [5.5, 5.5, 0]).p_value == 0.0
    with pytest.raises(ValueError, match="3 cells"):
        chi_square_test([1, 2, 3], [1, 2])
