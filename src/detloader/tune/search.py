"""Search the loader settings: climb ``num_workers``, refine the knee, then try the extras.

The throughput of a loader against its worker count is, on a real machine, a rising curve
that flattens (CPUs, memory bandwidth or the main process run out) and may fall (contention).
The search is built for that shape and for machines from 2 to 256 CPUs:

1. **climb**: ``num_workers`` = 0, 1, 2, 4, 8, ... up to the cap (the usable CPUs, or the
   free ones on a busy machine). From 2 workers on, the climb stops at the first rung that does
   not beat the best so far by more than ``tolerance`` (default 4 %).
2. **refine**: the smallest count that reaches the best rate within ``tolerance`` lies
   between the best rung and the rung below it (which did not reach it, or the climb would
   have chosen it); bisect there. On 64 CPUs with a knee at 12: 0 1 2 4 8 16 32 | 12 10 11
   -> 10 settings, not 65; the curve is assumed to rise until it flattens, and more workers
   than the cheapest good count are never better by more than the tolerance.
3. **choose**: the cheapest setting (fewest workers, then smaller prefetch) whose throughput is
   within ``tolerance`` of the best measured. More workers that add less than the tolerance
   cost memory and CPU that the training process or other users need.
4. **decode threads** (when the dataset can load a batch on threads, ``decode_threads`` of
   :class:`~detloader.dataset.DetectionDataset`): in the main process (``num_workers=0``)
   climb ``decode_threads`` = 2, 4, 8, ... up to the cap, stopping at the first rung that does
   not beat the best so far by more than ``tolerance``; then 2 threads in each of the chosen
   workers. Threads cost less than processes (no copy of the dataset, no batch crossing
   processes), so :func:`cost_key` ranks them after the worker count: 0 workers with threads
   come before 1 worker.
5. **extras** at the chosen count: ``prefetch_factor=4`` (helps when batch costs vary), and
   the other ``pin_memory`` value when a CUDA/XPU device exists (pinning costs a copy on the
   host and saves time in the host-to-device copy). Each is kept only if it beats the choice
   by more than ``tolerance``, on the best of two windows each.
6. **recheck**: the choice and its rivals (the fastest setting with fewer workers, with more,
   and overall) get one more window each, back to back, and each setting's best window
   decides: on a shared machine the load can change between two settings' windows, and it
   only ever slows a window down.

Every measurement is a real loader (:func:`detloader.tune.measure.measure_setting`); the
whole search stays within ``budget_s``: the window per setting is sized from the budget, and a
setting that would not fit is not started.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from detloader.errors import DetloaderValueError
from detloader.tune.measure import Consumer, LoaderFactory, Trial, loader_kwargs, measure_setting

#: Shortest and longest measuring window per setting, seconds.
MIN_WINDOW_S = 0.25
MAX_WINDOW_S = 5.0
#: Share of the budget given to measuring windows (the rest: worker start-up and warm-up).
WINDOW_SHARE = 0.55
#: Never plan for memory beyond this share of what is available.
MEMORY_SHARE = 0.8

Progress = Callable[[int, int], None]


@dataclass
class SearchOutcome:
    """Trials in the order measured, the index of the chosen one, and why the search ended:
    ``converged`` (throughput stopped rising), ``cap`` (still rising at the worker cap),
    ``budget``, ``memory`` (the next worker count would not fit), or ``grid`` (an explicit
    candidate list was measured)."""

    trials: list[Trial]
    chosen: int
    stop: str
    window_s: float
    spent_s: float
    skipped: list[dict[str, Any]] = field(default_factory=list)

    @property
    def chosen_trial(self) -> Trial:
        return self.trials[self.chosen]


def worker_ladder(cap: int) -> list[int]:
    """``0, 1, 2, 4, 8, ...`` below ``cap``, then ``cap`` itself: the climb's rungs."""
    if cap < 0:
        raise DetloaderValueError(f"cap={cap} must be >= 0")
    rungs = [0]
    w = 1
    while w < cap:
        rungs.append(w)
        w *= 2
    if cap > 0:
        rungs.append(cap)
    return rungs


def thread_ladder(cap: int) -> list[int]:
    """``2, 4, 8, ...`` below ``cap``, then ``cap``: the decode-thread rungs (one thread loads
    no faster than the calling thread)."""
    return [t for t in worker_ladder(cap) if t >= 2]


