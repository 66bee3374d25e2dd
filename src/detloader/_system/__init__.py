"""Small facts about the machine that several stages need: CPUs for worker pools, memory, the
accelerator. Read in this order: ``cgroups`` (where the limits are), ``cpus``, ``memory``,
``accelerator``.
"""

from detloader._system.accelerator import (
    PINNABLE,
    accelerator_available,
    accelerator_info,
    accelerator_kind,
)
from detloader._system.cgroups import (
    CgroupMount,
    cgroup_chain,
    cgroup_cpu_limit,
    cgroup_memory_limit,
    cgroup_memory_usage,
    parse_cfs,
    parse_cpu_max,
    parse_memory_limit,
    parse_mountinfo,
    parse_proc_cgroup,
)
from detloader._system.cpus import (
    affinity_cpus,
    affinity_set,
    busy_cpus,
    busy_from_samples,
    busy_now,
    cpu_sample,
    local_world_size,
    logical_cores,
    physical_cores,
    usable_cpus,
)
from detloader._system.memory import MemoryFacts, memory_facts

__all__ = [
    "PINNABLE", "CgroupMount", "MemoryFacts", "accelerator_available", "accelerator_info",
    "accelerator_kind", "affinity_cpus", "affinity_set", "busy_cpus", "busy_from_samples",
    "busy_now", "cgroup_chain", "cgroup_cpu_limit", "cgroup_memory_limit", "cgroup_memory_usage",
    "cpu_sample",
    "local_world_size", "logical_cores", "memory_facts", "parse_cfs", "parse_cpu_max",
    "parse_memory_limit", "parse_mountinfo", "parse_proc_cgroup",
    "physical_cores", "usable_cpus",
]
