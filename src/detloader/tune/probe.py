"""What the machine (:func:`probe_machine`) and the dataset (:func:`probe_dataset`) can do,
measured before any loader runs (docs/tuning.md, "What the tuner does", steps 1 and 2).
"""

from __future__ import annotations

import dataclasses
import math
import socket
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

import numpy as np

from detloader import _system
from detloader.errors import DetloaderValueError
from detloader.loader.auto import free_cpus

R = TypeVar("R", bound="Record")


class Record:
    """A dataclass of JSON values: :meth:`to_dict`, and :meth:`from_dict`, which drops keys the
    class does not have (a file written by a later detloader stays readable)."""

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)  # type: ignore[call-overload]

    @classmethod
    def from_dict(cls: type[R], data: Mapping[str, Any]) -> R:
        names = {f.name for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
        return cls(**{k: v for k, v in data.items() if k in names})


@dataclass(frozen=True)
class MachineProbe(Record):
    """The machine as this process sees it: CPU counts (floats where measured over time),
    memory in bytes. ``free_cpus`` = ``usable_cpus`` minus the CPUs other
    processes kept busy during the probe window, never below 0."""

    logical_cpus: int
    physical_cpus: int | None
    affinity_cpus: int
    cgroup_cpu_quota: float | None
    usable_cpus: int
    busy_cpus: float
    free_cpus: float
    busy_window_s: float
    memory_total: int
    memory_available: int
    cgroup_memory_limit: int | None
    accelerator: str | None = None  # "cuda", "xpu", "mps", ... or None
    accelerator_name: str | None = None
    accelerator_count: int = 0
    hostname: str = ""
    torch_version: str = ""

    @property
    def can_pin(self) -> bool:
        """True when ``pin_memory=True`` can speed up copies (a CUDA or XPU device exists)."""
        return self.accelerator in _system.PINNABLE


@dataclass(frozen=True)
class DatasetProbe(Record):
    """The single-core cost of this dataset's samples (one intra-op thread, as a worker runs
    them): ``ms_per_image`` for ``dataset[i]``, the collate function's share per image, the
    bytes of one collated batch."""

    images: int
    ms_per_image: float
    collate_ms_per_image: float
    batch_bytes: int
    batch_size: int

    @property
    def images_per_s_per_core(self) -> float:
        """Throughput one worker could reach if nothing else cost time."""
        total = self.ms_per_image + self.collate_ms_per_image
        return 1000.0 / total if total > 0 else math.inf


# -- machine ------------------------------------------------------------------------------------
def device_synchronizer(device: str) -> Callable[[], None]:
    """``torch.<type>.synchronize`` for ``device`` (waits for its queued work), or a no-op."""
    import torch

    sync = getattr(getattr(torch, torch.device(device).type, None), "synchronize", None)
    return sync if callable(sync) else (lambda: None)


def probe_machine(busy_window_s: float = 1.0) -> MachineProbe:
    """Probe this machine (it takes about ``busy_window_s`` seconds)."""
    import torch

    usable, affinity = _system.usable_cpus(), _system.affinity_cpus()
    busy = _system.busy_cpus(busy_window_s) if busy_window_s > 0 else 0.0
    mem = _system.memory_facts()
    kind, name, count = _system.accelerator_info()
    return MachineProbe(
        logical_cpus=_system.logical_cores(), physical_cpus=_system.physical_cores(), affinity_cpus=affinity,
        cgroup_cpu_quota=_system.cgroup_cpu_limit(), usable_cpus=usable, busy_cpus=round(busy, 2),
        free_cpus=round(free_cpus(usable, affinity, busy), 2), busy_window_s=busy_window_s,
        memory_total=mem.total, memory_available=mem.available, cgroup_memory_limit=mem.cgroup_limit,
        accelerator=kind, accelerator_name=name, accelerator_count=count, hostname=socket.gethostname(),
        torch_version=torch.__version__,
    )


# -- dataset ------------------------------------------------------------------------------------
def batch_nbytes(batch: Any, _depth: int = 0) -> int:
    """Bytes of the tensors and arrays in ``batch``, through tuples, lists, dicts and the
    attributes of objects (a :class:`~detloader.loader.collate.Batch`)."""
    if hasattr(batch, "element_size") and hasattr(batch, "nelement"):
        return int(batch.nelement() * batch.element_size())
    if isinstance(batch, np.ndarray):
        return int(batch.nbytes)
    if isinstance(batch, dict):
        parts: Any = batch.values()
    elif isinstance(batch, (list, tuple)):
        parts = batch
    else:
        parts = vars(batch).values() if hasattr(batch, "__dict__") and not isinstance(batch, type) else ()
    return sum(batch_nbytes(v, _depth + 1) for v in parts) if _depth < 6 else 0


def probe_dataset(
    dataset: Any,
    batch_size: int,
    collate_fn: Callable[[list[Any]], Any] | None = None,
    *,
    max_images: int = 32,
    max_seconds: float = 2.0,
) -> DatasetProbe:
    """Time ``dataset[i]`` with one intra-op thread for up to ``max_images`` images spread over
    the dataset (stopping after ``max_seconds``; the first is an untimed warm-up) and collate
    them."""
    import torch
    from torch.utils.data import default_collate

    n = len(dataset)
    if n == 0:
        raise DetloaderValueError("probe_dataset: the dataset is empty (len(dataset)=0)")
    if batch_size < 1:
        raise DetloaderValueError(f"probe_dataset: batch_size={batch_size} must be >= 1")
    collate = collate_fn if collate_fn is not None else default_collate
    ids = np.unique(np.linspace(0, n - 1, num=min(n, max_images + 1)).round().astype(np.int64))
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        samples = [dataset[int(ids[0])]]  # warm-up (imports, lazy tables, file-system metadata)
        start = time.perf_counter()
        for i in ids[1:] if len(ids) > 1 else ids:  # a one-image dataset: timed again
            samples.append(dataset[int(i)])
            if time.perf_counter() - start > max_seconds:
                break
        item_s = time.perf_counter() - start
        timed = len(samples) - 1
        group = (samples[1:] * (batch_size // timed + 1))[:batch_size]
        collate(group)  # warm-up
        t = time.perf_counter()
        batch = collate(group)
        collate_s = time.perf_counter() - t
    finally:
        torch.set_num_threads(threads)
    return DatasetProbe(
        images=timed,
        ms_per_image=round(item_s / timed * 1000.0, 4),
        collate_ms_per_image=round(collate_s / batch_size * 1000.0, 4),
        batch_bytes=batch_nbytes(batch),
        batch_size=batch_size,
    )
