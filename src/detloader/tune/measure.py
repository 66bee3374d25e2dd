"""Measure one loader setting: a real loader, warmed up, timed over a short window.

A *loader factory* is any callable that takes DataLoader keyword arguments (``num_workers``,
``pin_memory``, ``prefetch_factor``, ``persistent_workers``) and returns an iterable of
batches, e.g. ``functools.partial(torch.utils.data.DataLoader, dataset, batch_size=32)``.
:func:`measure` builds one loader from it, drains the start-up burst, then times a window and
reports what a training loop would see: images per second, how long it waited for each batch,
the CPU the main process and the workers used, and the memory of each worker process.
"""

from __future__ import annotations

import gc
import math
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from detloader import _system
from detloader.errors import DetloaderValueError
from detloader.tune.probe import device_synchronizer
from detloader.tune.records import Record

LoaderFactory = Callable[..., Iterable[Any]]
#: A consumer gets each batch, as a training step would; it runs in the main process.
Consumer = Callable[[Any], None]


@dataclass
class Trial(Record):
    """What one setting measured. Rates are per second of wall time, CPU in cores (1.0 = one
    core fully busy), memory in MiB, latencies in milliseconds.

    ``latency_*_ms``: time the consumer waited inside ``next(iterator)`` for each batch (the
    time an accelerator would stand idle); ``startup_s``: from ``iter(loader)`` to the first
    batch (worker start-up, paid every epoch unless ``persistent_workers``);
    ``worker_uss_mib`` / ``worker_pss_mib``: mean per worker process of its unique and
    proportional set size (memory only it holds / its fair share of shared pages);
    ``wait_fraction``: with a consumer, the share of the window spent waiting for data;
    ``others_cpu``: CPUs kept busy by other processes during the window (all CPU time on our
    CPUs minus ours and our workers'; None where ``/proc/stat`` is missing): when it changes
    from one setting to the next, the machine's load changed under the measurement;
    ``error``: why the setting could not be measured (the other figures are then 0).
    ``images`` / ``batches`` / ``seconds``: the span the rate is counted over (see
    :func:`steady_rate`); CPU figures cover the whole window.
    """

    settings: dict[str, Any]
    images_per_s: float
    images: int
    batches: int
    seconds: float
    startup_s: float
    latency_p50_ms: float
    latency_p95_ms: float
    main_cpu: float
    workers_cpu: float
    workers: int
    worker_uss_mib: float | None
    worker_pss_mib: float | None
    main_rss_mib: float
    wait_fraction: float | None = None
    step_ms: float | None = None
    others_cpu: float | None = None
    phase: str = ""
    error: str | None = None

    @property
    def num_workers(self) -> int:
        return int(self.settings.get("num_workers", 0))

    @property
    def ok(self) -> bool:
        return self.error is None and self.images > 0


def loader_kwargs(
    num_workers: int,
    pin_memory: bool = False,
    prefetch_factor: int | None = 2,
    persistent_workers: bool = True,
) -> dict[str, Any]:
    """The four DataLoader keyword arguments the tuner sets, made valid together: with
    ``num_workers=0`` DataLoader refuses a ``prefetch_factor`` and ``persistent_workers``."""
    if num_workers < 0:
        raise DetloaderValueError(f"num_workers={num_workers} must be >= 0")
    if num_workers == 0:
        return {"num_workers": 0, "pin_memory": bool(pin_memory), "prefetch_factor": None,
                "persistent_workers": False}
    if prefetch_factor is None or prefetch_factor < 1:
        raise DetloaderValueError(f"prefetch_factor={prefetch_factor} must be >= 1 when num_workers > 0")
    return {"num_workers": int(num_workers), "pin_memory": bool(pin_memory),
            "prefetch_factor": int(prefetch_factor), "persistent_workers": bool(persistent_workers)}


def images_in(batch: Any, default: int) -> int:
    """Images in a batch: the first dimension of its images (an ``images`` attribute or key, a
    tensor, or the first element of a tuple/list), else ``default``."""
    keyed = batch.get("images") if isinstance(batch, dict) else None
    for candidate in (getattr(batch, "images", None), keyed):
        if candidate is not None and hasattr(candidate, "shape") and len(candidate.shape) > 0:
            return int(candidate.shape[0])
    if hasattr(batch, "shape") and len(batch.shape) > 0:
        return int(batch.shape[0])
    if isinstance(batch, (list, tuple)) and batch:
        return images_in(batch[0], default)
    return default


def to_device(batch: Any, device: str, non_blocking: bool) -> Any:
    """Move every tensor in ``batch`` to ``device`` (nested tuples, lists, dicts, objects with a
    ``to`` method), as a training step's first line does."""
    import torch

    if isinstance(batch, torch.Tensor):
        return batch.to(device, non_blocking=non_blocking)
    if isinstance(batch, dict):
        return {k: to_device(v, device, non_blocking) for k, v in batch.items()}
    if isinstance(batch, tuple) and hasattr(batch, "_fields"):  # a namedtuple
        return type(batch)(*(to_device(v, device, non_blocking) for v in batch))
    if isinstance(batch, (list, tuple)):
        return type(batch)(to_device(v, device, non_blocking) for v in batch)
    move = getattr(batch, "to", None)
    if callable(move):
        try:
            return move(device, non_blocking=non_blocking)
        except TypeError:
            return move(device)
    return batch


