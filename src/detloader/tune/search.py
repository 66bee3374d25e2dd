"""Search the loader settings: climb ``num_workers`` 0, 1, 2, 4, ..., refine between the best rung
and the one below it, decode threads, extras (prefetch, pinning), recheck. docs/tuning.md, "What
the tuner does", step 3, tells why each step is there. :func:`choose` takes the cheapest setting
within ``tolerance`` of the fastest, each rated by its best window.
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
SettingsKey = tuple[tuple[str, Any], ...]


@dataclass
class SearchOutcome:
    """Trials in the order measured, the index of the chosen one, and why the search ended:
    ``converged``, ``cap`` (still rising at the worker cap), ``budget``, ``memory`` (the next
    worker count would not fit), or ``grid`` (an explicit candidate list was measured)."""

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
    rungs = [0] + [2**i for i in range(max(0, cap - 1).bit_length()) if 2**i < cap]
    return rungs + [cap] if cap > 0 else rungs


def thread_ladder(cap: int) -> list[int]:
    """``2, 4, 8, ...`` below ``cap``, then ``cap`` (one thread loads no faster than the
    calling thread)."""
    return [t for t in worker_ladder(cap) if t >= 2]


def expected_trials(cap: int, can_pin: bool, threads_cap: int = 0) -> int:
    """Settings a search usually measures for this cap (to size the window from the budget)."""
    climb = len(worker_ladder(cap))
    refine = max(0, math.ceil(math.log2(cap)) - 1) if cap > 2 else 0
    threads = min(2, len(thread_ladder(threads_cap))) + 1 if threads_cap >= 2 else 0
    return climb + refine + (cap > 0) + can_pin + min(3, climb) + threads


def cost_key(trial: Trial, default_pin: bool) -> tuple[int, int, int, int]:
    """Order of cheapness: fewer workers, fewer decode threads, smaller prefetch, then the
    machine's default pinning."""
    s = trial.settings
    return (int(s.get("num_workers", 0)), int(s.get("decode_threads", 0)), int(s.get("prefetch_factor") or 0),
            int(bool(s.get("pin_memory", False)) != default_pin))


def settings_key(settings: Mapping[str, Any]) -> SettingsKey:
    return tuple(sorted(settings.items()))


def setting_rates(trials: Sequence[Trial]) -> dict[SettingsKey, float]:
    """Images/s per distinct setting: the best of its successful windows (other processes only
    slow a window down, so the fastest is the least disturbed, as benchmarks report the
    minimum time of several runs)."""
    best: dict[SettingsKey, float] = {}
    for t in trials:
        if t.ok:
            key = settings_key(t.settings)
            best[key] = max(best.get(key, 0.0), t.images_per_s)
    return best


def choose(trials: Sequence[Trial], tolerance: float, default_pin: bool = False) -> int:
    """Index of the latest trial of the cheapest setting whose rate (:func:`setting_rates`) is
    within ``tolerance`` of the best. ValueError when every setting failed."""
    rates = setting_rates(trials)
    if not rates:
        errors = "; ".join(sorted({t.error or "no batch" for t in trials})) or "nothing measured"
        raise DetloaderValueError(f"no loader setting could be measured: {errors}")
    best = max(rates.values())
    near = [i for i, t in enumerate(trials) if t.ok and rates[settings_key(t.settings)] * (1.0 + tolerance) >= best]
    return min(near, key=lambda i: (cost_key(trials[i], default_pin), -rates[settings_key(trials[i].settings)], -i))


