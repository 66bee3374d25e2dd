"""Lightning: a ``LightningDataModule`` that keeps detloader's balanced, distributed and
resumable loader under Lightning's ``Trainer`` (``pip install 'detloader[lightning]'``), and
an evaluation that scores the predictions of every rank at once.

The training loader reaches Lightning in a wrapper that is not a ``DataLoader``, so that under DDP
Lightning does not replace its sampler with a ``DistributedSampler``; :func:`evaluate_gathered` scores
the predictions of all ranks with each image once. docs/training.md, "Lightning".
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import torch

from detloader.errors import DetloaderValueError, MissingExtraError, TuneWarning

try:
    from lightning.pytorch import LightningDataModule
except ImportError:  # the standalone package
    try:
        from pytorch_lightning import LightningDataModule
    except ImportError:
        raise MissingExtraError("detloader.lightning needs Lightning: pip install 'detloader[lightning]'") from None

from detloader.balance.base import distributed_defaults
from detloader.loader import make_loader
from detloader.loader.collate import Batch
from detloader.train.metrics import Backend, ImagePredictions, as_predictions, score_predictions
from detloader.train.run_data import balanced_loader

__all__ = ["DetectionDataModule", "evaluate_gathered", "gather_predictions"]


def _all_gather(obj: Any) -> list[Any]:
    """Every rank's ``obj`` in rank order (``torch.distributed`` when initialised with more than
    one process; ``[obj]`` otherwise). Collective: every rank must call it."""
    _, world = distributed_defaults(None, None)
    if world == 1:
        return [obj]
    out: list[Any] = [None] * world
    torch.distributed.all_gather_object(out, obj)
    return out


def _rank_states(loader: Any) -> dict[str, Any]:
    """``{"world_size": W, "ranks": {r: ResumableLoader.state_dict() of rank r}}``, gathered from
    every rank (collective under DDP: Lightning builds a checkpoint on every rank, writes rank 0's)."""
    states = _all_gather(loader.state_dict())
    return {"world_size": len(states), "ranks": dict(enumerate(states))}


def _own_state(saved: Mapping[str, Any]) -> Mapping[str, Any]:
    """This rank's loader state out of what :func:`_rank_states` saved, or out of the older
    form (one ``ResumableLoader.state_dict()``, rank 0's). Raises DetloaderValueError when the
    checkpoint was written by another number of processes."""
    rank, world = distributed_defaults(None, None)
    if "ranks" not in saved:  # the older form: one process's position
        sampler = saved.get("sampler")
        written = sampler.get("world_size", 1) if isinstance(sampler, Mapping) else 1
        if written != 1:
            raise DetloaderValueError(
                f"the checkpoint holds rank 0's training-loader position only, of a run of {written} processes "
                "(written by an older detloader): resume from an end-of-epoch checkpoint"
            )
        if world != 1:
            raise DetloaderValueError(
                f"the checkpoint's training-loader position was written by 1 process, this run has {world}: "
                "resume with 1, or from an end-of-epoch checkpoint"
            )
        return saved
    written = int(saved["world_size"])
    if written != world:
        raise DetloaderValueError(
            f"the checkpoint's training-loader position was written by {written} processes, this run has {world}: "
            f"resume with {written} (the Trainer's devices x num_nodes), or from an end-of-epoch checkpoint"
        )
    ranks = saved["ranks"]
    return ranks[rank] if rank in ranks else ranks[str(rank)]


class _EpochLoader:
    """The training loader as Lightning sees it: sized, stateful (every rank's position), not a
    DataLoader."""

    def __init__(self, loader: Any, epoch: Callable[[], int]) -> None:
        self.loader, self.epoch = loader, epoch

    def __len__(self) -> int:
        return len(self.loader.loader)  # the whole epoch, also when resumed mid-epoch

    def __iter__(self) -> Iterator[Batch]:
        self.loader.set_epoch(self.epoch())  # at the first batch: the epoch is known by then
        yield from self.loader

    def state_dict(self) -> dict[str, Any]:
        """Every rank's position (collective under DDP: Lightning's loop asks on every rank)."""
        return _rank_states(self.loader)

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """This rank's position out of :meth:`state_dict` (or the older one-process form)."""
        self.loader.load_state_dict(_own_state(state))


class DetectionDataModule(LightningDataModule):
    """Training (and validation) loaders of :class:`detloader.DetectionDataset` s for a
    Lightning ``Trainer``; ``training_step`` gets a :class:`detloader.Batch` on the device.

    ``val`` None: no validation loader. ``balance``, ``balance_by`` and ``loader_kwargs`` as
    :func:`detloader.make_loader` takes them; ``"none"`` is a seeded shuffle, distributed and
    resumable like the balanced samplers.

    The training loader drops the last incomplete batch (every rank makes the same number of steps); rank ``r``
    takes positions ``r, r + W, ...`` of one balanced draw (docs/training.md, **Lightning**). The validation
    loader is a plain ``DataLoader`` in order (score it with :func:`evaluate_gathered`).
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
        self._saved: Mapping[str, Any] | None = None  # a checkpoint's "train" state, kept until the loader exists

    def train_dataloader(self) -> _EpochLoader:
        if self._loader is None:  # built once, after the Trainer started the process group
            with warnings.catch_warnings():  # num_workers="auto" warns of a changed load only, not of no tuning result
                warnings.simplefilter("ignore", TuneWarning)
                self._loader = balanced_loader(
                    self.train_set, balance=self.balance, balance_by=self.balance_by, seed=self.seed,
                    batch_size=self.batch_size, num_workers=self.num_workers, drop_last=True, **self.loader_kwargs,
                )
            if self._saved is not None:
                self._loader.load_state_dict(_own_state(self._saved))
        return _EpochLoader(self._loader, lambda: self.trainer.current_epoch if self.trainer is not None else 0)

    def val_dataloader(self) -> Any:
        return [] if self.val_set is None else make_loader(self.val_set, batch_size=self.batch_size)

    def transfer_batch_to_device(self, batch: Any, device: Any, dataloader_idx: int) -> Any:
        if isinstance(batch, Batch):
            return batch.to(device, non_blocking=True)
        return super().transfer_batch_to_device(batch, device, dataloader_idx)

    def state_dict(self) -> dict[str, Any]:
        """``{"train": {"world_size": W, "ranks": {r: ResumableLoader.state_dict()}}}`` once the
        loader exists (a restored one before). Under DDP every rank must call it (a gather), as
        Lightning's checkpoint saving does."""
        if self._loader is not None:
            return {"train": _rank_states(self._loader)}
        return {"train": dict(self._saved)} if self._saved is not None else {}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restores this rank's position from :meth:`state_dict` (or the older one-process form).
        Raises DetloaderValueError (here or at ``train_dataloader``) when it was written by another
        number of processes."""
        if "train" in state_dict:
            self._saved = state_dict["train"]
            if self._loader is not None:  # else when train_dataloader builds it, under the process group
                self._loader.load_state_dict(_own_state(self._saved))


def gather_predictions(predictions: Sequence[Any] | Mapping[int, Any]) -> list[ImagePredictions]:
    """The predictions of every rank, each image once, sorted by image id.

    ``predictions``: this rank's entries, as :func:`detloader.train.score_predictions` takes
    them (each with its ``image_id``, a row of the evaluated index, or a mapping ``{image_id:
    entry}``). Under DDP (``torch.distributed`` initialised) it is collective: every rank must
    call it, and every rank gets the same list. An image predicted on more than one rank (the
    padding of a ``DistributedSampler``) is kept once: its first entry in rank order."""
    entries = predictions.items() if isinstance(predictions, Mapping) else ((None, e) for e in predictions)
    mine = [as_predictions(entry, image_id) for image_id, entry in entries]  # numpy: cheap to send
    kept: dict[int, ImagePredictions] = {}
    for part in _all_gather(mine):
        for p in part:
            kept.setdefault(p.image_id, p)
    return [kept[i] for i in sorted(kept)]


def evaluate_gathered(
    predictions: Sequence[Any] | Mapping[int, Any],
    index: Any,
    *,
    score_threshold: float = 0.3,
    backend: Backend = "auto",
    coco_json: str | os.PathLike[str] | None = None,
) -> dict[str, Any]:
    """:func:`detloader.train.score_predictions` of :func:`gather_predictions`: the metrics of
    the predictions of all ranks, each image once, the same dict on every rank and the same as
    one process scoring all of them. Collective under DDP (call it on every rank, e.g. in
    ``on_validation_epoch_end``); ``coco_json`` is written by rank 0."""
    gathered = gather_predictions(predictions)
    rank, _ = distributed_defaults(None, None)
    return score_predictions(
        gathered, index, score_threshold=score_threshold, backend=backend, coco_json=coco_json if rank == 0 else None
    )
