"""What every stage stands on. Small facts about the machine that several stages need: CPUs,
memory, the accelerator (read in this order: ``cgroups``, its parsers reached through the
module, ``cpus``, ``memory``, ``accelerator``), and :data:`VERSION`. Helpers of their own
modules: ``files`` (reading and writing files safely), ``locks`` (file locks that leave nothing
behind), ``pool`` (worker processes a plain script can start), ``cache_dir`` (the user cache
folder and the record of what detloader wrote there), ``plotting`` (a matplotlib figure).
"""

from detloader._system.accelerator import PINNABLE, accelerator_available, accelerator_info, accelerator_kind
from detloader._system.cgroups import cgroup_cpu_limit, cgroup_memory_limit, cgroup_memory_usage
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

#: detloader's version (``detloader.__version__``), which files detloader writes record
VERSION = "0.1.0"

__all__ = [
    "PINNABLE", "MemoryFacts", "accelerator_available", "accelerator_info", "accelerator_kind", "affinity_cpus",
    "affinity_set", "busy_cpus", "busy_from_samples", "busy_now", "cgroup_cpu_limit", "cgroup_memory_limit",
    "cgroup_memory_usage", "cpu_sample", "local_world_size", "logical_cores", "memory_facts", "physical_cores",
    "usable_cpus", "VERSION",
]
