"""What the machine and the dataset can do, measured before any loader runs.

:func:`probe_machine`: the CPUs this process may use (affinity, cgroup quota), those other
processes keep busy over a short window, memory (with the cgroup limit) and, with an
accelerator, the host-to-device copy speed from pageable and from pinned memory.
:func:`probe_dataset`: the single-core cost of ``dataset[i]`` and of collating, the bytes of a
batch, and the read speed of a sample of the dataset's files.
"""

from __future__ import annotations

import dataclasses
import math
import os
import socket
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import numpy as np

from detloader import _system
from detloader.errors import DetloaderValueError

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
    memory in bytes, copy speeds in GB/s. ``free_cpus`` = ``usable_cpus`` minus the CPUs other
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
    h2d_pageable_gbps: float | None = None
    h2d_pinned_gbps: float | None = None
    hostname: str = ""
    torch_version: str = ""

    @property
    def can_pin(self) -> bool:
        """True when ``pin_memory=True`` can speed up copies (a CUDA or XPU device exists)."""
        return self.accelerator in _system.PINNABLE


@dataclass(frozen=True)
class DatasetProbe(Record):
    """The single-core cost of this dataset's samples, measured in the main process with one
    intra-op thread, as a worker runs them: ``ms_per_image`` for ``dataset[i]`` (read + decode
    + transform), the collate function's share per image, the bytes of one collated batch, and
    reading a sample of the files after dropping them from the page cache (None when the
    dataset does not expose file paths)."""

    images: int
    ms_per_image: float
    collate_ms_per_image: float
    batch_bytes: int
    batch_size: int
    read_files: int = 0
    read_ms_per_file: float | None = None
    read_mb_per_s: float | None = None
    file_bytes_mean: float | None = None

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


def host_to_device_gbps(device: str, nbytes: int = 64 << 20, repeats: int = 5) -> tuple[float, float]:
    """Copy speed host -> ``device`` in GB/s from pageable and from pinned memory (best of
    ``repeats`` copies after a warm-up): what ``pin_memory=True`` buys per batch."""
    import torch

    sync = device_synchronizer(device)
    target = torch.empty(nbytes, dtype=torch.uint8, device=device)

    def best(src: torch.Tensor, non_blocking: bool) -> float:
        times = []
        for _ in range(repeats + 1):
            sync()
            t = time.perf_counter()
            target.copy_(src, non_blocking=non_blocking)
            sync()
            times.append(time.perf_counter() - t)
        return nbytes / min(times[1:]) / 1e9

    pageable = torch.empty(nbytes, dtype=torch.uint8)
    return best(pageable, False), best(pageable.pin_memory(), True)


def free_cpus(usable: int, affinity: int, busy: float) -> float:
    """CPUs left for us: the CPUs we may run on minus those others keep busy, capped by our
    quota (``usable``)."""
    return max(0.0, min(float(usable), affinity - busy))


def probe_machine(busy_window_s: float = 1.0, copy_speed: bool = True) -> MachineProbe:
    """Probe this machine (about ``busy_window_s`` seconds, plus a copy test on an accelerator
    when ``copy_speed``)."""
    import torch

    usable, affinity = _system.usable_cpus(), _system.affinity_cpus()
    busy = _system.busy_cpus(busy_window_s) if busy_window_s > 0 else 0.0
    mem = _system.memory_facts()
    kind, name, count = _system.accelerator_info()
    pageable = pinned = None
    if copy_speed and kind in _system.PINNABLE:
        try:
            pageable, pinned = host_to_device_gbps(kind)
        except (RuntimeError, MemoryError):  # a full device: the copy test is optional
            pass
    return MachineProbe(
        logical_cpus=_system.logical_cores(), physical_cpus=_system.physical_cores(), affinity_cpus=affinity,
        cgroup_cpu_quota=_system.cgroup_cpu_limit(), usable_cpus=usable, busy_cpus=round(busy, 2),
        free_cpus=round(free_cpus(usable, affinity, busy), 2), busy_window_s=busy_window_s,
        memory_total=mem.total, memory_available=mem.available, cgroup_memory_limit=mem.cgroup_limit,
        accelerator=kind, accelerator_name=name, accelerator_count=count,
        h2d_pageable_gbps=pageable, h2d_pinned_gbps=pinned, hostname=socket.gethostname(),
        torch_version=torch.__version__,
    )