class _Runner:
    """Measures settings within the budget and memory, remembering every trial."""

    def __init__(self, measure: Callable[[Mapping[str, Any], str], Trial], budget_s: float, window_s: float,
                 memory_available: int | None, progress: Progress | None) -> None:
        self.measure, self.budget_s, self.window_s = measure, budget_s, window_s
        self.memory_available, self.progress = memory_available, progress
        self.start = time.perf_counter()
        self.trials: list[Trial] = []
        self.skipped: list[dict[str, Any]] = []
        self.overhead_s = 0.0  # start-up + warm-up of the slowest setting so far
        self.out_of_budget = self.out_of_memory = False

    def elapsed(self) -> float:
        return time.perf_counter() - self.start

    def run(self, settings: Mapping[str, Any], phase: str, again: bool = False) -> Trial | None:
        """Measure ``settings`` (unless ``again``, an earlier trial of them is returned); None
        when the budget or memory says no."""
        settings = dict(settings)
        earlier = [t for t in self.trials if t.settings == settings]
        if earlier and not again:
            return earlier[0]
        workers = int(settings.get("num_workers", 0))
        per_worker = [t.worker_uss_mib for t in self.trials if t.ok and t.worker_uss_mib]
        if self.memory_available is not None and workers and per_worker \
                and workers * max(per_worker) * 2**20 > MEMORY_SHARE * self.memory_available:
            self.out_of_memory = True
            self.skipped.append({"settings": settings, "reason": "memory"})
            return None
        if self.trials and self.budget_s - self.elapsed() < self.window_s * 0.5 + self.overhead_s:
            self.out_of_budget = True
            self.skipped.append({"settings": settings, "reason": "budget"})
            return None
        t0 = time.perf_counter()
        trial = self.measure(settings, phase)
        self.overhead_s = max(self.overhead_s, time.perf_counter() - t0 - trial.seconds)
        self.trials.append(trial)
        if self.progress is not None:
            self.progress(min(int(self.elapsed()), int(self.budget_s)), int(self.budget_s))
        return trial


def _rate(trial: Trial | None) -> float:
    return trial.images_per_s if trial is not None and trial.ok else 0.0


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
    """Find the cheapest loader setting within ``tolerance`` of the fastest (module docstring).

    ``cap``: most workers to try; ``can_pin``: try ``pin_memory`` (the climb runs pinned);
    ``consumer_for(pin_memory)``: the per-batch work in the main process (None: the loader
    alone); ``candidates``: measure exactly these settings; ``measure_fn``: replaces
    :func:`~detloader.tune.measure.measure_setting` (same signature); ``threads_cap``: most
    ``decode_threads`` to try (below 2: none; only a setting with threads has the key).
    """
    if budget_s <= 0:
        raise DetloaderValueError(f"budget_s={budget_s} must be > 0")
    if not 0 <= tolerance < 1:
        raise DetloaderValueError(f"tolerance={tolerance} must be in [0, 1)")
    if cap < 0:
        raise DetloaderValueError(f"cap={cap} must be >= 0")
    planned = len(candidates) if candidates is not None else expected_trials(cap, can_pin, threads_cap)
    window = window_s if window_s is not None else \
        min(MAX_WINDOW_S, max(MIN_WINDOW_S, WINDOW_SHARE * budget_s / max(1, planned)))
    consumer_for = consumer_for or (lambda pin: None)
    start = time.perf_counter()

    def measure(settings: Mapping[str, Any], phase: str) -> Trial:
        workers = int(settings.get("num_workers", 0))
        return measure_fn(factory, settings, batch_size=batch_size, window_s=window,
                          min_batches=max(4, 2 * workers + 1), consumer=consumer_for(bool(settings.get("pin_memory"))),
                          deadline=start + budget_s, phase=phase)

    runner = _Runner(measure, budget_s, window, memory_available, progress)
    search = _Search(runner, can_pin, tolerance)

    def outcome(stop: str) -> SearchOutcome:
        return SearchOutcome(runner.trials, search.chosen(), stop, window, runner.elapsed(), runner.skipped)

    if candidates is not None:
        for settings in candidates:
            runner.run(settings, "grid")
        return outcome("budget" if runner.out_of_budget else "grid")
    best_w, hi = search.climb(cap)
    search.refine(best_w)
    if threads_cap >= 2 and not runner.out_of_budget:
        search.threads(threads_cap)
    search.extras()
    # 5. recheck the choice against its rivals, back to back
    _recheck(runner, search.chosen())
    if runner.out_of_budget:
        return outcome("budget")
    if runner.out_of_memory:
        return outcome("memory")
    return outcome("cap" if hi is None and best_w == cap else "converged")


