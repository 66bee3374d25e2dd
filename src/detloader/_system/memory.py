"""Memory: host RAM (psutil) combined with the cgroup memory limit, in bytes."""

from __future__ import annotations

from dataclasses import dataclass

from detloader._system.cgroups import cgroup_memory_limit, cgroup_memory_usage


@dataclass(frozen=True)
class MemoryFacts:
    """Host and cgroup memory in bytes. ``available`` is what a new process can still take:
    the host's available memory, capped by the cgroup's remaining room when it has a limit."""

    total: int
    available: int
    cgroup_limit: int | None


def memory_facts() -> MemoryFacts:
    """RAM total/available (psutil) combined with the cgroup memory limit and usage (the room left)."""
    import psutil

    vm = psutil.virtual_memory()
    limit = cgroup_memory_limit()
    usage = cgroup_memory_usage() if limit is not None else None
    available = int(vm.available)
    if limit is not None:
        available = min(available, max(0, limit - (usage or 0)))
    return MemoryFacts(int(vm.total), available, limit)
