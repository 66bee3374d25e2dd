"""What the machine and the dataset can do, measured before any loader runs.

:func:`probe_machine` answers "how many CPUs can my workers really get, and how much memory":
CPUs usable by this process (affinity, cgroup quota), logical vs physical cores, CPU time taken
by other processes over a short window, RAM and the cgroup memory limit, and, when an
accelerator exists, the host-to-device copy speed from pageable and from pinned memory.

:func:`probe_dataset` answers "how expensive is one image": the single-core cost of
``dataset[i]`` (read + decode + transform) and of collating, the bytes a batch carries between
processes, and the read speed of a sample of the dataset's files.
"""

from __future__ import annotations

import dataclasses
import math
import os
import platform
import socket
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from detloader import _system
from detloader.errors import DetloaderValueError
from detloader.tune.records import Record


@dataclass(frozen=True)
class MachineProbe(Record):
    """The machine as this process sees it. CPUs are counts (floats where measured over time),
    memory is bytes, copy speeds are GB/s (10**9 bytes per second).

    ``free_cpus`` = ``usable_cpus`` minus the CPUs other processes kept busy during the probe
    window, never below 0: the CPUs our workers can take without slowing someone else down.
    """

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
    """The single-core cost of this dataset's samples, measured in the main process.

    ``ms_per_image``: mean wall time of ``dataset[i]`` (read + decode + transform) with one
    intra-op thread, as a worker runs it; ``collate_ms_per_image``: the collate function's
    share per image; ``batch_bytes``: bytes of one collated batch (what a worker sends through
    shared memory, and what ``pin_memory`` copies); ``read_ms_per_file`` / ``read_mb_per_s``:
    reading a sample of the image files after asking the kernel to drop them from its page
    cache (None when the dataset does not expose file paths).
    """

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
def host_to_device_gbps(
    device: str, nbytes: int = 64 << 20, repeats: int = 5
) -> tuple[float, float]:
    """Copy speed host -> ``device`` in GB/s from pageable and from pinned memory (best of
    ``repeats`` copies of ``nbytes``). This is what ``pin_memory=True`` buys per batch."""
    import torch

    sync = device_synchronizer(device)
    pageable = torch.empty(nbytes, dtype=torch.uint8)
    pinned = torch.empty(nbytes, dtype=torch.uint8).pin_memory()
    target = torch.empty(nbytes, dtype=torch.uint8, device=device)

    def best(src: torch.Tensor, non_blocking: bool) -> float:
        times = []
        for _ in range(repeats + 1):  # the first copy warms up the driver
            sync()
            t = time.perf_counter()
            target.copy_(src, non_blocking=non_blocking)
            sync()
            times.append(time.perf_counter() - t)
        return nbytes / min(times[1:]) / 1e9

    return best(pageable, False), best(pinned, True)  # the buffers go with this frame


def device_synchronizer(device: str) -> Callable[[], None]:
    """``torch.<type>.synchronize`` for ``device`` (waits for its queued work), or a no-op."""
    import torch

    kind = torch.device(device).type
    module = getattr(torch, kind, None)
    sync = getattr(module, "synchronize", None)
    return sync if callable(sync) else (lambda: None)


def probe_machine(busy_window_s: float = 1.0, copy_speed: bool = True) -> MachineProbe:
    """Probe this machine (takes about ``busy_window_s`` seconds, plus a copy test on an
    accelerator when ``copy_speed``)."""
    import torch

    usable = _system.usable_cpus()
    affinity = _system.affinity_cpus()
    busy = _system.busy_cpus(busy_window_s) if busy_window_s > 0 else 0.0
    mem = _system.memory_facts()
    kind, name, count = _system.accelerator_info()
    pageable = pinned = None
    if copy_speed and kind in _system.PINNABLE:
        try:
            pageable, pinned = host_to_device_gbps(kind)
        except (RuntimeError, MemoryError):  # a full device: the copy test is optional
            pageable = pinned = None
    return MachineProbe(
        logical_cpus=_system.logical_cores(),
        physical_cpus=_system.physical_cores(),
        affinity_cpus=affinity,
        cgroup_cpu_quota=_system.cgroup_cpu_limit(),
        usable_cpus=usable,
        busy_cpus=round(busy, 2),
        free_cpus=round(free_cpus(usable, affinity, busy), 2),
        busy_window_s=busy_window_s,
        memory_total=mem.total,
        memory_available=mem.available,
        cgroup_memory_limit=mem.cgroup_limit,
        accelerator=kind,
        accelerator_name=name,
        accelerator_count=count,
        h2d_pageable_gbps=pageable,
        h2d_pinned_gbps=pinned,
        hostname=socket.gethostname() or platform.node(),
        torch_version=torch.__version__,
    )


def free_cpus(usable: int, affinity: int, busy: float) -> float:
    """CPUs left for us: the CPUs we may run on minus those others keep busy, capped by our
    quota (``usable``). Others' work on our affinity CPUs eats into them; a cgroup quota
    limits us however idle the machine is."""
    return max(0.0, min(float(usable), affinity - busy))


