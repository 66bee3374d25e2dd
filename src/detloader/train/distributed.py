"""Distributed data parallel under ``torchrun``: process group, devices, gathering.

:func:`init_distributed` reads torchrun's ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK`` and starts the
process group (``nccl`` on CUDA, one GPU per local rank; ``gloo`` on CPU); without them everything
here is a no-op for one process.
"""

from __future__ import annotations

import gc
import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from detloader.errors import DetloaderValueError


@dataclass(frozen=True)
class DistEnv:
    """This process's place: ``rank`` of ``world_size``, ``local_rank`` on its node, the
    ``device`` it computes on, and whether it started the process group (``owns_group``)."""

    rank: int
    world_size: int
    local_rank: int
    device: torch.device
    owns_group: bool = False

    @property
    def distributed(self) -> bool:
        return self.world_size > 1

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def _device(name: str, local_rank: int) -> torch.device:
    """``"auto"``: CUDA (``cuda:local_rank``) when available, else CPU."""
    if name not in ("auto", "cpu", "cuda"):
        raise DetloaderValueError(f"device={name!r} is not one of ('auto', 'cpu', 'cuda')")
    if name == "cpu" or (name == "auto" and not torch.cuda.is_available()):
        return torch.device("cpu")
    if not torch.cuda.is_available():
        raise DetloaderValueError("device='cuda' but torch.cuda.is_available() is False")
    return torch.device("cuda", local_rank % torch.cuda.device_count())


def init_distributed(device: str = "auto") -> DistEnv:
    """Join the process group described by torchrun's environment (if any) and pick the
    device. A group that already exists (e.g. started by the caller) is used as it is."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    owns = False
    if dist.is_available() and dist.is_initialized():
        rank, world = dist.get_rank(), dist.get_world_size()
    elif world > 1:
        dev = _device(device, local_rank)
        if dev.type == "cuda":
            torch.cuda.set_device(dev)
        dist.init_process_group("nccl" if dev.type == "cuda" else "gloo")
        rank, owns = dist.get_rank(), True
    else:
        rank = 0
    return DistEnv(rank, world, local_rank, _device(device, local_rank), owns)


@contextmanager
def running_distributed(device: str = "auto") -> Iterator[DistEnv]:
    """:func:`init_distributed` for the ``with`` block; then the process group it started is
    destroyed. A block that ended normally first meets the other ranks at a barrier (a rank
    that tears its group down while another still has gloo work in flight can abort that
    process at exit); after an error there is no waiting, since the others may never get there."""
    env = init_distributed(device)
    ended = False
    try:
        yield env
        ended = True
    finally:
        if env.owns_group and dist.is_initialized():
            try:
                if ended:
                    dist.barrier()
            finally:
                gc.collect()  # a cycle still holding the DDP model (its reducer) goes before the group it uses
                dist.destroy_process_group()


def barrier(env: DistEnv) -> None:
    if env.distributed:
        dist.barrier()


def all_gather_objects(env: DistEnv, obj: Any) -> list[Any]:
    """Every rank's ``obj`` (picklable), in rank order; ``[obj]`` in one process."""
    if not env.distributed:
        return [obj]
    out: list[Any] = [None] * env.world_size
    dist.all_gather_object(out, obj)
    return out


def broadcast_object(env: DistEnv, obj: Any) -> Any:
    """Rank 0's ``obj`` on every rank."""
    if not env.distributed:
        return obj
    box = [obj]
    dist.broadcast_object_list(box, src=0)
    return box[0]
