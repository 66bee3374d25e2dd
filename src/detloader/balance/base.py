"""What every sampler of this package shares: seed, epoch, rank/world_size, resume offset.

An epoch's draw comes from ``SeedSequence([seed, epoch, stream, ...])`` (:func:`epoch_generator`),
never a global RNG; rank ``r`` of ``W`` takes positions ``r::W`` of the one global draw
(:func:`shard`); ``offset`` in ``state_dict`` counts the items this rank yielded in the epoch.
The contract in full: docs/balancing.md, "Samplers" and "Resume".
"""

from __future__ import annotations

import warnings
from abc import abstractmethod
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import numpy as np
import torch
from torch.utils.data import Sampler

from detloader.annotations.problems import check_int
from detloader.errors import DetloaderValueError, DetloaderWarning

#: Draws per chunk: bounds temporary memory (and keeps it in cache), and fixes the random
#: streams: chunk k of an epoch always comes from the generator seeded (seed, epoch, stream, k).
CHUNK = 1 << 16
#: Indices are yielded to Python in slices of this many.
_YIELD_SLICE = 1 << 16

# Stream ids keep the draws of different sampler kinds apart for the same seed and epoch.
STREAM_WEIGHTED, STREAM_NO_REPLACEMENT, STREAM_REPEAT = 1, 2, 3
STREAM_CLASS_AWARE, STREAM_BATCH, STREAM_WRAPPER = 4, 5, 6


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


