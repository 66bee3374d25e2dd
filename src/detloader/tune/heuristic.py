"""Loader settings without measuring: the cached tuning result, else a documented heuristic.

The heuristic (used by ``make_loader(num_workers="auto")`` until ``tune_loader`` has measured
this machine, dataset, transform and batch size; it never waits or watches the CPUs):

* **CPUs per loader** = free CPUs (usable CPUs: affinity capped by the cgroup quota, minus
  those other processes keep busy by the instant load figure, :func:`detloader._system.busy_now`)
  divided by the training processes on this machine (``LOCAL_WORLD_SIZE``; 1 otherwise),
  rounded (1.5 free CPUs count as 2, 1.4 as 1).
* **3 CPUs per loader or more**: ``num_workers`` = CPUs - 1 (one CPU stays with the training
  process), at most :data:`MAX_HEURISTIC_WORKERS` (beyond 8, image decoding rarely gains more
  than the memory it costs; measure to go higher), and no more than fit in half of the
  available memory at :data:`WORKER_MEMORY_GUESS` bytes each; no decode threads.
* **fewer**: ``num_workers=0`` and ``decode_threads=2`` (a batch decoded on 2 threads in the
  training process) when the loader has 2 usable CPUs or more, whatever the load, else none.
  On a 2-CPU machine this was the fastest setting when idle (481 img/s against 437 for 2
  workers and 301 without threads: docs/benchmarks.md) and 0.87-0.92 of the best of a small
  grid on a busy one (docs/tuning.md; 1 worker, the former default, 0.57-0.63); threads cost no
  process and little memory. A dataset without decode threads gets 0 workers (290 img/s against 255 for 1 worker
  on that machine, idle).
* **pin_memory** = a CUDA or XPU device exists; **prefetch_factor** = 2 (DataLoader's default)
  and **persistent_workers** = True when there are workers.
"""

from __future__ import annotations

import os
import warnings
from typing import Any

from detloader import _system
from detloader.errors import DetloaderValueError, StaleTuneWarning, TuneWarning
from detloader.tune.freshness import check_load, current_free_cpus, fit_to_load
from detloader.tune.measure import loader_kwargs
from detloader.tune.store import cache_key, load_result

#: Most workers the heuristic gives; tune_loader measures beyond it.
MAX_HEURISTIC_WORKERS = 8
#: Memory assumed per worker process when nothing was measured (bytes).
WORKER_MEMORY_GUESS = 512 * 2**20


def heuristic_loader_kwargs(
    *,
    free: float,
    memory_available: int,
    can_pin: bool,
    processes: int = 1,
    usable: int | None = None,
) -> tuple[dict[str, Any], str]:
    """Settings from the rules in the module docstring (``decode_threads`` included), and the
    one-line reason.

    ``free``: CPUs free for this machine's training processes; ``processes``: how many of them
    share the machine (each gets its own loader); ``memory_available``: bytes; ``usable``:
    CPUs this process may use, whatever the load (default: ``free``, rounded).
    """
    if processes < 1:
        raise DetloaderValueError(f"processes={processes} must be >= 1")
    cpus = int(free / processes + 0.5)
    mem_workers = int(0.5 * max(0, memory_available) // WORKER_MEMORY_GUESS)
    workers = max(0, min(cpus - 1, MAX_HEURISTIC_WORKERS, mem_workers)) if cpus >= 3 else 0
    usable_cpus = usable if usable is not None else cpus * processes
    threads = 2 if workers == 0 and usable_cpus / processes >= 2 else 0
    kwargs = loader_kwargs(workers, pin_memory=can_pin, prefetch_factor=2, persistent_workers=True)
    kwargs["decode_threads"] = threads
    per = f" / {processes} processes" if processes > 1 else ""
    return kwargs, (f"heuristic: {free:.1f} of {usable_cpus} CPUs free{per} -> num_workers={workers}, "
                    f"decode_threads={threads}, pin_memory={can_pin}")


def auto_loader_kwargs(
    dataset: Any,
    batch_size: int,
    *,
    cache_dir: str | os.PathLike[str] | None = None,
    warn: bool = True,
    stacklevel: int = 2,
    decode_threads: bool = False,
) -> tuple[dict[str, Any], str]:
    """DataLoader keyword arguments ``num_workers``, ``pin_memory``, ``prefetch_factor``,
    ``persistent_workers`` for ``dataset`` at ``batch_size``, and a one-line reason.

    The cached :func:`detloader.tune_loader` result for this machine, dataset, transform and
    batch size when there is one, after a cheap re-check of the load
    (:func:`detloader.tune.freshness.check_load`): when it changed, a :class:`StaleTuneWarning`
    says so and, on a busier machine, the workers are capped at the CPUs free now; else the
    heuristic of this module and, with ``warn``, a :class:`TuneWarning` saying so (shown
    once per process by Python's default warning filter) pointing ``stacklevel`` frames up.
    ``decode_threads``: the dict also holds ``decode_threads`` (the
    :class:`~detloader.dataset.DetectionDataset` setting, tuned or from the heuristic), which
    is not a DataLoader argument. Never waits: only files and instant figures are read.
    """
    if batch_size < 1:
        raise DetloaderValueError(f"batch_size={batch_size} must be >= 1")
    result = load_result(cache_key(dataset, batch_size), cache_dir)
    if result is not None:
        threads = {"decode_threads": result.decode_threads} if decode_threads else {}
        check = check_load(result)
        if not check.changed:
            return {**result.recommended, **threads}, f"tuned: {result.summary}"
        kwargs = fit_to_load(result.recommended, check)
        if warn:
            capped = (f"num_workers={kwargs['num_workers']} instead of the tuned "
                      f"{result.recommended['num_workers']}" if kwargs != result.recommended
                      else f"the tuned num_workers={kwargs['num_workers']} is kept")
            warnings.warn(
                f"{check.describe()}: {capped}. Run detloader.tune_loader(dataset, batch_size=...) "
                "or `detloader tune PATH` again to measure under this load.",
                StaleTuneWarning,
                stacklevel=stacklevel,
            )
        return {**kwargs, **threads}, f"tuned, load changed: {result.summary}; {check.describe()}"
    kind, _, _ = _system.accelerator_info()
    free, usable = current_free_cpus()
    kwargs, reason = heuristic_loader_kwargs(
        free=free,
        usable=usable,
        memory_available=_system.memory_facts().available,
        can_pin=kind in _system.PINNABLE,
        processes=_system.local_world_size(),
    )
    if warn:
        warnings.warn(
            "no tuning result for this machine, dataset, transform and batch size: loader "
            "settings come from a heuristic. Run detloader.tune_loader(dataset, batch_size=...) "
            "or `detloader tune PATH` once to measure them.",
            TuneWarning,
            stacklevel=stacklevel,
        )
    if not decode_threads:
        del kwargs["decode_threads"]
    return kwargs, reason
