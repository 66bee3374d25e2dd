"""Ultralytics YOLO: train with detloader's class-balanced sampling
(``pip install 'detloader[ultralytics]'``).

Ultralytics has no sampler hook (its trainer builds its own ``InfiniteDataLoader``), so
:class:`BalancedTrainer` overrides ``get_dataloader`` for the training loader only::

    YOLO("yolo11n.pt").train(data="data.yaml", trainer=BalancedTrainer)                      # sqrt
    YOLO("yolo11n.pt").train(data="data.yaml", trainer=balanced_trainer(balance="inverse"))

The strategy lives on the class (``train(...)`` refuses unknown keys). docs/ultralytics.md.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

from detloader.errors import DetloaderValueError, MissingExtraError

try:
    from ultralytics.data.build import InfiniteDataLoader, build_dataloader
    from ultralytics.models.yolo.detect import DetectionTrainer
    from ultralytics.utils.torch_utils import torch_distributed_zero_first
except ImportError:
    raise MissingExtraError("detloader.ultralytics needs Ultralytics: pip install 'detloader[ultralytics]'") from None

from detloader.balance.label_lists import (
    AutoEpochSampler,
    check_balance,
    check_label_key,
    check_rect_batches,
    labels_sampler,
)

__all__ = ["BalancedTrainer", "balanced_trainer", "dataset_classes", "dataset_labels", "dataset_sampler"]


def dataset_labels(dataset: Any) -> list[Any]:
    """Per image of an Ultralytics dataset, in its own order, the class ids of its objects (its
    ``labels[i]["cls"]``: after ``classes=``, ``single_cls`` and ``fraction`` were applied)."""
    return [label["cls"] for label in dataset.labels]


def dataset_classes(dataset: Any) -> list[str]:
    """The class names of an Ultralytics dataset by id (``data["names"]``, a dict or a list)."""
    names = (getattr(dataset, "data", None) or {}).get("names", {})
    if isinstance(names, Mapping):
        return [str(names[k]) for k in sorted(names)]
    return [str(n) for n in names]


def dataset_sampler(
    dataset: Any, balance: str | Mapping[Any, float] = "sqrt", *, by: str = "class", seed: int = 0
) -> AutoEpochSampler:
    """The balanced sampler of an Ultralytics dataset: weights from its labels
    (:func:`dataset_labels`), a new draw each time it is iterated, and under DDP the global rank
    of ``torch.distributed`` taking positions ``rank::world_size`` of each epoch's one draw."""
    return labels_sampler(dataset_labels(dataset), dataset_classes(dataset), balance, by=by, seed=seed)


def _follow_epoch(trainer: BalancedTrainer) -> None:
    """``on_train_epoch_start``: the trainer's epoch to the sampler (a resumed run starts at its
    epoch; an epoch the workers began early is not drawn again, see AutoEpochSampler)."""
    sampler = getattr(getattr(trainer, "train_loader", None), "sampler", None)
    if isinstance(sampler, AutoEpochSampler):
        sampler.set_epoch(int(trainer.epoch))


class BalancedTrainer(DetectionTrainer):
    """Ultralytics' ``DetectionTrainer`` whose training loader draws images by class balance.

    The class attributes hold the strategy (:func:`balanced_trainer` makes subclasses):
    ``balance`` any ``make_loader(balance=)`` strategy or ``{class name or id: weight}``;
    ``balance_by`` ``"class"``; ``balance_seed`` None: the run's ``seed``. The validation
    loader is Ultralytics' own.
    """

    balance: ClassVar[str | Mapping[Any, float]] = "sqrt"
    balance_by: ClassVar[str] = "class"
    balance_seed: ClassVar[int | None] = None

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if _follow_epoch not in self.callbacks.get("on_train_epoch_start", []):
            self.add_callback("on_train_epoch_start", _follow_epoch)

    def get_dataloader(self, dataset_path: str, batch_size: int = 16, rank: int = 0, mode: str = "train") -> Any:
        """Ultralytics' loader, but for ``mode="train"`` with the balanced sampler. Worker count,
        worker seeding, generator, collate, pinning and ``drop_last`` are those Ultralytics'
        ``build_dataloader`` chooses for this dataset. Safe to call again (out-of-memory
        retries): each call builds a new dataset, sampler and loader. Raises RectBatchError
        for ``rect=True`` with several batch shapes."""
        if mode != "train":
            return super().get_dataloader(dataset_path, batch_size, rank, mode)
        with torch_distributed_zero_first(rank):  # the label cache is written once under DDP
            dataset = self.build_dataset(dataset_path, mode, batch_size)
        check_rect_batches(bool(getattr(dataset, "rect", False)), getattr(dataset, "batch_shapes", None))
        seed = int(self.args.seed if self.balance_seed is None else self.balance_seed)
        sampler = dataset_sampler(dataset, self.balance, by=self.balance_by, seed=seed)
        # Ultralytics' own choices for a shuffled training loader of this dataset; it starts no
        # worker (they start on the first iteration) and only its settings are kept.
        ref = build_dataloader(dataset, batch=batch_size, workers=self.args.workers, shuffle=True, rank=rank,
                               drop_last=bool(self.args.compile), device=self.device)
        extra = {"pin_memory_device": ref.pin_memory_device} if ref.pin_memory_device else {}
        return InfiniteDataLoader(
            dataset=dataset,
            batch_size=ref.batch_size,
            sampler=sampler,
            num_workers=ref.num_workers,
            prefetch_factor=ref.prefetch_factor if ref.num_workers > 0 else None,
            pin_memory=ref.pin_memory,
            collate_fn=ref.collate_fn,
            worker_init_fn=ref.worker_init_fn,
            generator=ref.generator,
            drop_last=ref.drop_last,
            **extra,
        )


def balanced_trainer(
    balance: str | Mapping[Any, float] = "sqrt", *, by: str = "class", seed: int | None = None
) -> type[BalancedTrainer]:
    """A :class:`BalancedTrainer` subclass with this strategy, for ``train(trainer=...)``.
    ``balance`` as ``make_loader(balance=)`` takes it (checked here, before any data is read);
    ``seed`` None: the run's ``seed`` argument."""
    balance = check_balance(balance)
    by = check_label_key(by)
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int) or seed < 0):
        raise DetloaderValueError(f"seed={seed!r} must be an int >= 0, or None for the run's seed")
    attrs = {"balance": balance, "balance_by": by, "balance_seed": seed, "__module__": __name__,
             "__doc__": f"BalancedTrainer with balance={balance!r}, by={by!r}, seed={seed!r}."}
    return type("BalancedTrainer", (BalancedTrainer,), attrs)
