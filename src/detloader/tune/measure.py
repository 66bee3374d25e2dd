"""Measure one loader setting: a real loader, warmed up, timed over a short window.

A *loader factory* is any callable that takes DataLoader keyword arguments (``num_workers``,
``pin_memory``, ``prefetch_factor``, ``persistent_workers``) and returns an iterable of
batches, e.g. ``functools.partial(torch.utils.data.DataLoader, dataset, batch_size=32)``.
"""

from __future__ import annotations

import gc
import math
import time
from collections.abc import Callable, Generator, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from detloader import _system
from detloader.errors import DetloaderValueError
from detloader.loader.auto import loader_kwargs  # noqa: F401  (measure's users read it here)
from detloader.tune.probe import Record, device_synchronizer

LoaderFactory = Callable[..., Iterable[Any]]
#: A consumer gets each batch, as a training step would; it runs in the main process.
Consumer = Callable[[Any], None]


@dataclass
class Trial(Record):
    """What one setting measured: rates per second of wall time, CPU in cores, memory in MiB,
    latencies in milliseconds. ``latency_*_ms``: the wait inside ``next(iterator)`` per batch;
    ``startup_s``: ``iter(loader)`` to the first batch; ``worker_uss_mib`` / ``worker_pss_mib``:
    mean per worker; ``wait_fraction``: with a consumer, the share of the window spent waiting;
    ``others_cpu``: CPUs other processes kept busy during the window; ``error``: why the setting
    could not be measured. ``images`` / ``batches`` / ``seconds``: the span the rate is counted
    over (:func:`steady_rate`); CPU figures cover the whole window.
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


def images_in(batch: Any, default: int) -> int:
    """Images in a batch: the first dimension of its images (an ``images`` attribute or key, a
    tensor, or the first element of a tuple/list), else ``default``."""
    keyed = batch.get("images") if isinstance(batch, dict) else None
    for candidate in (getattr(batch, "images", None), keyed, batch):
        if candidate is not None and len(getattr(candidate, "shape", ())) > 0:
            return int(candidate.shape[0])
    if isinstance(batch, (list, tuple)) and batch:
        return images_in(batch[0], default)
    return default


def to_device(batch: Any, device: str, non_blocking: bool) -> Any:
    """Every tensor in ``batch`` (through tuples, lists, dicts; an object with a ``to``
    method, such as :class:`~detloader.loader.collate.Batch`, moves itself) moved to ``device``."""
    from torch.utils._pytree import tree_map

    def move(x: Any) -> Any:
        to = getattr(x, "to", None)
        return to(device, non_blocking=non_blocking) if callable(to) and not isinstance(x, type) else x

    return tree_map(move, batch)


def make_consumer(step_time: float | Consumer | None, device: str | None, pin_memory: bool) -> Consumer | None:
    """The per-batch work of the measured loop: the copy to ``device`` (non-blocking when
    pinned, then waited for), then the step: ``step_time`` seconds of sleep (a step waiting on
    the accelerator) or a callable. None: the loader alone."""
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
        if callable(step_time):
            step_time(batch)
        elif step_time is not None:
            time.sleep(seconds)

    return consume


def _cycle(loader: Iterable[Any], iterators: list[Iterator[Any]]) -> Generator[Any, None, None]:
    """Batches from ``loader`` epoch after epoch (a small dataset must not end the window); each
    epoch's iterator goes to ``iterators``, so that its workers can be stopped."""
    while True:
        iterators.append(iter(loader))
        yielded = False
        for batch in iterators[-1]:
            yielded = True
            yield batch
        if not yielded:
            raise DetloaderValueError("the loader yields no batch (empty dataset, or drop_last with too few samples)")


def _stop_workers(loader: Any, iterators: list[Iterator[Any]]) -> None:
    """Stop the workers now, so that the next setting starts on idle CPUs
    (``_shutdown_workers`` is what DataLoader's iterator runs in ``__del__``)."""
    for it in iterators:
        try:
            getattr(it, "_shutdown_workers", lambda: None)()
        except Exception:  # noqa: BLE001 - already stopped, or a worker died: nothing left to clean
            pass
    iterators.clear()
    if hasattr(loader, "_iterator"):
        loader._iterator = None  # a persistent_workers loader keeps its iterator


