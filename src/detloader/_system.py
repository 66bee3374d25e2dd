"""Small facts about the machine that several stages need (CPU count for worker pools)."""

from __future__ import annotations

import os


def affinity_cpus() -> int:
    """CPUs this process may run on (its affinity mask), at least 1."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


def cgroup_cpu_limit(cgroup_root: str = "/sys/fs/cgroup") -> float | None:
    """CPU quota of this process's cgroup in CPUs (e.g. 1.5), or None when unlimited/unknown.

    Reads cgroup v2 ``cpu.max`` ("QUOTA PERIOD" or "max PERIOD"), else cgroup v1
    ``cpu/cpu.cfs_quota_us`` and ``cpu/cpu.cfs_period_us`` (quota -1: unlimited).
    """
    v2 = os.path.join(cgroup_root, "cpu.max")
    try:
        with open(v2) as fh:
            return parse_cpu_max(fh.read())
    except OSError:
        pass
    try:
        with open(os.path.join(cgroup_root, "cpu", "cpu.cfs_quota_us")) as fh:
            quota = fh.read()
        with open(os.path.join(cgroup_root, "cpu", "cpu.cfs_period_us")) as fh:
            period = fh.read()
    except OSError:
        return None
    return parse_cfs(quota, period)


def parse_cpu_max(text: str) -> float | None:
    """cgroup v2 ``cpu.max`` -> CPUs, or None for ``max``/unparseable."""
    parts = text.split()
    if len(parts) < 1 or parts[0] == "max":
        return None
    try:
        quota = int(parts[0])
        period = int(parts[1]) if len(parts) > 1 else 100_000
    except ValueError:
        return None
    return quota / period if quota > 0 and period > 0 else None


def parse_cfs(quota_text: str, period_text: str) -> float | None:
    """cgroup v1 CFS quota/period -> CPUs, or None for -1/unparseable."""
    try:
        quota, period = int(quota_text.strip()), int(period_text.strip())
    except ValueError:
        return None
    return quota / period if quota > 0 and period > 0 else None


def usable_cpus() -> int:
    """CPUs this process can really use: its affinity, capped by a cgroup CPU quota."""
    n = affinity_cpus()
    limit = cgroup_cpu_limit()
    if limit is not None:
        n = min(n, max(1, int(limit)))
    return n
