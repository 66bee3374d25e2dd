"""Is a cached tuning result still about this machine's load?

A result is measured under some load: the CPUs other processes kept busy while it was probed
(``result.machine.busy_cpus`` / ``free_cpus``, stored in its JSON). On a shared server that
load comes and goes, and a result measured on an idle machine recommends too many workers
for a busy one (and one measured on a busy machine too few for an idle one). So every reuse
re-checks the load with an instant figure (:func:`detloader._system.busy_now`, the kernel's
load average: nothing is watched, so ``make_loader`` never waits): a change of at least
:func:`load_tolerance` free CPUs (1 CPU, or a quarter of the usable CPUs when that is more)
counts.

What a changed load does: ``tune_loader`` (``cache=True``) measures again and replaces the
cached result (``on_load_change="warn"`` returns the old one with a :class:`StaleTuneWarning`
instead); ``make_loader(num_workers="auto")`` cannot measure within its call, so it warns and,
when the machine got busier, uses no more workers than are free now (the cap the tuner itself
applies: ``max(1, round(free))``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from detloader import _system
from detloader.tune.measure import loader_kwargs
from detloader.tune.probe import free_cpus


def load_tolerance(usable_cpus: int) -> float:
    """How many free CPUs more or fewer count as a changed load: 1, or a quarter of the usable
    CPUs when that is more (64 CPUs: 16)."""
    return max(1.0, 0.25 * usable_cpus)


def current_free_cpus() -> tuple[float, int]:
    """``(free CPUs now, usable CPUs)`` from the instant load figure (no waiting)."""
    usable, affinity = _system.usable_cpus(), _system.affinity_cpus()
    return free_cpus(usable, affinity, _system.busy_now()), usable


@dataclass(frozen=True)
class LoadCheck:
    """Free CPUs when the result was measured (``then``) and now, and whether that changed."""

    then: float
    now: float
    usable: int
    tolerance: float

    @property
    def changed(self) -> bool:
        return abs(self.now - self.then) >= self.tolerance

    @property
    def busier(self) -> bool:
        return self.then - self.now >= self.tolerance

    def describe(self) -> str:
        way = "busier" if self.busier else "quieter" if self.changed else "as busy"
        return (f"the machine is {way} than when it was tuned: {self.now:.1f} of {self.usable} CPUs "
                f"free now, {self.then:.1f} then")


def check_load(result: Any) -> LoadCheck:
    """Compare the free CPUs stored in ``result`` (a :class:`TuneResult`) with the free CPUs
    now (the instant figure)."""
    now, usable = current_free_cpus()
    return LoadCheck(float(result.machine.free_cpus), now, usable, load_tolerance(usable))


def fit_to_load(recommended: dict[str, Any], check: LoadCheck) -> dict[str, Any]:
    """``recommended`` with at most ``max(1, round(free now))`` workers when the machine got
    busier (the tuner's own cap on a busy machine); unchanged otherwise."""
    workers = int(recommended.get("num_workers", 0))
    cap = max(1, int(check.now + 0.5))
    if not check.busier or workers <= cap:
        return dict(recommended)
    return loader_kwargs(
        cap,
        pin_memory=bool(recommended.get("pin_memory", False)),
        prefetch_factor=recommended.get("prefetch_factor") or 2,
        persistent_workers=bool(recommended.get("persistent_workers", True)),
    )
