"""Class tables readable at any class count: the largest classes as rows, the rest in one
summary line (how many, how many under a few objects or with none, the rarest by name).

``--top N`` sets how many rows a table shows (``--top 0``: every row); ``--json`` always keeps
every class. Used by ``detloader stats`` (with and without ``--balance``) and ``detloader index``.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from detloader.errors import DetloaderValueError

#: Rows of a class table by default: the classes with the largest counts.
TOP = 20
#: The summary of the rest counts the classes under this many objects (or images).
FEW = 10
#: The summary of the rest names this many of its rarest non-empty classes.
RAREST = 3
#: Names listed in a line of empty classes before "and N more".
NAMED = 8


def add_top_argument(p: argparse.ArgumentParser) -> None:
    """``--top N``: rows of each class table."""
    p.add_argument(
        "--top", type=_top, default=TOP, metavar="N",
        help=f"rows of each class table (bars of --plot): the N largest classes, then one line that sums up the rest "
        f"(default {TOP}; 0: every class, in a pipe too; --json always lists every class)",
    )


def _top(value: str) -> int:
    try:
        n = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{value!r} is not a whole number") from None
    if n < 0:
        raise argparse.ArgumentTypeError(f"{n} is below 0 (0 lists every class)")
    return n


@dataclass(frozen=True)
class CappedRows:
    """The rows a table shows (largest count first), the line that sums up the rest (empty
    when every row is shown) and how many rows there were."""

    rows: list[tuple[Any, ...]]
    rest: str
    total: int

    def title(self, title: str, sep: str = ": ", noun: str = "") -> str:
        """``title``, then ``sep`` and "largest N of M" (``noun`` after M) when the table leaves
        rows out."""
        return f"{title}{sep}largest {len(self.rows):,} of {self.total:,}{noun}" if self.rest else title


def cap_rows(rows: Sequence[tuple[Any, ...]], counts: Sequence[float], top: int = TOP, *,
             unit: str = "objects", noun: str = "classes") -> CappedRows:
    """``rows`` (each starting with a name; ``counts[i]`` is row ``i``'s count) sorted by count,
    largest first (ties in the given order); with ``top > 0`` and more rows than ``top + 1``,
    the first ``top`` and a line on the rest: how many, how many under :data:`FEW` ``unit``
    and with none, and the :data:`RAREST` rarest non-empty ones with their counts."""
    if len(rows) != len(counts):
        raise DetloaderValueError(f"{len(rows)} rows but {len(counts)} counts")
    order = sorted(range(len(rows)), key=lambda i: -counts[i])
    ranked = [rows[i] for i in order]
    if top <= 0 or len(ranked) <= top + 1:
        return CappedRows(ranked, "", len(ranked))
    rest = order[top:]
    none = sum(1 for i in rest if counts[i] == 0)
    few = sum(1 for i in rest if 0 < counts[i] < FEW)
    rarest = sorted((i for i in rest if counts[i] > 0), key=lambda i: counts[i])[:RAREST]
    parts = [f"{few:,} under {FEW} {unit}", f"{none:,} with none"]
    line = f"{len(rest):,} more {noun}: " + ", ".join(parts)
    if rarest:
        line += "; rarest: " + ", ".join(f"{rows[i][0]} ({_count(counts[i])})" for i in rarest)
    return CappedRows(ranked[:top], line + " (--top 0 lists all)", len(ranked))


def _count(value: float) -> str:
    return f"{value:,.0f}" if float(value).is_integer() else f"{value:,.1f}"


def named(names: Sequence[str], limit: int = NAMED) -> str:
    """``names`` joined by commas, at most ``limit`` of them, then "and N more"."""
    shown = ", ".join(names[:limit])
    return shown if len(names) <= limit else f"{shown} and {len(names) - limit:,} more"


def ratio_text(value: float | None) -> str:
    """An imbalance ratio as the commands print it: one decimal, ``-`` when undefined."""
    return "-" if value is None else f"{value:.1f}"


def imbalance_line(objects: float | None, images: float | None, empty: Sequence[str]) -> str:
    """``imbalance ratio (largest / smallest class): objects 12.0, images 8.5``, then the classes
    without objects (``empty``) when there are any."""
    return (f"imbalance ratio (largest / smallest class): objects {ratio_text(objects)}, images {ratio_text(images)}"
            + (f"; {len(empty):,} classes without objects: {named(empty)}" if empty else ""))


def print_rest(out: Any, capped: CappedRows) -> None:
    """The line on the rows a table left out, if any (never read as markup)."""
    if capped.rest:
        out.print(capped.rest, markup=False)

