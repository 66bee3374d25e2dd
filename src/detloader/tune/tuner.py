"""``tune_loader``: probe, search, explain, store, in that order."""

from __future__ import annotations

import datetime as _dt
import functools
import math
import time
import warnings
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from detloader.annotations.problems import check_int
from detloader.errors import DetloaderRuntimeWarning, DetloaderValueError, StaleTuneWarning
from detloader.tune.explain import explain, summary
from detloader.tune.measure import Consumer, LoaderFactory, loader_kwargs, make_consumer
from detloader.tune.probe import MachineProbe, probe_dataset, probe_machine
from detloader.tune.result import TuneResult
from detloader.tune.saved import cache_key, check_load, load_result, save_result
from detloader.tune.search import Progress, search_settings

#: Seconds the probe watches the CPUs to count those busy with other processes.
BUSY_WINDOW_S = 1.0
CACHE_CHOICES = (True, False, "refresh")
#: What a stored result measured under another load does (see :mod:`detloader.tune.saved`).
LOAD_CHANGE_CHOICES = ("retune", "warn", "ignore")
_SETTING_NAMES = ("num_workers", "pin_memory", "prefetch_factor", "persistent_workers", "decode_threads")


def grid_candidates(max_workers: int, can_pin: bool = False, prefetch: Sequence[int] = (2, 4)) -> list[dict[str, Any]]:
    """What an exhaustive grid measures: ``num_workers`` 0..``max_workers`` x ``prefetch_factor``
    (with workers) x ``pin_memory`` (False, and True when ``can_pin``), persistent workers."""
    return [loader_kwargs(w, pin_memory=pin, prefetch_factor=pf) for w in range(max_workers + 1)
            for pf in (prefetch if w > 0 else (None,)) for pin in ((False, True) if can_pin else (False,))]


def normalise_candidate(candidate: Mapping[str, Any]) -> dict[str, Any]:
    """A partial setting (``{"num_workers": 4}``) completed with the tuner's defaults and made
    valid for DataLoader (``decode_threads``, when given, goes to the loader factory, as
    ``make_loader`` takes it); unknown keys are refused."""
    unknown = sorted(set(candidate) - set(_SETTING_NAMES))
    if unknown:
        raise DetloaderValueError(f"candidate={dict(candidate)}: unknown key(s) {unknown}; "
                                  f"valid: {list(_SETTING_NAMES)}")
    w = int(candidate.get("num_workers", 0))
    out = loader_kwargs(w, pin_memory=bool(candidate.get("pin_memory", False)),
                        prefetch_factor=candidate.get("prefetch_factor", 2) if w > 0 else None,
                        persistent_workers=bool(candidate.get("persistent_workers", True)))
    threads = candidate.get("decode_threads", 0)
    if threads:  # like the search's settings: the key only where threads are used
        check_int("decode_threads", threads, 0)
        out["decode_threads"] = int(threads)
    return out


def default_loader_factory(dataset: Any, batch_size: int, collate_fn: Callable[[list[Any]], Any] | None,
                           seed: int = 0) -> LoaderFactory:
    """``make_loader(dataset, ...)`` awaiting the settings: the loader the user will train with."""
    from detloader.loader import make_loader  # lazy: loader imports tune (num_workers="auto")

    return functools.partial(make_loader, dataset, batch_size=batch_size, shuffle=True, collate_fn=collate_fn,
                             seed=seed)


def default_collate_for(dataset: Any) -> Callable[[list[Any]], Any] | None:
    """The collate function make_loader would use (None: torch's default): ``collate_detection``
    for a ``DetectionDataset`` or a dataset (a user's wrapper) whose items are ``Sample``s."""
    from detloader.dataset import DetectionDataset, Sample
    from detloader.loader.collate import collate_detection

    try:
        return collate_detection if isinstance(dataset, DetectionDataset) or isinstance(dataset[0], Sample) else None
    except Exception:  # noqa: BLE001 - the user's dataset: its error shows when it is measured
        return None


def _step_label(step_time: float | Consumer | None) -> float | str | None:
    if step_time is None or isinstance(step_time, (int, float)):
        return None if step_time is None else float(step_time)
    return f"callable:{getattr(step_time, '__qualname__', type(step_time).__name__)}"


