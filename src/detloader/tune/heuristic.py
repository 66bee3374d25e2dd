"""Loader settings without measuring: the cached tuning result, else a documented heuristic.

The heuristic (used by ``make_loader(num_workers="auto")`` until ``tune_loader`` has measured
this machine, dataset, transform and batch size):

* **CPUs per loader** = free CPUs (usable CPUs minus those other processes kept busy over a
  short window), divided by the number of training processes on this machine
  (``LOCAL_WORLD_SIZE``, set by ``torchrun``; 1 otherwise).
* **num_workers** = CPUs per loader - 1 (one CPU stays with the training process that
  consumes the batches), at most :data:`MAX_HEURISTIC_WORKERS` (beyond 8, image decoding
  rarely gains more than the memory it costs; measure to go higher), and 0 when fewer than 2
  CPUs are free (a worker process would only add copying).
* **memory**: at most as many workers as fit in half of the available memory (host available
  memory, capped by the cgroup limit) at :data:`WORKER_MEMORY_GUESS` bytes each.
* **pin_memory** = a CUDA or XPU device exists; **prefetch_factor** = 2 (DataLoader's default)
  and **persistent_workers** = True when there are workers (worker start-up is then paid once,
  not every epoch).
"""

from __future__ import annotations

import os
import warnings
from typing import Any

from detloader import _system
from detloader.tune.measure import loader_kwargs
from detloader.tune.freshness import check_load, fit_to_load
from detloader.tune.probe import free_cpus
from detloader.tune.store import cache_key, load_result

__all__ = [
    "MAX_HEURISTIC_WORKERS", "WORKER_MEMORY_GUESS", "StaleTuneWarning", "TuneWarning",
    "auto_loader_kwargs", "heuristic_loader_kwargs",
]

#: Most workers the heuristic gives; tune_loader measures beyond it.
MAX_HEURISTIC_WORKERS = 8
#: Memory assumed per worker process when nothing was measured (bytes).
WORKER_MEMORY_GUESS = 512 * 2**20


class TuneWarning(UserWarning):
    """Loader settings come from the heuristic, not from a measurement."""


class StaleTuneWarning(TuneWarning):
    """The cached tuning result was measured under another load than the machine has now
    (see :mod:`detloader.tune.freshness`)."""


def heuristic_loader_kwargs(
    *,
    free: float,
    memory_available: int,
    can_pin: bool,
    processes: int = 1,
) -> tuple[dict[str, Any], str]:
    """Settings from the rules in the module docstring, and the one-line reason.

    ``free``: CPUs free for this machine's training processes; ``processes``: how many of them
    share the machine (each gets its own loader); ``memory_available``: bytes.
    """
    if processes < 1:
        raise ValueError(f"processes={processes} must be >= 1")
    per_loader = free / processes
    cpus = int(per_loader + 0.5)  # 1.9 free CPUs are 2 for a loader, 1.4 are 1
    cpu_workers = cpus - 1 if cpus >= 2 else 0
    mem_workers = int(0.5 * max(0, memory_available) // WORKER_MEMORY_GUESS)
    workers = max(0, min(cpu_workers, MAX_HEURISTIC_WORKERS, mem_workers))
    why = f"{free:.1f} free CPUs"
    if processes > 1:
        why += f" / {processes} processes"
    why += f" -> {per_loader:.1f} per loader, 1 kept for training"
    if workers == mem_workers and mem_workers < min(cpu_workers, MAX_HEURISTIC_WORKERS):
        why += f"; memory for {mem_workers} workers at {WORKER_MEMORY_GUESS // 2**20} MiB each"
    elif workers == MAX_HEURISTIC_WORKERS and cpu_workers > MAX_HEURISTIC_WORKERS:
        why += f"; capped at {MAX_HEURISTIC_WORKERS}"
    kwargs = loader_kwargs(workers, pin_memory=can_pin, prefetch_factor=2, persistent_workers=True)
    return kwargs, f"heuristic: num_workers={workers} ({why}), pin_memory={can_pin}"


def auto_loader_kwargs(
    dataset: Any,
    batch_size: int,
    *,
    cache_dir: str | os.PathLike[str] | None = None,
    busy_window_s: float = 0.2,
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
    heuristic of this module (it watches the CPUs for
    ``busy_window_s`` seconds) and, with ``warn``, a :class:`TuneWarning` saying so (shown
    once per process by Python's default warning filter) pointing ``stacklevel`` frames up.
    ``decode_threads``: the dict also holds ``decode_threads`` (the tuned
    :class:`~detloader.dataset.DetectionDataset` setting; 0 from the heuristic), which is not
    a DataLoader argument.
    """
    if batch_size < 1:
        raise ValueError(f"batch_size={batch_size} must be >= 1")
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
    usable, affinity = _system.usable_cpus(), _system.affinity_cpus()
    busy = _system.busy_cpus(busy_window_s) if busy_window_s > 0 else 0.0
    kind, _, _ = _system.accelerator_info()
    kwargs, reason = heuristic_loader_kwargs(
        free=free_cpus(usable, affinity, busy),
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
    if decode_threads:
        kwargs["decode_threads"] = 0
    return kwargs, reason