# -- dataset ------------------------------------------------------------------------------------
def image_paths(dataset: Any, ids: Sequence[int]) -> list[Path] | None:
    """Files behind ``dataset[i]`` for ``ids``, when the dataset exposes them: an
    ``AnnotationIndex`` (``image_path(i)``) or a dataset with an ``index`` attribute that is
    one. None otherwise."""
    for source in (dataset, getattr(dataset, "index", None)):
        get = getattr(source, "image_path", None)
        if callable(get):
            try:
                return [Path(get(int(i))) for i in ids]
            except (IndexError, TypeError, ValueError):
                return None
    return None


def read_speed(paths: Sequence[Path]) -> tuple[float, float, float] | None:
    """``(ms per file, MB/s, mean bytes)`` reading ``paths`` whole; each file is first dropped
    from the page cache (``fdatasync`` + ``posix_fadvise DONTNEED``, where supported) so that
    the figure is closer to a first epoch than to a memory copy (a network file system may keep
    its own cache). None when no file could be read."""
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
                data = fh.read()
                total_s += time.perf_counter() - t
        except OSError:
            continue
        total_bytes += len(data)
        n += 1
    if n == 0:
        return None
    seconds = max(total_s, 1e-9)
    return total_s / n * 1000.0, total_bytes / seconds / 1e6, total_bytes / n


def batch_nbytes(batch: Any, _depth: int = 0) -> int:
    """Bytes of the tensors and arrays in ``batch`` (tensors, numpy arrays, and any nesting of
    tuples, lists, dicts, dataclasses or plain objects of them)."""
    import torch

    if _depth > 6:
        return 0
    if isinstance(batch, torch.Tensor):
        return int(batch.nelement() * batch.element_size())
    if isinstance(batch, np.ndarray):
        return int(batch.nbytes)
    if isinstance(batch, dict):
        return sum(batch_nbytes(v, _depth + 1) for v in batch.values())
    if isinstance(batch, (list, tuple)):
        return sum(batch_nbytes(v, _depth + 1) for v in batch)
    if dataclasses.is_dataclass(batch) and not isinstance(batch, type):
        return sum(batch_nbytes(getattr(batch, f.name), _depth + 1) for f in dataclasses.fields(batch))
    if hasattr(batch, "__dict__") and not isinstance(batch, type):
        return sum(batch_nbytes(v, _depth + 1) for v in vars(batch).values())
    return 0


def probe_dataset(
    dataset: Any,
    batch_size: int,
    collate_fn: Callable[[list[Any]], Any] | None = None,
    *,
    max_images: int = 32,
    max_seconds: float = 2.0,
    read_files: int = 8,
) -> DatasetProbe:
    """Time ``dataset[i]`` on one core for up to ``max_images`` images spread over the dataset
    (stopping after ``max_seconds``), collate them, and read a sample of its files.

    The first item is a warm-up and is not timed (imports, lazy tables, file-system metadata).
    Runs with ``torch.set_num_threads(1)``, as DataLoader workers do.
    """
    import torch
    from torch.utils.data import default_collate

    n = len(dataset)
    if n == 0:
        raise DetloaderValueError("probe_dataset: the dataset is empty (len(dataset)=0)")
    if batch_size < 1:
        raise DetloaderValueError(f"probe_dataset: batch_size={batch_size} must be >= 1")
    collate = collate_fn if collate_fn is not None else default_collate
    ids = np.unique(np.linspace(0, n - 1, num=min(n, max_images + 1)).round().astype(np.int64))
    read = None
    paths = image_paths(dataset, ids[1 : 1 + read_files]) if read_files > 0 else None
    if paths:
        read = read_speed(paths)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    timed_ids = ids[1:] if len(ids) > 1 else ids  # a one-image dataset: time it again
    try:
        warm = dataset[int(ids[0])]
        samples = []
        start = time.perf_counter()
        for i in timed_ids:
            samples.append(dataset[int(i)])
            if time.perf_counter() - start > max_seconds:
                break
        item_s = time.perf_counter() - start
        group = ((samples or [warm]) * (batch_size // max(1, len(samples)) + 1))[:batch_size]
        collate(group)  # warm-up
        t = time.perf_counter()
        batch = collate(group)
        collate_s = time.perf_counter() - t
    finally:
        torch.set_num_threads(threads)
    timed = len(samples)
    ms = item_s / timed * 1000.0
    return DatasetProbe(
        images=timed,
        ms_per_image=round(ms, 4),
        collate_ms_per_image=round(collate_s / batch_size * 1000.0, 4),
        batch_bytes=batch_nbytes(batch),
        batch_size=batch_size,
        read_files=len(paths) if paths and read else 0,
        read_ms_per_file=round(read[0], 4) if read else None,
        read_mb_per_s=round(read[1], 2) if read else None,
        file_bytes_mean=round(read[2], 1) if read else None,
    )