@dataclass
class _Search:
    """The phases of one :func:`search_settings` search (its steps 1 to 4), measuring through
    ``runner``: ``can_pin`` (the climb runs pinned) and ``tolerance`` as the search got them."""

    runner: _Runner
    can_pin: bool
    tolerance: float

    def at(self, workers: int, pin: bool | None = None, prefetch: int = 2, threads: int = 0) -> dict[str, Any]:
        """The setting of ``workers`` (pinned as ``can_pin`` unless ``pin`` says), the key
        ``decode_threads`` only with 2 threads or more."""
        pin = self.can_pin if pin is None else pin
        s = loader_kwargs(workers, pin_memory=pin, prefetch_factor=prefetch, persistent_workers=True)
        return {**s, "decode_threads": threads} if threads >= 2 else s

    def chosen(self) -> int:
        return choose(self.runner.trials, self.tolerance, self.can_pin)

    def climb(self, cap: int) -> tuple[int, int | None]:
        """1. Climb the worker ladder until a rung (2 workers or more) gains no more than
        ``tolerance``: the best rung, and the rung it stopped at (None: it reached ``cap``)."""
        best_w, best_rate, hi = 0, -1.0, None
        for w in worker_ladder(cap):
            trial = self.runner.run(self.at(w), "climb")
            if trial is None or (w >= 2 and _rate(trial) <= best_rate * (1.0 + self.tolerance)):
                hi = w
                break
            if _rate(trial) > best_rate:
                best_w, best_rate = w, _rate(trial)
        return best_w, hi

    def refine(self, best_w: int) -> None:
        """2. Bisect between the rung below the best (which does not reach it) and the best rung."""
        runner, at = self.runner, self.at
        plain = {t.num_workers: _rate(t) for t in runner.trials if t.settings == at(t.num_workers)}
        lo, up = max((n for n in plain if n < best_w), default=best_w), best_w
        while up - lo > 1 and not runner.out_of_budget:
            mid = (lo + up) // 2
            trial = runner.run(at(mid), "refine")
            if trial is None:
                break
            plain[mid] = _rate(trial)
            lo, up = (lo, mid) if _rate(trial) >= max(plain.values()) / (1.0 + self.tolerance) else (mid, up)

    def threads(self, threads_cap: int) -> None:
        """3. Decode threads: in the main process up the thread ladder while they gain, then 2
        inside the chosen workers."""
        runner, at = self.runner, self.at
        w = runner.trials[self.chosen()].num_workers
        top = _rate(runner.run(at(0), "threads"))
        for t in thread_ladder(threads_cap):
            trial = runner.run(at(0, threads=t), "threads")
            if trial is None or _rate(trial) <= top * (1.0 + self.tolerance):
                break
            top = _rate(trial)
        if w > 0:
            runner.run(at(w, threads=2), "threads")

    def extras(self) -> None:
        """4. Extras at the chosen count (prefetch 4, the other pinning); a win is confirmed by
        measuring both settings again (:func:`_try_extra`)."""
        runner, at = self.runner, self.at
        s = runner.trials[self.chosen()].settings
        w, threads = s["num_workers"], int(s.get("decode_threads", 0))
        if w > 0:
            _try_extra(runner, s, at(w, pin=s["pin_memory"], prefetch=4, threads=threads), "prefetch", self.tolerance)
        if self.can_pin:
            s = runner.trials[self.chosen()].settings
            other = at(w, pin=not s["pin_memory"], prefetch=s["prefetch_factor"] or 2, threads=threads)
            _try_extra(runner, s, other, "pin_memory", self.tolerance)


def _try_extra(runner: _Runner, base: Mapping[str, Any], extra: Mapping[str, Any], phase: str,
               tolerance: float) -> None:
    """Measure ``extra``; when it beats ``base`` by more than ``tolerance``, measure both once
    more (one short window on a shared machine can be off by a few per cent)."""
    trial = runner.run(extra, phase)
    if trial is not None and trial.ok and \
            trial.images_per_s > setting_rates(runner.trials).get(settings_key(base), 0.0) * (1.0 + tolerance):
        if runner.run(base, "confirm", again=True) is not None:
            runner.run(extra, "confirm", again=True)


def _recheck(runner: _Runner, chosen: int) -> None:
    """One more window each for the chosen setting and its rivals: the fastest setting with
    fewer workers, with more, and of all. On a machine whose load changes while the search
    runs, one window per setting can rank two settings the wrong way round."""
    rates = setting_rates(runner.trials)
    ok = [t for t in runner.trials if t.ok]
    me = runner.trials[chosen]
    rivals: dict[SettingsKey, dict[str, Any]] = {}
    for group in ([t for t in ok if t.num_workers < me.num_workers], [t for t in ok if t.num_workers > me.num_workers],
                  ok):
        if group:
            best = max(group, key=lambda t: rates[settings_key(t.settings)])
            rivals.setdefault(settings_key(best.settings), best.settings)
    rivals.pop(settings_key(me.settings), None)
    if rivals:
        others = sorted(rivals.values(), key=lambda s: (s["num_workers"], s.get("prefetch_factor") or 0))
        for settings in [me.settings, *others]:
            if runner.run(settings, "recheck", again=True) is None:
                return