def worker_cap(machine: MachineProbe, max_workers: int | None, respect_busy: bool) -> tuple[int, str]:
    """Most workers worth trying, and why (``usable``, ``busy`` or ``max_workers``): the usable
    CPUs; with ``respect_busy`` only the free ones (rounded, at least 1: docs/tuning.md tells
    why). ``max_workers`` replaces both."""
    if max_workers is not None:
        if max_workers < 0:
            raise DetloaderValueError(f"max_workers={max_workers} must be >= 0")
        return int(max_workers), "max_workers"
    free = max(1, int(machine.free_cpus + 0.5))
    if respect_busy and free < machine.usable_cpus:
        return free, "busy"
    return machine.usable_cpus, "usable"


def tune_loader(
    dataset: Any,
    *,
    batch_size: int = 32,
    collate_fn: Callable[[list[Any]], Any] | None = None,
    budget_s: float = 60.0,
    step_time: float | Consumer | None = None,
    candidates: Sequence[Mapping[str, Any]] | None = None,
    max_workers: int | None = None,
    respect_busy: bool = True,
    tolerance: float = 0.04,
    device: str | None = "auto",
    loader_factory: LoaderFactory | None = None,
    cache: bool | str = True,
    on_load_change: str = "retune",
    progress: Progress | None = None,
) -> TuneResult:
    """Measure the loader on this machine and recommend ``num_workers``, ``pin_memory``,
    ``prefetch_factor``, ``persistent_workers`` (and ``decode_threads``), with the reasons,
    within ``budget_s`` seconds (docs/tuning.md).

    ``loader_factory``: a callable taking the settings as keyword arguments and returning an
    iterable of batches (default: ``make_loader(dataset, batch_size=..., shuffle=True,
    collate_fn=...)``). ``step_time``: the training step, as seconds per batch (slept) or a
    callable run on each batch. ``device``: copy each batch there ("auto": the CUDA/XPU device
    if any; None: no copy). ``candidates``: measure exactly these settings (partial dicts are
    completed). ``tolerance``: fewer workers win within this fraction of the best throughput.
    ``cache``: True reads and writes the store, "refresh" measures again and writes, False
    neither; ``on_load_change``: a stored result measured under another load is measured again
    (``"retune"``), returned with a ``StaleTuneWarning`` (``"warn"``) or as it is (``"ignore"``).
    """
    grid = _checked_grid(dataset, batch_size, budget_s, cache, on_load_change, candidates)
    step_label = _step_label(step_time)
    key = cache_key(dataset, batch_size) if cache else {}
    stored = _stored_result(key, step_label, on_load_change) if cache is True and grid is None else None
    if stored is not None:
        return stored

    start = time.perf_counter()

    def report(done: int = 0, total: int = 0) -> None:
        if progress is not None:
            progress(min(int(time.perf_counter() - start), int(budget_s)), int(budget_s))

    machine = probe_machine(busy_window_s=BUSY_WINDOW_S)
    report()
    if collate_fn is None:
        collate_fn = default_collate_for(dataset)
    data = probe_dataset(dataset, batch_size, collate_fn)
    report()
    if grid is not None:
        cap, cap_reason = max(c["num_workers"] for c in grid), "candidates"
    else:
        cap, cap_reason = worker_cap(machine, max_workers, respect_busy)
    if device == "auto":
        device = machine.accelerator if machine.can_pin else None
    factory, threads_cap = _factory(dataset, batch_size, collate_fn, loader_factory, machine, cap, grid is None)
    outcome = search_settings(
        factory, batch_size=batch_size, cap=cap, can_pin=machine.can_pin,
        budget_s=max(0.5, budget_s - (time.perf_counter() - start)), tolerance=tolerance,
        consumer_for=lambda pin: make_consumer(step_time, device, pin), memory_available=machine.memory_available,
        candidates=grid, progress=report, threads_cap=threads_cap,
    )
    s = outcome.chosen_trial.settings
    result = TuneResult(
        recommended=_recommended(s), explanation="", summary="", machine=machine, data=data,
        trials=outcome.trials, chosen=outcome.chosen, batch_size=batch_size, dataset_size=len(dataset),
        budget_s=float(budget_s), spent_s=time.perf_counter() - start, window_s=outcome.window_s,
        stop=outcome.stop, worker_cap=cap, cap_reason=cap_reason, tolerance=tolerance, step_time=step_label,
        device=device, decode_threads=int(s.get("decode_threads", 0)), key=key,
        created=_dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
    )
    result.explanation, result.summary = explain(result), summary(result)
    if cache and grid is None:
        _save(result)
    return result