# -- dataset ------------------------------------------------------------------------------------
def image_paths(dataset: Any, ids: Sequence[int]) -> list[Path] | None:
    """Files behind ``dataset[i]`` for ``ids`` when the dataset (or its ``index``) has an
    ``image_path(i)``; None otherwise."""
    for source in (dataset, getattr(dataset, "index", None)):
        get = getattr(source, "image_path", None)
        if callable(get):
            try:
                return [Path(get(int(i))) for i in ids]
            except (IndexError, TypeError, ValueError):
                return None
    return None


def read_speed(paths: Sequence[Path]) -> tuple[float, float, float] | None:
    """``(ms per file, MB/s, mean bytes)`` reading ``paths`` whole, each first dropped from the
    page cache (``fdatasync`` + ``posix_fadvise DONTNEED`` where supported) so that the figure
    is closer to a first epoch than to a memory copy. None when no file could be read."""
    total_bytes, total_s, n = 0, 0.0, 0
    for path in paths:
        try:
            with open(path, "rb") as fh:
                if hasattr(os, "posix_fadvise"):
                    try:  # pages not yet written back cannot be dropped: flush them first
                        os.fdatasync(fh.fileno())
                    except OSError:
                        pass
                    os.posix_fadvise(fh.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)
                t = time.perf_counter()
                total_bytes += len(fh.read())
                total_s += time.perf_counter() - t
                n += 1
        except OSError:
            continue
    if n == 0:
        return None
    return total_s / n * 1000.0, total_bytes / max(total_s, 1e-9) / 1e6, total_bytes / n


def batch_nbytes(batch: Any, _depth: int = 0) -> int:
    """Bytes of the tensors and arrays in ``batch``, through tuples, lists, dicts, dataclasses
    and plain objects."""
    import torch

    if _depth > 6:
        return 0
    if isinstance(batch, torch.Tensor):
        return int(batch.nelement() * batch.element_size())
    if isinstance(batch, np.ndarray):
        return int(batch.nbytes)
    if isinstance(batch, dict):
        parts: Any = batch.values()
    elif isinstance(batch, (list, tuple)):
        parts = batch
    elif dataclasses.is_dataclass(batch) and not isinstance(batch, type):
        parts = [getattr(batch, f.name) for f in dataclasses.fields(batch)]
    elif hasattr(batch, "__dict__") and not isinstance(batch, type):
        parts = vars(batch).values()
    else:
        return 0
    return sum(batch_nbytes(v, _depth + 1) for v in parts)


def probe_dataset(
    dataset: Any,
    batch_size: int,
    collate_fn: Callable[[list[Any]], Any] | None = None,
    *,
    max_images: int = 32,
    max_seconds: float = 2.0,
    read_files: int = 8,
) -> DatasetProbe:
    """Time ``dataset[i]`` with one intra-op thread for up to ``max_images`` images spread over
    the dataset (stopping after ``max_seconds``; the first is an untimed warm-up), collate
    them, and read a sample of its files."""
    import torch
    from torch.utils.data import default_collate

    n = len(dataset)
    if n == 0:
        raise DetloaderValueError("probe_dataset: the dataset is empty (len(dataset)=0)")
    if batch_size < 1:
        raise DetloaderValueError(f"probe_dataset: batch_size={batch_size} must be >= 1")
    collate = collate_fn if collate_fn is not None else default_collate
    ids = np.unique(np.linspace(0, n - 1, num=min(n, max_images + 1)).round().astype(np.int64))
    paths = image_paths(dataset, ids[1 : 1 + read_files]) if read_files > 0 else None
    read = read_speed(paths) if paths else None
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
        read_files=len(paths) if paths and read else 0,
        read_ms_per_file=round(read[0], 4) if read else None,
        read_mb_per_s=round(read[1], 2) if read else None,
        file_bytes_mean=round(read[2], 1) if read else None,
    )