def make_consumer(
    step_time: float | Consumer | None, device: str | None, pin_memory: bool
) -> Consumer | None:
    """The per-batch work of the measured loop: copy to ``device`` (if any, non-blocking when
    the batch is pinned, then wait for the copy), then the user's step: ``step_time`` seconds
    of sleep (a step that waits on the accelerator) or a callable. None: the loader alone."""
    if step_time is None and device is None:
        return None
    if step_time is not None and not callable(step_time):
        seconds = float(step_time)
        if not math.isfinite(seconds) or seconds < 0:
            raise DetloaderValueError(f"step_time={step_time!r} must be a number of seconds >= 0 or a callable")
    sync = device_synchronizer(device) if device is not None else (lambda: None)

    def consume(batch: Any) -> None:
        if device is not None:
            batch = to_device(batch, device, non_blocking=pin_memory)
            sync()
        if step_time is None:
            return
        if callable(step_time):
            step_time(batch)
        else:
            time.sleep(seconds)

    return consume


@dataclass
class _Cycle:
    """Batches from a loader, epoch after epoch (a small dataset must not end the window)."""

    loader: Iterable[Any]
    iterator: Iterator[Any] | None = None
    epochs: int = 0
    iterators: list[Iterator[Any]] = field(default_factory=list)

    def next(self) -> Any:
        for _ in range(2):
            if self.iterator is None:
                self.iterator = iter(self.loader)
                self.iterators.append(self.iterator)
                self.epochs += 1
            try:
                return next(self.iterator)
            except StopIteration:
                self.iterator = None
        raise DetloaderValueError("the loader yields no batch (empty dataset, or drop_last with too few samples)")


def _cpu_s(proc: Any) -> float:
    t = proc.cpu_times()
    return float(t.user + t.system)


def _reaped_children_cpu_s(proc: Any) -> float:
    t = proc.cpu_times()
    return float(getattr(t, "children_user", 0.0) + getattr(t, "children_system", 0.0))


def _workers(me: Any, before: set[int]) -> list[Any]:
    import psutil

    try:
        return [p for p in me.children(recursive=True) if p.pid not in before]
    except psutil.Error:
        return []


