"""A benchmark's report: figures per section, and ratios ``a / b`` of two labelled figures of
the same run, ``a`` the side that is better when the ratio is above 1.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass(frozen=True)
class Ratio:
    """``a / b``: ``a`` (``a_label``) against ``b`` (``b_label``), both in ``unit``."""

    section: str
    what: str
    a_label: str
    a: float
    b_label: str
    b: float
    unit: str

    @property
    def ratio(self) -> float:
        return self.a / self.b

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "ratio": self.ratio}


@dataclass
class BenchReport:
    """Everything one run measured: settings, machine, raw figures, ratios and notes."""

    settings: dict[str, Any]
    machine: dict[str, Any]
    figures: dict[str, Any] = field(default_factory=dict)
    ratios: list[Ratio] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def add(self, section: str, what: str, a: tuple[str, float], b: tuple[str, float], unit: str) -> None:
        """Record ``a / b`` (each ``(label, value)``); a zero or missing side is noted instead."""
        if not (a[1] > 0 and b[1] > 0 and math.isfinite(a[1]) and math.isfinite(b[1])):
            self.notes.append(f"{section}: {what}: not compared ({a[0]}={a[1]!r}, {b[0]}={b[1]!r})")
            return
        self.ratios.append(Ratio(section, what, a[0], float(a[1]), b[0], float(b[1]), unit))

    def to_dict(self) -> dict[str, Any]:
        return {
            "settings": self.settings,
            "machine": self.machine,
            "figures": self.figures,
            "ratios": [r.to_dict() for r in self.ratios],
            "notes": list(self.notes),
        }

    def table(self) -> str:
        """A Markdown table of the ratios, then the notes."""
        lines = ["| section | comparison | a | b | a / b |", "|---|---|---|---|---|"]
        for r in self.ratios:
            lines.append(
                f"| {r.section} | {r.what} | {r.a_label}: {_num(r.a)} {r.unit} | "
                f"{r.b_label}: {_num(r.b)} {r.unit} | {r.ratio:.2f} |"
            )
        lines += [f"- {note}" for note in self.notes]
        return "\n".join(lines)


def _num(x: float) -> str:
    if x >= 100:
        return f"{x:,.0f}"
    if x >= 1:
        return f"{x:.2f}"
    return f"{x:.3g}"
