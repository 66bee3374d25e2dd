"""Lightning: a ``LightningDataModule`` that keeps detloader's balanced, distributed and
resumable loader under Lightning's ``Trainer`` (``pip install 'detloader[lightning]'``).

Under DDP Lightning gives every ``DataLoader`` it is handed its own ``DistributedSampler``
(unless ``Trainer(use_distributed_sampler=False)``), which would lose the balancing without a
word: :class:`DetectionDataModule` hands it the training loader in a wrapper that is not a
``DataLoader``, which Lightning leaves as it is. docs/training.md, "Lightning".
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from detloader.errors import MissingExtraError

try:
    from lightning.pytorch import LightningDataModule
except ImportError:  # the standalone package
    try:
        from pytorch_lightning import LightningDataModule
    except ImportError:
        raise MissingExtraError("detloader.lightning needs Lightning: pip install 'detloader[lightning]'") from None

from detloader.collate import Batch
from detloader.loader import make_loader
from detloader.train.runs import balanced_loader

__all__ = ["DetectionDataModule"]


class _EpochLoader:
    """The training loader as Lightning sees it: sized, stateful, not a DataLoader."""

    def __init__(self, loader: Any, epoch: Callable[[], int]) -> None:
        self.loader, self.epoch = loader, epoch

    def __len__(self) -> int:
        return len(self.loader.loader)  # the whole epoch, also when resumed mid-epoch

    def __iter__(self) -> Iterator[Batch]:
        self.loader.set_epoch(self.epoch())  # at the first batch: the epoch is known by then
        yield from self.loader

    def state_dict(self) -> dict[str, Any]:
        return self.loader.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.loader.load_state_dict(state)


class DetectionDataModule(LightningDataModule):
    """Training (and validation) loaders of :class:`detloader.DetectionDataset` s for a
    Lightning ``Trainer``; ``training_step`` gets a :class:`detloader.Batch` on the device.

    ``val`` None: no validation loader. ``balance``, ``balance_by`` and ``loader_kwargs`` as
    :func:`detloader.make_loader` takes them; ``"none"`` is a seeded shuffle, distributed and
    resumable like the balanced samplers.

    The training loader drops the last incomplete batch (every rank makes the same number of steps); rank ``r``
    takes positions ``r, r + W, ...`` of one balanced draw; new draws each epoch and the position in this
    module's ``state_dict``: docs/training.md, "Your own model in the loop" (**Lightning**). The validation
    loader is a plain ``DataLoader`` in order (main process), which Lightning shares out as any validation loader.
    """

    def __init__(
        self,
        train: Any,
        val: Any = None,
        *,
        batch_size: int = 16,
        balance: str = "sqrt",
        balance_by: Any = "class",
        seed: int = 0,
        num_workers: int | str = "auto",
        **loader_kwargs: Any,
    ) -> None:
        super().__init__()
        self.train_set, self.val_set, self.batch_size, self.num_workers = train, val, batch_size, num_workers
        self.balance, self.balance_by, self.seed, self.loader_kwargs = balance, balance_by, seed, loader_kwargs
        self._loader: Any = None
        self._state: dict[str, Any] | None = None

    def train_dataloader(self) -> _EpochLoader:
        if self._loader is None:  # built once, after the Trainer started the process group
            self._loader = balanced_loader(
                self.train_set, balance=self.balance, balance_by=self.balance_by, seed=self.seed,
                batch_size=self.batch_size, num_workers=self.num_workers, drop_last=True, **self.loader_kwargs,
            )
            if self._state is not None:
                self._loader.load_state_dict(self._state)
        return _EpochLoader(self._loader, lambda: self.trainer.current_epoch if self.trainer is not None else 0)

    def val_dataloader(self) -> Any:
        return [] if self.val_set is None else make_loader(self.val_set, batch_size=self.batch_size)

    def transfer_batch_to_device(self, batch: Any, device: Any, dataloader_idx: int) -> Any:
        if isinstance(batch, Batch):
            return batch.to(device, non_blocking=True)
        return super().transfer_batch_to_device(batch, device, dataloader_idx)

    def state_dict(self) -> dict[str, Any]:
        """``{"train": ResumableLoader.state_dict()}`` once the loader exists."""
        return {"train": self._loader.state_dict()} if self._loader is not None else {}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        if "train" in state_dict:
            self._state = state_dict["train"]
            if self._loader is not None:
                self._loader.load_state_dict(self._state)
