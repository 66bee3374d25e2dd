"""The loop's protocol: what it trains (a :class:`Task`: a model, its loss and its decode,
which any model meets; the reference CenterNet is one) and what it reports to the callbacks
of :func:`~detloader.train.loop.train` (:class:`StartInfo`, :class:`StepInfo`,
:class:`EpochInfo`). docs/training.md, "Your own model in the loop", says it in full::

    model(images) -> outputs                        # images: float [B, 3, H, W], Batch.normalize()
    loss(outputs, batch) -> {name: scalar tensor}   # the terms; the loss is their weighted sum
    decode(outputs, batch) -> [per image, in batch order]   # ImagePredictions or dicts, annotation coordinates
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from detloader.errors import DetloaderTypeError
from detloader.train.losses import LandmarkLoss, LossWeights, encode_targets, multitask_loss
from detloader.train.model import STRIDE, CenterNet, decode_predictions

#: :attr:`Task.name` of the reference model (checkpoints without a ``task`` key hold it).
REFERENCE = "detloader.train.model.CenterNet"


@dataclass(frozen=True)
class Task:
    """A model the loop can train, checkpoint, resume and evaluate (module docstring):
    ``weights`` of the loss terms (1 where not named); ``config``, plain data saved as the
    checkpoint's ``model_config`` (the reference model's :class:`~detloader.train.model.ModelConfig`)."""

    model: torch.nn.Module
    loss: Callable[[Any, Any], Mapping[str, torch.Tensor]]
    decode: Callable[[Any, Any], Sequence[Any]]
    weights: Mapping[str, float] = field(default_factory=dict)
    config: Mapping[str, Any] = field(default_factory=dict)

    @property
    def name(self) -> str:
        """The model's class (``module.QualName``), recorded in checkpoints as ``task``."""
        cls = type(self.model)
        return f"{cls.__module__}.{cls.__qualname__}"

    def total(self, terms: Mapping[str, torch.Tensor]) -> torch.Tensor:
        """The loss to minimise from the terms ``loss`` returned."""
        if not isinstance(terms, Mapping) or not terms:
            raise DetloaderTypeError(
                f"loss returned {type(terms).__name__}: it must return a dict of named scalar tensors"
            )
        if "total" in terms:
            return terms["total"]
        return sum(self.weights.get(name, 1.0) * value for name, value in terms.items())  # type: ignore[return-value]


def as_task(task: Task | Callable[[Any], Task], index: Any) -> Task:
    """``task``, or the Task a function of ``index`` returns."""
    task = task if isinstance(task, Task) else task(index)
    if not isinstance(task, Task):
        raise DetloaderTypeError(f"task={task!r}: a detloader.train.Task (or a function of the index returning one)")
    return task


def centernet_task(model: CenterNet, weights: LossWeights | None = None, landmark_loss: LandmarkLoss = "l1") -> Task:
    """The reference model as a :class:`Task`: :func:`~detloader.train.losses.encode_targets`
    + :func:`~detloader.train.losses.multitask_loss` (unweighted terms, ``weights``, default
    :class:`LossWeights()`) and :func:`~detloader.train.model.decode_predictions`."""
    weights = LossWeights() if weights is None else weights

    def loss(outputs: Mapping[str, torch.Tensor], batch: Any) -> dict[str, torch.Tensor]:
        heat = outputs["heatmap"]
        targets = encode_targets(
            boxes=batch.boxes, batch_index=batch.batch_index, labels=batch.labels, landmarks=batch.landmarks,
            visibility=batch.visibility, image_labels=batch.image_labels, num_classes=int(heat.shape[1]),
            grid=(int(heat.shape[-2]), int(heat.shape[-1])), stride=STRIDE,
        )
        return multitask_loss(outputs, targets, weights, landmark_loss)

    return Task(model, loss, decode_predictions, weights.to_dict(), model.config.to_dict())


@dataclass(frozen=True)
class StartInfo:
    """What ``on_start`` gets once the data is read and a resume restored: the splits the
    run trains and validates on (``{"name", "images", "source"}``: how each was found or
    made), the step it starts at and the steps of the whole run; ``loader``: the loader settings
    and why, in one line (``"loader: num_workers=2, pin_memory=False: ..."``)."""

    train: dict[str, Any]
    val: dict[str, Any]
    start_step: int
    total_steps: int
    rank: int
    loader: str = ""


@dataclass(frozen=True)
class StepInfo:
    """What ``on_step`` gets after each optimiser step.

    ``losses``: unweighted loss terms and ``total`` (weighted); ``image_ids``: index rows
    of the batch's images (this rank); ``wait_s`` / ``compute_s``: this step's split."""

    epoch: int
    step_in_epoch: int
    steps_in_epoch: int
    global_step: int
    losses: dict[str, float]
    lr: float
    image_ids: list[int]
    wait_s: float
    compute_s: float
    rank: int


@dataclass(frozen=True)
class EpochInfo:
    """What ``on_epoch`` gets after each epoch (this rank's figures)."""

    epoch: int
    epochs: int
    steps: int
    samples: int
    losses: dict[str, float]
    data_wait_fraction: float
    wait_s: float
    compute_s: float
    rank: int
