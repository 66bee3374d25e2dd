"""Sort-based distinct values of integer arrays, as ``np.unique`` gives them.

``np.unique`` of numpy 2.x may take a hash path that is far slower than a sort on the
per-object keys of an index (image * classes + class); these helpers sort (``np.sort``, radix
for small integer dtypes) and mark where the value changes. Results equal ``np.unique``'s.
"""

from __future__ import annotations

import numpy as np


def unique_sorted(values: np.ndarray) -> np.ndarray:
    """The distinct values of the integer array ``values``, ascending (``np.unique(values)``)."""
    v = np.sort(np.asarray(values).reshape(-1))
    if len(v) < 2:
        return v
    keep = np.empty(len(v), dtype=bool)
    keep[0] = True
    np.not_equal(v[1:], v[:-1], out=keep[1:])
    return v[keep]


def unique_counts(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The distinct values of the integer array ``values`` (ascending) and how often each
    occurs, int64: ``np.unique(values, return_counts=True)``."""
    v = np.sort(np.asarray(values).reshape(-1))
    if len(v) == 0:
        return v, np.zeros(0, dtype=np.int64)
    starts = np.flatnonzero(np.r_[True, v[1:] != v[:-1]])
    counts = np.diff(np.r_[starts, len(v)]).astype(np.int64)
    return v[starts], counts


def is_strictly_increasing(values: np.ndarray) -> bool:
    """Whether every value of the 1-d array ``values`` is above the one before (so it is its
    own ``np.unique``)."""
    return len(values) < 2 or bool((values[1:] > values[:-1]).all())


def distinct_count(values: np.ndarray, upper: int | None = None) -> int:
    """How many distinct values the non-negative integer array ``values`` holds; with
    ``upper`` (every value ``< upper``) and not many more slots than values, by marking a
    table of ``upper`` flags instead of sorting."""
    v = np.asarray(values).reshape(-1)
    if upper is not None and upper <= 4 * len(v) + 1024:
        seen = np.zeros(upper, dtype=bool)
        seen[v] = True
        return int(seen.sum())
    return len(unique_sorted(v))


def group_order(groups: np.ndarray, num_groups: int) -> np.ndarray:
    """Positions that sort the non-negative int array ``groups`` (every value ``< num_groups``)
    stably: ``np.argsort(groups, kind="stable")``, by a radix sort on 16-bit keys when
    ``num_groups`` allows it."""
    g = np.asarray(groups).reshape(-1)
    if num_groups <= 1 << 16:
        g = g.astype(np.uint16)
    return np.argsort(g, kind="stable")


def distinct_pairs_by_group(
    major: np.ndarray, groups: np.ndarray, num_groups: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Distinct ``(group, major)`` pairs sorted by group then major: int64 ``group``,
    ``major`` and ``multiplicity`` (how often the pair occurs). ``major`` must be
    non-decreasing (an index's object -> image map is), ``groups`` non-negative and
    ``< num_groups``; one stable sort by group then suffices."""
    groups = np.asarray(groups).reshape(-1)
    order = group_order(groups, num_groups)
    a = np.asarray(major).reshape(-1)[order]
    if len(a) == 0:
        return np.zeros(0, dtype=np.int64), a.astype(np.int64), np.zeros(0, dtype=np.int64)
    sizes = np.bincount(groups, minlength=num_groups)
    starts = np.flatnonzero(pair_starts(a, sizes))
    g = np.repeat(np.arange(len(sizes), dtype=np.int64), sizes)  # groups[order], without a gather
    return g[starts], a[starts].astype(np.int64), np.diff(np.r_[starts, len(a)]).astype(np.int64)


def pair_starts(major: np.ndarray, sizes: np.ndarray) -> np.ndarray:
    """bool mask over ``major`` in stable group order (``sizes[g]`` values of group ``g``, group
    after group, ``major`` non-decreasing within each): True where a new distinct ``(group,
    major)`` pair starts, i.e. where ``major`` changes or a group begins."""
    first = np.empty(len(major), dtype=bool)
    if len(first):
        first[0] = True
        np.not_equal(major[1:], major[:-1], out=first[1:])
        first[(np.cumsum(sizes) - sizes)[sizes > 0]] = True
    return first