def _cpu_s(proc: Any, children: bool = False) -> float | None:
    """CPU seconds of ``proc`` (of its reaped children with ``children``); None once gone."""
    import psutil

    try:
        t = proc.cpu_times()
    except (psutil.Error, OSError):
        return None
    return float(t.children_user + t.children_system) if children else float(t.user + t.system)


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
    seconds and ``min_batches`` batches (default: two rounds of workers, at least 4), ending
    after 2 batches past ``deadline`` (a ``time.perf_counter()`` value).

    Warm-up: the first batch (``startup_s``), then the ``num_workers * prefetch_factor``
    batches the workers prepared while starting (a rate over that burst would be too high).
    Workers are stopped before returning. A setting that raises comes back with ``error``.
    """
    import psutil

    me = psutil.Process()
    before = {p.pid for p in me.children(recursive=True)}
    workers_n = int(settings.get("num_workers", 0))
    if min_batches is None:
        min_batches = max(4, 2 * workers_n + 1)
    consume = consumer or (lambda batch: None)
    loader: Any = None
    iterators: list[Iterator[Any]] = []
    cycle: Generator[Any, None, None] | None = None
    try:
        loader = factory(**settings)
        cycle = _cycle(loader, iterators)
        startup = _warm_up(cycle, consume, workers_n * int(settings.get("prefetch_factor") or 2))
        start_cpu = {p.pid: _cpu_s(p) for p in _workers(me, before)}
        main0, reaped0, stat0 = _cpu_s(me), _cpu_s(me, children=True), _system.cpu_sample()
        timed = _time_window(cycle, consume, batch_size, min_batches, window_s, deadline)
        waits, steps, wall = timed.waits, timed.steps, timed.wall
        stat1 = _system.cpu_sample()
        main_cpu = ((_cpu_s(me) or 0.0) - (main0 or 0.0)) / wall
        images, batches, seconds = steady_rate(timed.arrivals, waits, timed.counts, wall)
        procs = _workers(me, before)
        workers_cpu_s, uss, pss = _worker_usage(procs, start_cpu, (_cpu_s(me, children=True) or 0.0) - (reaped0 or 0.0))
        workers_cpu = max(0.0, workers_cpu_s / wall)
        total = _system.busy_from_samples(stat0, stat1, 0.0, wall, _system.affinity_set())
        w = np.asarray(waits) * 1000.0
        return Trial(
            settings=dict(settings), images_per_s=images / seconds, images=images, batches=batches,
            seconds=seconds, startup_s=startup, latency_p50_ms=float(np.percentile(w, 50)),
            latency_p95_ms=float(np.percentile(w, 95)), main_cpu=main_cpu, workers_cpu=workers_cpu,
            workers=len(procs), worker_uss_mib=float(np.mean(uss)) if uss else None,
            worker_pss_mib=float(np.mean(pss)) if pss else None, main_rss_mib=me.memory_info().rss / 2**20,
            wait_fraction=float(sum(waits) / wall) if consumer is not None else None,
            step_ms=float(np.mean(steps) * 1000.0) if consumer is not None else None,
            others_cpu=max(0.0, total - main_cpu - workers_cpu), phase=phase,
        )
    except (RuntimeError, OSError, ValueError, TypeError) as err:
        # a crashed worker, a refused combination, an exhausted loader: record, do not abort
        return failed_trial(settings, f"{type(err).__name__}: {err}", phase)
    finally:
        if cycle is not None:
            cycle.close()
        _stop_workers(loader, iterators)
        gc.collect()


def _warm_up(cycle: Iterator[Any], consume: Consumer, prepared: int) -> float:
    """Consume the first batch and then the ``prepared`` ones the workers made while starting;
    the seconds the first batch took (``startup_s``)."""
    t0 = time.perf_counter()
    consume(next(cycle))
    startup = time.perf_counter() - t0
    for _ in range(prepared):
        consume(next(cycle))
    return startup


@dataclass
class _Window:
    """One measuring window, per batch: when it arrived, the wait for it, its images and the
    consumer's time on it (``time.perf_counter`` seconds); ``wall``: the window's length."""

    arrivals: list[float]
    waits: list[float]
    counts: list[int]
    steps: list[float]
    wall: float


def _time_window(cycle: Iterator[Any], consume: Consumer, batch_size: int, min_batches: int, window_s: float,
                 deadline: float | None) -> _Window:
    """Time batches until ``min_batches`` and ``window_s`` seconds are reached, or 2 batches
    past ``deadline``."""
    timed = _Window([], [], [], [], 0.0)
    waits, arrivals = timed.waits, timed.arrivals
    t_start = time.perf_counter()
    while True:
        t = time.perf_counter()
        batch = next(cycle)
        arrivals.append(time.perf_counter())
        waits.append(arrivals[-1] - t)
        timed.counts.append(images_in(batch, batch_size))
        consume(batch)
        now = time.perf_counter()
        timed.steps.append(now - arrivals[-1])
        if len(waits) >= min_batches and now - t_start >= window_s:
            break
        if deadline is not None and now > deadline and len(waits) >= 2:
            break
    timed.wall = time.perf_counter() - t_start
    return timed


def _worker_usage(procs: list[Any], start_cpu: Mapping[int, float | None],
                  cpu_s: float) -> tuple[float, list[float], list[float]]:
    """``cpu_s`` (the CPU seconds of workers already reaped) plus each live worker's CPU
    seconds since the window began, and the USS and PSS (MiB) of each worker still readable."""
    import psutil

    uss, pss = [], []
    for p in procs:
        cpu = _cpu_s(p)
        if cpu is not None:
            cpu_s += cpu - (start_cpu.get(p.pid) or 0.0)
        try:
            info = p.memory_full_info()
        except (psutil.Error, OSError):
            continue
        uss.append(info.uss / 2**20)
        if getattr(info, "pss", None) is not None:
            pss.append(info.pss / 2**20)
    return cpu_s, uss, pss


def steady_rate(arrivals: list[float], waits: list[float], counts: list[int], wall: float) -> tuple[int, int, float]:
    """``(images, batches, seconds)`` to count the rate over: batch ``i`` arrived at
    ``arrivals[i]`` after a wait of ``waits[i]`` and holds ``counts[i]`` images. Between two
    batches the consumer *waited* for (an empty queue), the loader delivered exactly what it
    produced, bursts or not; so the rate runs from the first waited-for batch to the last when
    that span covers a third of the window, else (a consumer that never waits) over all of it.
    """
    n = len(arrivals)
    if n < 2:
        return sum(counts), n, wall
    threshold = max(0.002, 0.25 * (arrivals[-1] - arrivals[0]) / (n - 1))
    waited = [i for i in range(n) if waits[i] >= threshold]
    if len(waited) >= 2:
        first, last = waited[0], waited[-1]
        span = arrivals[last] - arrivals[first]
        if span > 0 and span >= wall / 3:
            return sum(counts[first + 1 : last + 1]), last - first, span
    return sum(counts), n, wall


def failed_trial(settings: Mapping[str, Any], error: str, phase: str = "") -> Trial:
    """A trial that produced nothing, with the reason."""
    return Trial(dict(settings), 0.0, 0, 0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0, None, None, 0.0, phase=phase, error=error)
