"""Resume a DataLoader mid-epoch: exactly the batches not yet consumed, none lost, none repeated.

Workers prefetch, so a sampler's count of what it yielded runs ahead of what the loop received:
:class:`ResumableLoader` counts the batches the loop received and saves the sampler's state with
that count. It takes any ``DataLoader`` over a map-style dataset whose sampler (or batch
sampler) follows the resume protocol of :mod:`detloader.balance.base` (``state_dict()`` with
integer ``"epoch"`` and ``"offset"``, ``load_state_dict``, ``set_epoch``), as every detloader
sampler does; docs/balancing.md, "Resume"::

    loader = ResumableLoader(DataLoader(dataset, batch_size=32, sampler=sampler, num_workers=4))
    loader.load_state_dict(checkpoint["loader"])  # when resuming
    for epoch in range(loader.epoch, epochs):
        loader.set_epoch(epoch)
        for batch in loader:
            ...  # train; checkpoint["loader"] = loader.state_dict() counts this batch as consumed
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

from torch.utils.data import BatchSampler, DataLoader, IterableDataset

from detloader.errors import DetloaderValueError
from detloader.loader import set_epoch


class ResumableLoader:
    """Wraps a DataLoader; counts consumed batches; saves and restores the epoch position.

    A batch counts as consumed once the loop has received it. Batches come in sampler order
    (``in_order=True``, the DataLoader default), so ``k`` consumed batches are the first ``k``.

    Raises:
        ValueError: the loader iterates an IterableDataset, delivers batches out of order,
            or its sampler / batch sampler lacks the resume protocol.
    """

    def __init__(self, loader: DataLoader) -> None:
        if not isinstance(loader, DataLoader):
            raise DetloaderValueError(f"loader={type(loader).__name__} is not a torch DataLoader")
        if isinstance(loader.dataset, IterableDataset):
            raise DetloaderValueError("loader iterates an IterableDataset: no sampler to resume")
        if getattr(loader, "in_order", True) is False:
            raise DetloaderValueError("loader has in_order=False: consumed batches are not a prefix")
        # what is resumed: the sampler inside torch's BatchSampler; else a custom batch sampler
        # (its items are batches), or with batch_size=None the sampler (one sample per "batch")
        batch_sampler = loader.batch_sampler
        if isinstance(batch_sampler, BatchSampler):
            self._source: Any = batch_sampler.sampler
            self._per_batch, self._drop_last = int(batch_sampler.batch_size), bool(batch_sampler.drop_last)
        else:
            self._source = batch_sampler if batch_sampler is not None else loader.sampler
            self._per_batch, self._drop_last = 1, False
        for name in ("state_dict", "load_state_dict", "set_epoch", "__len__"):
            if not hasattr(self._source, name):
                raise DetloaderValueError(
                    f"{type(self._source).__name__} has no {name}(): use a detloader sampler "
                    "(or one with epoch/offset state_dict) to resume a loader"
                )
        state = self._source.state_dict()
        if not isinstance(state, Mapping) or not {"epoch", "offset"} <= set(state):
            raise DetloaderValueError(
                f"{type(self._source).__name__}.state_dict() has no 'epoch' and 'offset': "
                "it does not follow the resume protocol"
            )
        self.loader = loader
        self._start = 0  # items of the epoch skipped by a restore
        self._consumed = 0  # batches received by the loop since the (re)start of the epoch
        self._pending = False  # a restored position waits for the next pass
        self._epoch = int(state["epoch"])

    # -- iteration --------------------------------------------------------------------------
    @property
    def epoch(self) -> int:
        return self._epoch

    @property
    def sampler(self) -> Any:
        """The sampler (or batch sampler) whose position is saved."""
        return self._source

    def set_epoch(self, epoch: int) -> None:
        """Forwarded to the sampler and the dataset (augmentation seeds), as
        :func:`detloader.set_epoch` does; a restored position of the same epoch is kept."""
        set_epoch(self.loader, epoch)  # the sampler (self._source is one of its parts) and the dataset
        if int(epoch) != self._epoch:
            self._start, self._consumed, self._pending = 0, 0, False
        self._epoch = int(epoch)

    def _units_done(self) -> int:
        """Items (or batches, for a batch sampler) of the epoch consumed, restored ones too."""
        return min(self._start + self._consumed * self._per_batch, len(self._source))

    def __iter__(self) -> Iterator[Any]:
        # A pass starts where a restore left the sampler, else (like the sampler) at 0.
        if not self._pending:
            self._start = 0
        self._pending = False
        self._consumed = 0
        for batch in self.loader:
            self._consumed += 1
            yield batch

    def __len__(self) -> int:
        """Batches left in the current epoch."""
        left = len(self._source) - self._units_done()  # >= 0
        return left // self._per_batch if self._drop_last else -(-left // self._per_batch)

    @property
    def batches_consumed(self) -> int:
        """Batches of the current epoch consumed, counting those before a restore."""
        return -(-self._units_done() // self._per_batch)

    # -- state ------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """``{"epoch", "batches", "sampler"}``: the sampler's state with its offset set to
        what the loop consumed (not what the workers prefetched)."""
        sampler_state = dict(self._source.state_dict())
        sampler_state["epoch"] = self._epoch
        sampler_state["offset"] = self._units_done()
        return {"epoch": self._epoch, "batches": self.batches_consumed, "sampler": sampler_state}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore: the next pass over ``state["epoch"]`` yields only its unconsumed rest."""
        if "sampler" not in state or "epoch" not in state:
            raise DetloaderValueError("ResumableLoader.load_state_dict: state lacks 'epoch' or 'sampler'")
        self._source.load_state_dict(state["sampler"])
        self._epoch = int(state["epoch"])
        self._start = int(state["sampler"]["offset"])
        self._consumed = 0
        self._pending = True
