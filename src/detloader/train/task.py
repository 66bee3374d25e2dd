"""What the loop trains: a small protocol that any model meets, and the reference CenterNet
as one implementation of it.

A :class:`Task` is a model and two functions::

    model(images) -> outputs                        # images: float [B, 3, H, W], Batch.normalize()
    loss(outputs, batch) -> {name: scalar tensor}   # the terms; the loss is their weighted sum
    decode(outputs, batch) -> [per image, in batch order]   # predictions, annotation coordinates

``outputs`` is whatever the model returns (a tensor, a tuple, a dict); ``batch`` is the
:class:`detloader.Batch` on the device (``batch.targets(format=...)`` gives the objects in
the layout a model family takes). The loss the loop minimises is
``sum(weights.get(name, 1.0) * term)``, or ``terms["total"]`` when the loss returns one (the
other terms are then only reported). ``decode`` returns one entry per image:
:class:`~detloader.train.metrics.ImagePredictions` or a dict with ``boxes``, ``scores``,
``labels`` and optionally ``landmarks``, ``image_probs``
(:func:`~detloader.train.metrics.as_predictions`), mapped back with
``batch.boxes_to_original`` / ``landmarks_to_original``. Under DDP every parameter must get
a gradient from the loss (even 0), as ``DistributedDataParallel`` requires.
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
    """A model the loop can train, checkpoint, resume and evaluate (module docstring).

    Attributes:
        model: ``nn.Module``, ``model(images) -> outputs``.
        loss: ``(outputs, batch) -> Mapping[str, Tensor]`` of scalar terms.
        decode: ``(outputs, batch) -> Sequence`` of per-image predictions.
        weights: weight of each term (1 where not named).
        config: plain data saved as the checkpoint's ``model_config`` (what rebuilds the
            model; the reference model's :class:`~detloader.train.model.ModelConfig`).
    """

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