def measure_setting(
    factory: LoaderFactory,
    settings: Mapping[str, Any],
    *,
    batch_size: int,
    window_s: float = 2.0,
    min_batches: int | None = None,
    consumer: Consumer | None = None,
    deadline: float | None = None,
    phase: str = "",
) -> Trial:
    """Build ``factory(**settings)``, warm it up, and time a window of at least ``window_s``
    seconds and ``min_batches`` batches (default: two rounds of workers, ``2 * num_workers +
    1``, at least 4), ending early, after 2 batches, past ``deadline`` (a
    ``time.perf_counter()`` value).

    Warm-up: the first batch (its time is ``startup_s``), then ``num_workers *
    prefetch_factor`` batches, the burst the workers prepared while starting; throughput
    measured during that burst would be too high. Throughput is counted between batches the
    consumer had to wait for (:func:`steady_rate`). Workers are stopped before returning, so the
    next setting starts on idle CPUs. A setting that raises is returned with ``error`` set.
    """
    import psutil

    me = psutil.Process()
    before = {p.pid for p in me.children(recursive=True)}
    workers_n = int(settings.get("num_workers", 0))
    prefetch = settings.get("prefetch_factor") or 2
    if min_batches is None:
        min_batches = max(4, 2 * workers_n + 1)
    cycle: _Cycle | None = None
    try:
        loader = factory(**settings)
        cycle = _Cycle(loader)
        t0 = time.perf_counter()
        batch = cycle.next()
        startup = time.perf_counter() - t0
        if consumer is not None:
            consumer(batch)
        for _ in range(workers_n * int(prefetch)):
            batch = cycle.next()
            if consumer is not None:
                consumer(batch)
        procs = _workers(me, before)
        start_cpu = {p.pid: _safe(lambda p=p: _cpu_s(p)) for p in procs}
        main0, reaped0 = _cpu_s(me), _reaped_children_cpu_s(me)
        stat0 = _system.cpu_sample()
        waits: list[float] = []
        steps: list[float] = []
        counts: list[int] = []
        arrivals: list[float] = []
        t_start = time.perf_counter()
        while True:
            t = time.perf_counter()
            batch = cycle.next()
            arrivals.append(time.perf_counter())
            waits.append(arrivals[-1] - t)
            counts.append(images_in(batch, batch_size))
            if consumer is not None:
                s = time.perf_counter()
                consumer(batch)
                steps.append(time.perf_counter() - s)
            now = time.perf_counter()
            if len(waits) >= min_batches and now - t_start >= window_s:
                break
            if deadline is not None and now > deadline and len(waits) >= 2:
                break
        wall = time.perf_counter() - t_start
        stat1 = _system.cpu_sample()
        main_cpu = (_cpu_s(me) - main0) / wall
        images, batches, seconds = steady_rate(arrivals, waits, counts, wall)
        procs = _workers(me, before)
        workers_cpu_s = _reaped_children_cpu_s(me) - reaped0
        uss, pss = [], []
        for p in procs:
            cpu = _safe(lambda p=p: _cpu_s(p))
            if cpu is not None:
                workers_cpu_s += cpu - (start_cpu.get(p.pid) or 0.0)
            info = _safe(p.memory_full_info)
            if info is not None:
                uss.append(info.uss / 2**20)
                if getattr(info, "pss", None) is not None:
                    pss.append(info.pss / 2**20)
        workers_cpu = max(0.0, workers_cpu_s / wall)
        others = None
        if stat0 is not None and stat1 is not None:
            total = _system.busy_from_samples(stat0, stat1, 0.0, wall, _system.affinity_set())
            others = max(0.0, total - main_cpu - workers_cpu)
        w = np.asarray(waits) * 1000.0
        return Trial(
            settings=dict(settings),
            images_per_s=images / seconds,
            images=images,
            batches=batches,
            seconds=seconds,
            startup_s=startup,
            latency_p50_ms=float(np.percentile(w, 50)),
            latency_p95_ms=float(np.percentile(w, 95)),
            main_cpu=main_cpu,
            workers_cpu=workers_cpu,
            workers=len(procs),
            worker_uss_mib=float(np.mean(uss)) if uss else None,
            worker_pss_mib=float(np.mean(pss)) if pss else None,
            main_rss_mib=me.memory_info().rss / 2**20,
            wait_fraction=float(sum(waits) / wall) if consumer is not None else None,
            step_ms=float(np.mean(steps) * 1000.0) if steps else None,
            others_cpu=others,
            phase=phase,
        )
    except (RuntimeError, OSError, ValueError, TypeError) as err:
        # a crashed worker, a refused combination, an exhausted loader: record, do not abort
        return failed_trial(settings, f"{type(err).__name__}: {err}", phase)
    finally:
        if cycle is not None:
            _shutdown(cycle)
        gc.collect()


def steady_rate(
    arrivals: list[float], waits: list[float], counts: list[int], wall: float
) -> tuple[int, int, float]:
    """``(images, batches, seconds)`` to count the rate over, from one window's batches.

    Batch ``i`` arrived at ``arrivals[i]`` after the consumer waited ``waits[i]`` for it, and
    holds ``counts[i]`` images. Workers that start together stay in step, so their batches
    arrive in bursts; counting every batch of a window that starts or ends inside a burst is
    off by up to a burst (tens of per cent with many workers and short windows). A batch the
    consumer *waited* for found the queue empty; between two such batches the loader delivered
    exactly what it produced, so the rate from the first waited-for batch to the last one is
    exact whatever the bursts. It is used when that span covers a third of the window or more;
    else (a consumer slower than the loader never waits) every batch over the whole window.
    """
    n = len(arrivals)
    if n < 2:
        return sum(counts), n, wall
    typical = (arrivals[-1] - arrivals[0]) / (n - 1)
    threshold = max(0.002, 0.25 * typical)
    waited = [i for i in range(n) if waits[i] >= threshold]
    if len(waited) >= 2:
        first, last = waited[0], waited[-1]
        span = arrivals[last] - arrivals[first]
        if span > 0 and span >= wall / 3:
            return sum(counts[first + 1 : last + 1]), last - first, span
    return sum(counts), n, wall


def failed_trial(settings: Mapping[str, Any], error: str, phase: str = "") -> Trial:
    """A trial that produced nothing, with the reason."""
    return Trial(dict(settings), 0.0, 0, 0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0, None, None, 0.0,
                 phase=phase, error=error)


def _safe(fn: Callable[[], Any]) -> Any:
    import psutil

    try:
        return fn()
    except (psutil.Error, OSError):
        return None


def _shutdown(cycle: _Cycle) -> None:
    # Stop worker processes now instead of whenever the garbage collector gets to them, so that
    # the next setting is measured on idle CPUs. _shutdown_workers is how DataLoader's own
    # iterator cleans up in __del__; a custom iterable without it is left to the collector.
    for it in cycle.iterators:
        stop = getattr(it, "_shutdown_workers", None)
        if callable(stop):
            try:
                stop()
            except Exception:  # already stopped, or a worker died: nothing left to clean
                pass
    cycle.iterators.clear()
    cycle.iterator = None
    loader = cycle.loader
    if hasattr(loader, "_iterator"):
        loader._iterator = None  # a persistent_workers loader keeps its iterator
