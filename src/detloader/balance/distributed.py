"""Rank arithmetic: which ``rank`` and ``world_size`` a sampler serves, and its share of a draw.

All ranks derive the same *global* draw of an epoch; rank ``r`` of ``W`` takes positions
``r, r + W, r + 2W, ...`` of it, so the union over ranks is exactly the single-process draw
and every rank has the same length (padded by wrapping around, or cut with ``drop_last``).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from detloader.balance.checks import check_int
from detloader.errors import DetloaderValueError


def distributed_defaults(rank: int | None, world_size: int | None) -> tuple[int, int]:
    """``(rank, world_size)``: the given values, else ``torch.distributed``'s when it is
    initialised, else ``(0, 1)``. Checks ``0 <= rank < world_size``."""
    initialised = torch.distributed.is_available() and torch.distributed.is_initialized()
    if world_size is None:
        world_size = torch.distributed.get_world_size() if initialised else 1
    if rank is None:
        rank = torch.distributed.get_rank() if initialised else 0
    world_size = check_int("world_size", world_size, 1)
    if isinstance(rank, bool) or not isinstance(rank, (int, np.integer)) or not 0 <= rank < world_size:
        raise DetloaderValueError(f"rank={rank!r} must be an int in [0, world_size={world_size})")
    return int(rank), world_size


def shard(global_items: np.ndarray, rank: int, world_size: int, drop_last: bool) -> np.ndarray:
    """Rank ``rank``'s positions ``rank::world_size`` of ``global_items`` (1-D, or 2-D rows),
    after wrapping around to a multiple of ``world_size`` (or cutting, with ``drop_last``)."""
    total = len(global_items)
    if world_size == 1:
        return global_items
    if drop_last:
        size = (total // world_size) * world_size
        return global_items[:size][rank::world_size]
    size = -(-total // world_size) * world_size
    if size > total:
        if total == 0:
            return global_items[:0]
        reps = -(-size // total)
        global_items = np.concatenate([global_items] * reps)[:size]
    return global_items[rank::world_size]


def interleave(parts: Sequence[np.ndarray]) -> np.ndarray:
    """The inverse of :func:`shard` without padding: ``parts[r]`` at positions ``r::len(parts)``."""
    out = np.empty(sum(len(p) for p in parts), dtype=parts[0].dtype)
    for r, p in enumerate(parts):
        out[r :: len(parts)] = p
    return out