def expected_trials(cap: int, can_pin: bool, threads_cap: int = 0) -> int:
    """Settings a search usually measures for this cap (to size the window from the budget)."""
    climb = len(worker_ladder(cap))
    refine = max(0, math.ceil(math.log2(cap)) - 1) if cap > 2 else 0
    recheck = min(3, climb)
    threads = min(2, len(thread_ladder(threads_cap))) + 1 if threads_cap >= 2 else 0
    return climb + refine + (1 if cap > 0 else 0) + (1 if can_pin else 0) + recheck + threads


def window_for(budget_s: float, trials: int) -> float:
    """Measuring window per setting for ``trials`` settings within ``budget_s``."""
    return min(MAX_WINDOW_S, max(MIN_WINDOW_S, WINDOW_SHARE * budget_s / max(1, trials)))


def cost_key(trial: Trial, default_pin: bool) -> tuple[int, int, int, int]:
    """Order of cheapness: fewer workers, fewer decode threads, smaller prefetch, then the
    machine's default pinning."""
    s = trial.settings
    return (
        int(s.get("num_workers", 0)),
        int(s.get("decode_threads", 0)),
        int(s.get("prefetch_factor") or 0),
        int(bool(s.get("pin_memory", False)) != default_pin),
    )


def settings_key(settings: Mapping[str, Any]) -> tuple[tuple[str, Any], ...]:
    return tuple(sorted(settings.items()))


def setting_rates(trials: Sequence[Trial]) -> dict[tuple[tuple[str, Any], ...], float]:
    """Images/s per distinct setting: the best of its successful windows.

    Other processes can only slow a window down, never speed it up, so the fastest window of
    a setting is the one least disturbed, and the best estimate of what the setting can do
    (the same reason benchmarks report the minimum time of several runs). A setting measured
    again, to confirm a win or recheck a choice, gets a second chance at a quiet window."""
    best: dict[tuple[tuple[str, Any], ...], float] = {}
    for t in trials:
        if t.ok:
            key = settings_key(t.settings)
            best[key] = max(best.get(key, 0.0), t.images_per_s)
    return best


def choose(trials: Sequence[Trial], tolerance: float, default_pin: bool = False) -> int:
    """Index of the cheapest setting whose throughput (:func:`setting_rates`) is within
    ``tolerance`` of the best setting's; the latest trial of that setting is returned.

    Raises ValueError when no trial measured anything (every setting failed).
    """
    rates = setting_rates(trials)
    if not rates:
        errors = "; ".join(sorted({t.error or "no batch" for t in trials})) or "nothing measured"
        raise DetloaderValueError(f"no loader setting could be measured: {errors}")
    best = max(rates.values())
    near = [i for i, t in enumerate(trials)
            if t.ok and rates[settings_key(t.settings)] * (1.0 + tolerance) >= best]
    return min(near, key=lambda i: (cost_key(trials[i], default_pin),
                                    -rates[settings_key(trials[i].settings)], -i))


class _Runner:
    """Measures settings within the budget, remembering every trial."""

    def __init__(
        self,
        factory: LoaderFactory,
        *,
        batch_size: int,
        budget_s: float,
        window_s: float,
        consumer_for: Callable[[bool], Consumer | None],
        progress: Progress | None,
        memory_available: int | None,
        measure_fn: Callable[..., Trial] = measure_setting,
    ) -> None:
        self.measure_fn = measure_fn
        self.factory = factory
        self.batch_size = batch_size
        self.budget_s = budget_s
        self.window_s = window_s
        self.consumer_for = consumer_for
        self.progress = progress
        self.memory_available = memory_available
        self.start = time.perf_counter()
        self.trials: list[Trial] = []
        self.overhead_s = 0.0  # start-up + warm-up of the slowest setting so far
        self.out_of_budget = False
        self.out_of_memory = False
        self.skipped: list[dict[str, Any]] = []

    def elapsed(self) -> float:
        return time.perf_counter() - self.start

    def fits_memory(self, workers: int) -> bool:
        """Would ``workers`` processes fit, at the largest per-worker memory seen so far?"""
        if self.memory_available is None or workers == 0:
            return True
        per = [t.worker_uss_mib for t in self.trials if t.ok and t.worker_uss_mib]
        if not per:
            return True
        return workers * max(per) * 2**20 <= MEMORY_SHARE * self.memory_available

    def run(self, settings: Mapping[str, Any], phase: str, again: bool = False) -> Trial | None:
        """Measure ``settings`` (or, unless ``again``, return the earlier trial of the same
        settings); None when the budget or memory says no."""
        if not again:
            for t in self.trials:
                if t.settings == dict(settings):
                    return t
        workers = int(settings.get("num_workers", 0))
        if not self.fits_memory(workers):
            self.out_of_memory = True
            self.skipped.append({"settings": dict(settings), "reason": "memory"})
            return None
        remaining = self.budget_s - self.elapsed()
        if self.trials and remaining < self.window_s * 0.5 + self.overhead_s:
            self.out_of_budget = True
            self.skipped.append({"settings": dict(settings), "reason": "budget"})
            return None
        t0 = time.perf_counter()
        trial = self.measure_fn(
            self.factory,
            settings,
            batch_size=self.batch_size,
            window_s=self.window_s,
            min_batches=max(4, 2 * workers + 1),  # two rounds of workers
            consumer=self.consumer_for(bool(settings.get("pin_memory", False))),
            deadline=self.start + self.budget_s,
            phase=phase,
        )
        self.overhead_s = max(self.overhead_s, (time.perf_counter() - t0) - trial.seconds)
        self.trials.append(trial)
        if self.progress is not None:
            self.progress(min(int(self.elapsed()), int(self.budget_s)), int(self.budget_s))
        return trial


