"""CPUs: how many this process may use (affinity, cgroup quota), and how many others keep busy.
All cheap except :func:`busy_cpus`, which watches the machine on purpose (``detloader tune`` uses
it; ``make_loader`` never does).
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterable

from detloader._system.cgroups import cgroup_cpu_limit, read_text


def affinity_cpus() -> int:
    """CPUs this process may run on (its affinity mask), at least 1."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


def affinity_set() -> frozenset[int]:
    """Ids of the CPUs this process may run on (all CPUs where affinity is not supported)."""
    try:
        return frozenset(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return frozenset(range(os.cpu_count() or 1))


def logical_cores() -> int:
    """Logical CPUs of the machine (hardware threads), whatever this process may use."""
    return max(1, os.cpu_count() or 1)


def physical_cores() -> int | None:
    """Physical cores of the machine (hyper-threads counted once), or None when unknown."""
    import psutil

    return psutil.cpu_count(logical=False) or None


def usable_cpus() -> int:
    """CPUs this process can really use: its affinity, capped by a cgroup CPU quota."""
    n = affinity_cpus()
    limit = cgroup_cpu_limit()
    if limit is not None:
        n = min(n, max(1, int(limit)))
    return n


def local_world_size() -> int:
    """Training processes sharing this machine (``LOCAL_WORLD_SIZE``; 1 when unset/invalid)."""
    try:
        return max(1, int(os.environ.get("LOCAL_WORLD_SIZE", "1")))
    except ValueError:
        return 1


# -- CPUs taken by others -----------------------------------------------------------------------
def cpu_sample() -> dict[int, tuple[float, float]]:
    """Per-CPU ``(busy, total)`` seconds since boot (psutil). Busy is everything but idle and
    iowait (a CPU waiting for a disk can run our workers); guest time is already in user."""
    import psutil

    out = {}
    for cpu, times in enumerate(psutil.cpu_times(percpu=True)):
        t = times._asdict()
        total = sum(v for k, v in t.items() if k not in ("guest", "guest_nice"))
        out[cpu] = (total - t["idle"] - t.get("iowait", 0.0), total)
    return out


def busy_from_samples(
    before: dict[int, tuple[float, float]],
    after: dict[int, tuple[float, float]],
    own_cpu_s: float,
    wall_s: float,
    cpus: Iterable[int] | None = None,
) -> float:
    """CPUs' worth of work done by other processes between two :func:`cpu_sample` samples:
    the busy share of each CPU in ``cpus`` (default all) summed, less this process's own
    ``own_cpu_s / wall_s``, clamped to ``[0, len(cpus)]``."""
    ids = set(before) & set(after) & (set(cpus) if cpus is not None else set(before))
    busy = 0.0
    for c in ids:
        dt = after[c][1] - before[c][1]
        if dt > 0:
            busy += min(1.0, max(0.0, (after[c][0] - before[c][0]) / dt))
    own = own_cpu_s / wall_s if wall_s > 0 else 0.0
    return float(min(len(ids), max(0.0, busy - own)))


def busy_cpus(window_s: float = 0.5) -> float:
    """CPUs of our affinity set kept busy by other processes over ``window_s`` seconds (this
    call sleeps). This process's own CPU time is taken out; its child processes' is not (a
    background job started by us competes like any other)."""
    import psutil

    me = psutil.Process()
    before, own0, t0 = cpu_sample(), sum(me.cpu_times()[:2]), time.perf_counter()
    time.sleep(window_s)
    after, own, wall = cpu_sample(), sum(me.cpu_times()[:2]) - own0, time.perf_counter() - t0
    return busy_from_samples(before, after, own, wall, affinity_set())


def load_figures() -> tuple[float, int | None]:
    """The 1-minute load average and the tasks runnable at this instant (``/proc/loadavg``;
    ``None`` for the second where only ``os.getloadavg`` exists). ``(0.0, None)`` without either."""
    text = read_text("/proc/loadavg")
    try:
        if text is not None:
            fields = text.split()
            return float(fields[0]), int(fields[3].split("/")[0])
        return os.getloadavg()[0], None
    except (AttributeError, OSError, ValueError, IndexError):
        return 0.0, None


def busy_now() -> float:
    """CPUs of our affinity set kept busy by other processes, from the kernel's load figures
    (instant, coarse; 0 without them): the smaller of the 1-minute average and the tasks
    runnable now (the average still remembers a tuning run's just-stopped workers), less one
    for this process, scaled to our share of the machine's CPUs, clamped to ``[0, affinity]``."""
    average, running = load_figures()
    load = min(average, running) if running is not None else average
    mine = affinity_cpus()
    return float(min(mine, max(0.0, load - 1.0) * mine / logical_cores()))