def _factory(dataset: Any, batch_size: int, collate_fn: Callable[[list[Any]], Any] | None,
             loader_factory: LoaderFactory | None, machine: MachineProbe, cap: int,
             searching: bool) -> tuple[LoaderFactory, int]:
    """The loader factory to measure (``loader_factory``, else :func:`default_loader_factory`)
    and the most decode threads to try: 0 unless the search runs on the default factory and the
    dataset takes ``with_decode_threads``; then ``cap``, and 2 even when busy CPUs cap the
    workers lower (threads cost no process), when 2 CPUs are usable."""
    if loader_factory is not None:
        return loader_factory, 0
    factory, threads_cap = default_loader_factory(dataset, batch_size, collate_fn), 0
    if searching and hasattr(dataset, "with_decode_threads"):
        threads_cap = max(cap, 2) if machine.usable_cpus >= 2 else cap
    return factory, threads_cap


def _recommended(settings: Mapping[str, Any]) -> dict[str, Any]:
    """The loader keyword arguments of the chosen trial's ``settings``."""
    return loader_kwargs(settings["num_workers"], pin_memory=bool(settings.get("pin_memory")),
                         prefetch_factor=settings.get("prefetch_factor") or 2,
                         persistent_workers=bool(settings.get("persistent_workers", True)))


def _save(result: TuneResult) -> None:
    """Store ``result``; a store that cannot be written (a full disk) costs the store, never
    the measured result: a warning naming :func:`tune_loader`'s caller."""
    try:
        save_result(result)
    except OSError as err:
        warnings.warn(f"tuning result not saved, measured again next time: {err}", DetloaderRuntimeWarning,
                      stacklevel=3)


def _checked_grid(
    dataset: Any,
    batch_size: int,
    budget_s: float,
    cache: bool | str,
    on_load_change: str,
    candidates: Sequence[Mapping[str, Any]] | None,
) -> list[dict[str, Any]] | None:
    """The candidates completed (:func:`normalise_candidate`; None: search), once
    :func:`tune_loader`'s arguments are checked (ValueError naming the first bad one)."""
    if batch_size < 1:
        raise DetloaderValueError(f"batch_size={batch_size} must be >= 1")
    if budget_s <= 0 or not math.isfinite(budget_s):
        raise DetloaderValueError(f"budget_s={budget_s} must be a positive number of seconds")
    if cache not in CACHE_CHOICES:
        raise DetloaderValueError(f"cache={cache!r}; valid: {list(CACHE_CHOICES)}")
    if on_load_change not in LOAD_CHANGE_CHOICES:
        raise DetloaderValueError(f"on_load_change={on_load_change!r}; valid: {list(LOAD_CHANGE_CHOICES)}")
    if len(dataset) == 0:
        raise DetloaderValueError("tune_loader: the dataset is empty (len(dataset)=0)")
    grid = [normalise_candidate(c) for c in candidates] if candidates is not None else None
    if grid is not None and not grid:
        raise DetloaderValueError("candidates=[]: give at least one setting, or None to search")
    return grid


def _stored_result(key: dict[str, Any], step_label: float | str | None, on_load_change: str) -> TuneResult | None:
    """The stored result for ``key`` when it measured the same step and may be returned: its
    load unchanged, ``on_load_change="ignore"``, or ``"warn"`` (with a :class:`StaleTuneWarning`
    naming :func:`tune_loader`'s caller); None: measure."""
    stored = load_result(key)
    if stored is None or stored.step_time != step_label:
        return None
    check = check_load(stored) if on_load_change != "ignore" else None
    if check is None or not check.changed:
        return stored
    if on_load_change == "warn":
        warnings.warn(f"stored tuning result of {stored.created}: {check.describe()}; "
                      "tune_loader(..., cache='refresh') measures again", StaleTuneWarning, stacklevel=3)
        return stored
    return None
