"""Pearson's chi-square goodness-of-fit test, to check frequencies against their expectation.

The tail probability is exact (the regularised incomplete gamma function); no scipy.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from detloader.errors import DetloaderValueError


def chi_square_sf(statistic: float, dof: int) -> float:
    """``P(X >= statistic)`` for X chi-square with ``dof`` degrees of freedom: the regularised
    upper incomplete gamma ``Q(dof / 2, statistic / 2)`` (series below ``a + 1``, Lentz's
    continued fraction above; relative accuracy about 1e-12)."""
    if dof < 1:
        raise DetloaderValueError(f"dof={dof!r} must be >= 1")
    if statistic <= 0:
        return 1.0
    if not math.isfinite(statistic):
        return 0.0
    a, x = dof / 2.0, statistic / 2.0
    log_prefix = a * math.log(x) - x - math.lgamma(a)
    if x < a + 1.0:  # series for the lower P(a, x)
        term = total = 1.0 / a
        ap = a
        for _ in range(10_000):
            ap += 1.0
            term *= x / ap
            total += term
            if abs(term) < abs(total) * 1e-15:
                break
        return max(0.0, 1.0 - total * math.exp(log_prefix))
    tiny = 1e-300  # continued fraction for the upper Q(a, x)
    b = x + 1.0 - a
    c = 1.0 / tiny
    d = 1.0 / b
    h = d
    for i in range(1, 10_000):
        an = -i * (i - a)
        b += 2.0
        d = an * d + b
        d = tiny if abs(d) < tiny else d
        c = b + an / c
        c = tiny if abs(c) < tiny else c
        d = 1.0 / d
        delta = d * c
        h *= delta
        if abs(delta - 1.0) < 1e-15:
            break
    return min(1.0, math.exp(log_prefix) * h)


@dataclass(frozen=True)
class ChiSquare:
    """Result of :func:`chi_square_test`."""

    statistic: float
    dof: int
    p_value: float
    cells: int


def chi_square_test(observed: Any, expected: Any, *, min_expected: float = 5.0) -> ChiSquare:
    """Pearson's goodness-of-fit test of counts ``observed`` against ``expected`` (same total).

    Cells expected below ``min_expected`` are pooled into one cell (the usual validity rule);
    a cell expected 0 but observed is an impossible outcome (p = 0). ``dof = cells - 1``.
    """
    obs = np.asarray(observed, dtype=np.float64).reshape(-1)
    exp = np.asarray(expected, dtype=np.float64).reshape(-1)
    if obs.shape != exp.shape:
        raise DetloaderValueError(f"observed has {obs.shape[0]} cells, expected {exp.shape[0]}")
    if (exp < 0).any() or (obs < 0).any():
        raise DetloaderValueError("chi_square_test: counts must be >= 0")
    if ((exp == 0) & (obs > 0)).any():
        return ChiSquare(math.inf, max(len(obs) - 1, 1), 0.0, len(obs))
    big = exp >= min_expected
    o = list(obs[big])
    e = list(exp[big])
    if (~big).any() and exp[~big].sum() > 0:
        o.append(float(obs[~big].sum()))
        e.append(float(exp[~big].sum()))
    if len(e) < 2:
        raise DetloaderValueError("chi_square_test: fewer than 2 cells with enough expectation")
    o_arr, e_arr = np.array(o), np.array(e)
    stat = float(((o_arr - e_arr) ** 2 / e_arr).sum())
    dof = len(e_arr) - 1
    return ChiSquare(stat, dof, chi_square_sf(stat, dof), len(e_arr))