def search_settings(
    factory: LoaderFactory,
    *,
    batch_size: int,
    cap: int,
    can_pin: bool = False,
    budget_s: float = 60.0,
    tolerance: float = 0.04,
    consumer_for: Callable[[bool], Consumer | None] | None = None,
    window_s: float | None = None,
    memory_available: int | None = None,
    candidates: Sequence[Mapping[str, Any]] | None = None,
    progress: Progress | None = None,
    measure_fn: Callable[..., Trial] = measure_setting,
    threads_cap: int = 0,
) -> SearchOutcome:
    """Find the cheapest loader setting within ``tolerance`` of the fastest (see the module
    docstring). ``cap``: most workers to try; ``can_pin``: try ``pin_memory`` (a CUDA/XPU
    device exists; the climb runs pinned). ``consumer_for(pin_memory)``: the per-batch work
    in the main process (None: the loader alone). ``candidates``: measure exactly these
    settings instead of searching (a grid). ``progress(seconds spent, budget seconds)``.
    ``measure_fn``: replaces :func:`~detloader.tune.measure.measure_setting` (same
    signature), e.g. to run the search against a model of a machine. ``threads_cap``: most
    ``decode_threads`` to try (the factory then takes a ``decode_threads`` keyword; below 2:
    no thread search). A setting with threads holds ``decode_threads``; one without has no
    such key.
    """
    if budget_s <= 0:
        raise DetloaderValueError(f"budget_s={budget_s} must be > 0")
    if not 0 <= tolerance < 1:
        raise DetloaderValueError(f"tolerance={tolerance} must be in [0, 1)")
    if cap < 0:
        raise DetloaderValueError(f"cap={cap} must be >= 0")
    planned = len(candidates) if candidates is not None else expected_trials(cap, can_pin, threads_cap)
    window = window_s if window_s is not None else window_for(budget_s, planned)
    runner = _Runner(
        factory,
        batch_size=batch_size,
        budget_s=budget_s,
        window_s=window,
        consumer_for=consumer_for or (lambda pin: None),
        progress=progress,
        memory_available=memory_available,
        measure_fn=measure_fn,
    )
    if candidates is not None:
        for settings in candidates:
            runner.run(dict(settings), "grid")
        chosen = choose(runner.trials, tolerance, can_pin)
        stop = "budget" if runner.out_of_budget else "grid"
        return SearchOutcome(runner.trials, chosen, stop, window, runner.elapsed(), runner.skipped)

    def at(workers: int, pin: bool = can_pin, prefetch: int = 2, threads: int = 0) -> dict[str, Any]:
        s = loader_kwargs(workers, pin_memory=pin, prefetch_factor=prefetch, persistent_workers=True)
        if threads >= 2:
            s["decode_threads"] = threads
        return s

    def rate(trial: Trial | None) -> float:
        return trial.images_per_s if trial is not None and trial.ok else 0.0

    # 1. climb
    best_w, best_rate, hi = 0, -1.0, None
    for w in worker_ladder(cap):
        trial = runner.run(at(w), "climb")
        if trial is None:
            hi = w
            break
        if w >= 2 and rate(trial) <= best_rate * (1.0 + tolerance):
            hi = w
            break
        if rate(trial) > best_rate:
            best_w, best_rate = w, rate(trial)
    # 2. refine: the smallest count reaching the best rate within tolerance lies between the
    # rung below the best one (which does not reach it) and the best rung (which does)
    def measured() -> dict[int, float]:
        return {t.num_workers: rate(t) for t in runner.trials if t.settings == at(t.num_workers)}

    lo = max((n for n in measured() if n < best_w), default=best_w)
    up = best_w
    while up - lo > 1 and not runner.out_of_budget:
        target = max(measured().values()) / (1.0 + tolerance)
        mid = (lo + up) // 2
        trial = runner.run(at(mid), "refine")
        if trial is None:
            break
        if rate(trial) >= target:
            up = mid
        else:
            lo = mid
    chosen = choose(runner.trials, tolerance, can_pin)
    # 3. decode threads: in the main process, then inside the chosen workers
    if threads_cap >= 2 and not runner.out_of_budget:
        w = runner.trials[chosen].num_workers
        top = rate(runner.run(at(0), "threads"))
        for t in thread_ladder(threads_cap):
            trial = runner.run(at(0, threads=t), "threads")
            if trial is None or rate(trial) <= top * (1.0 + tolerance):
                break
            top = rate(trial)
        if w > 0:
            runner.run(at(w, threads=2), "threads")
        chosen = choose(runner.trials, tolerance, can_pin)
    w = runner.trials[chosen].num_workers
    threads = int(runner.trials[chosen].settings.get("decode_threads", 0))
    # 4. extras at the chosen count; a win is confirmed by measuring both settings again
    if w > 0:
        _try_extra(runner, runner.trials[chosen].settings, at(w, prefetch=4, threads=threads),
                   "prefetch", tolerance)
        chosen = choose(runner.trials, tolerance, can_pin)
    if can_pin:
        s = runner.trials[chosen].settings
        other = at(w, pin=not s["pin_memory"], prefetch=s["prefetch_factor"] or 2, threads=threads)
        _try_extra(runner, s, other, "pin_memory", tolerance)
        chosen = choose(runner.trials, tolerance, can_pin)
    # 5. recheck the choice against its rivals, interleaved
    _recheck(runner, chosen)
    chosen = choose(runner.trials, tolerance, can_pin)
    if runner.out_of_budget:
        stop = "budget"
    elif runner.out_of_memory:
        stop = "memory"
    elif hi is None and best_w == cap:
        stop = "cap"  # still rising at the cap
    else:
        stop = "converged"
    return SearchOutcome(runner.trials, chosen, stop, window, runner.elapsed(), runner.skipped)