def pad(global_items: np.ndarray, world_size: int, drop_last: bool) -> np.ndarray:
    """``global_items`` (1-D, or 2-D rows) wrapped around to a multiple of ``world_size`` (or cut
    to one, with ``drop_last``)."""
    total = len(global_items)
    size = (total // world_size) * world_size if drop_last else -(-total // world_size) * world_size
    if size > total and total:
        global_items = np.concatenate([global_items] * -(-size // total))
    return global_items[:size]


def shard(global_items: np.ndarray, rank: int, world_size: int, drop_last: bool) -> np.ndarray:
    """Rank ``rank``'s positions ``rank::world_size`` of :func:`pad` of ``global_items``."""
    if world_size == 1:
        return global_items
    return pad(global_items, world_size, drop_last)[rank::world_size]


def interleave(parts: Sequence[np.ndarray]) -> np.ndarray:
    """The inverse of :func:`shard` without padding: ``parts[r]`` at positions ``r::len(parts)``."""
    out = np.empty(sum(len(p) for p in parts), dtype=parts[0].dtype)
    for r, p in enumerate(parts):
        out[r :: len(parts)] = p
    return out


def epoch_generator(seed: int, epoch: int, stream: int, *extra: int) -> np.random.Generator:
    """The generator of one (seed, epoch, stream[, chunk]) - independent streams by
    construction (numpy ``SeedSequence`` hashing), never the global RNG."""
    return np.random.Generator(np.random.PCG64(np.random.SeedSequence([seed, epoch, stream, *extra])))


def index_dtype(n: int) -> type[np.integer]:
    """The dtype of indices below ``n``: int32 while it fits, else int64."""
    return np.int32 if n <= np.iinfo(np.int32).max else np.int64


def epoch_items(sampler: Any, epoch: int) -> np.ndarray:
    """int ``[L]`` (or ``[L, G]`` groups): ``sampler``'s items of ``epoch`` from its beginning,
    for the wrappers of this package that read another sampler's order (``set_epoch`` when it
    has one, then :meth:`EpochSampler.indices` or a plain iteration)."""
    if hasattr(sampler, "set_epoch"):
        sampler.set_epoch(epoch)
    if hasattr(sampler, "indices"):
        return np.asarray(sampler.indices())
    return np.asarray(list(sampler), dtype=np.int64)


def sampler_config(sampler: Any) -> dict[str, Any]:
    """A wrapped sampler's state without its position (what fixes its draws), or its kind: part
    of a wrapper's ``state_dict``, so that a wrapper of another sampler refuses the state."""
    state = getattr(sampler, "state_dict", None)
    if not callable(state):
        return {"kind": type(sampler).__name__}
    return {k: v for k, v in state().items() if k not in ("epoch", "offset")}


class EpochSampler(Sampler[Any]):
    """Shared machinery: seed, epoch, rank/world_size, resume offset, the repeat warning."""

    def __init__(self, *, seed: int, rank: int | None, world_size: int | None, drop_last: bool) -> None:
        self.seed = check_int("seed", seed, 0)
        self.rank, self.world_size = distributed_defaults(rank, world_size)
        self.drop_last = bool(drop_last)
        self.epoch = 0
        self._offset = 0  # items of this epoch yielded (or restored)
        self._resume = False  # load_state_dict set an offset for the next iteration
        self._drawn_epoch: int | None = None  # last epoch iterated to its end
        self._warned = False
        self._cache: tuple[int, np.ndarray] | None = None

    # -- subclasses -------------------------------------------------------------------------
    @abstractmethod
    def _rank_items(self) -> np.ndarray:
        """This rank's items of the current epoch: int array ``[L]`` (or ``[L, B]`` batches)."""

    def _cached(self, compute: Callable[[], np.ndarray]) -> np.ndarray:
        if self._cache is None or self._cache[0] != self.epoch:
            self._cache = None  # free the old draw before computing the new one
            self._cache = (self.epoch, compute())
        return self._cache[1]

    def _cached_share(self, global_items: Callable[[], np.ndarray]) -> np.ndarray:
        """This rank's :func:`shard` of ``global_items()``, computed once per epoch."""
        return self._cached(lambda: shard(global_items(), self.rank, self.world_size, self.drop_last))

    # -- the Sampler protocol ---------------------------------------------------------------
    def set_epoch(self, epoch: int) -> None:
        """Select the draw of ``epoch``. A pending resume offset of that same epoch (from
        :meth:`load_state_dict`) is kept; any other epoch starts at its beginning."""
        epoch = check_int("epoch", epoch, 0)
        if self._resume and epoch == self.epoch:
            return
        if epoch != self.epoch:
            self._cache = None  # the old epoch's draw is not kept beside the new one
        self.epoch = epoch
        self._offset = 0
        self._resume = False

    def indices(self) -> np.ndarray:
        """This rank's items of the current epoch, from its beginning (a numpy array)."""
        return self._rank_items()

    def _item_slices(self, start: int) -> Iterator[np.ndarray]:
        """This rank's items of the epoch from position ``start`` on, as consecutive numpy slices
        (a sampler that can draw part of an epoch yields them as it draws: WeightedSampler)."""
        items = self._rank_items()
        for lo in range(start, len(items), _YIELD_SLICE):
            yield items[lo : lo + _YIELD_SLICE]

    def __iter__(self) -> Iterator[Any]:
        if self._resume:
            start = min(self._offset, len(self))
            self._resume = False
        else:
            if self._drawn_epoch == self.epoch and not self._warned:
                warnings.warn(f"{type(self).__name__}: epoch {self.epoch} is drawn again; call set_epoch(epoch) "
                              "before every epoch, or every epoch repeats the same draw", DetloaderWarning,
                              stacklevel=2)
                self._warned = True
            start = 0
        self._offset = start
        for part in self._item_slices(start):
            for item in part.tolist():
                self._offset += 1
                yield item
        self._drawn_epoch = self.epoch

    def __len__(self) -> int:
        return len(self._rank_items())

    # -- resume -----------------------------------------------------------------------------
    def _config(self) -> dict[str, Any]:
        return {"seed": self.seed, "rank": self.rank, "world_size": self.world_size}

    def state_dict(self) -> dict[str, Any]:
        """``{"epoch", "offset", "kind", "seed", "rank", "world_size", ...}``: plain data."""
        return {"kind": type(self).__name__, "epoch": self.epoch, "offset": self._offset, **self._config()}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore epoch and offset: the next iteration yields the rest of that epoch. Raises
        DetloaderValueError for a state of another kind, seed, rank or world size."""
        missing = {"epoch", "offset"} - set(state)
        if missing:
            raise DetloaderValueError(f"{type(self).__name__}.load_state_dict: state lacks {sorted(missing)}")
        kind = state.get("kind", type(self).__name__)
        if kind != type(self).__name__:
            raise DetloaderValueError(f"{type(self).__name__}.load_state_dict: state is from a {kind}")
        for key, value in self._config().items():
            if key in state and state[key] != value:
                raise DetloaderValueError(f"{type(self).__name__}.load_state_dict: state has {key}={state[key]!r}, "
                                          f"this sampler {key}={value!r}; its draw would differ")
        offset = int(state["offset"])
        if offset < 0:
            raise DetloaderValueError(f"{type(self).__name__}.load_state_dict: offset={offset} < 0")
        self.epoch = int(state["epoch"])
        self._offset = offset
        self._resume = True
        self._drawn_epoch = None