def _try_extra(
    runner: _Runner,
    base: Mapping[str, Any],
    extra: Mapping[str, Any],
    phase: str,
    tolerance: float,
) -> None:
    """Measure ``extra``; if it beats ``base`` by more than ``tolerance``, measure both once
    more (a single short window on a shared machine can be off by a few per cent) so that
    :func:`choose` decides on the best window of each."""
    trial = runner.run(extra, phase)
    if trial is None or not trial.ok:
        return
    rates = setting_rates(runner.trials)
    base_rate = rates.get(settings_key(base), 0.0)
    if trial.images_per_s > base_rate * (1.0 + tolerance):
        if runner.run(base, "confirm", again=True) is not None:
            runner.run(extra, "confirm", again=True)


def _recheck(runner: _Runner, chosen: int) -> None:
    """Measure the chosen setting and its rivals once more, one after the other: the fastest
    setting with fewer workers, the fastest with more, and the fastest of all. On a machine
    whose load changes while the search runs, one window per setting can rank two settings
    the wrong way round; a second window each, taken close together, and the best windows
    decide."""
    rates = setting_rates(runner.trials)
    ok = [t for t in runner.trials if t.ok]
    me = runner.trials[chosen]
    w = me.num_workers
    rivals: dict[tuple[tuple[str, Any], ...], dict[str, Any]] = {}
    for group in ([t for t in ok if t.num_workers < w], [t for t in ok if t.num_workers > w], ok):
        if group:
            best = max(group, key=lambda t: rates[settings_key(t.settings)])
            rivals.setdefault(settings_key(best.settings), best.settings)
    rivals.pop(settings_key(me.settings), None)
    if not rivals:
        return
    others = sorted(rivals.values(), key=lambda s: (s["num_workers"], s.get("prefetch_factor") or 0))
    order = [me.settings, *others]
    for settings in order:
        if runner.run(settings, "recheck", again=True) is None:
            return
