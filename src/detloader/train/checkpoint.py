"""Checkpoints: one ``*.pt`` file with everything a run needs to continue or be evaluated.

Contents (plain Python data and tensors, so ``torch.load(weights_only=True)`` reads it):

``model``        the network's ``state_dict`` (unwrapped from DDP)
``model_config`` :class:`~detloader.train.model.ModelConfig` as a dict
``optimizer``, ``scheduler``   their ``state_dict``
``loader``       :meth:`detloader.ResumableLoader.state_dict`: epoch and the batches the loop
                 consumed (not what workers prefetched), with the sampler's state
``epoch``, ``step``   the epoch in progress and the optimiser steps done in all
``config``       :meth:`~detloader.train.config.TrainConfig.to_dict`
``classes``, ``image_classes``, ``landmark_schema``   the vocabularies the model was built for
``history``      per-epoch figures so far (losses, data-wait fraction, samples)
``scaler``       the AMP gradient scaler's state (float16 on CUDA only), else absent
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Mapping

import torch

__all__ = ["CHECKPOINT_KEYS", "load_checkpoint", "save_checkpoint"]

CHECKPOINT_KEYS: tuple[str, ...] = (
    "model",
    "model_config",
    "optimizer",
    "scheduler",
    "loader",
    "epoch",
    "step",
    "config",
    "classes",
    "image_classes",
    "landmark_schema",
    "history",
)


def save_checkpoint(path: str | os.PathLike[str], state: Mapping[str, Any]) -> Path:
    """Write ``state`` atomically (a temporary file, then a rename: a run killed while saving
    leaves the previous checkpoint intact). Missing keys of :data:`CHECKPOINT_KEYS` are an
    error."""
    missing = [k for k in CHECKPOINT_KEYS if k not in state]
    if missing:
        raise ValueError(f"save_checkpoint: state lacks {missing}")
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
    torch.save(dict(state), tmp)
    os.replace(tmp, target)
    return target


def load_checkpoint(path: str | os.PathLike[str], map_location: str | torch.device = "cpu") -> dict[str, Any]:
    """Read a checkpoint written by :func:`save_checkpoint` (tensors on ``map_location``)."""
    source = Path(path)
    if not source.is_file():
        raise FileNotFoundError(f"checkpoint={str(source)!r} does not exist")
    state = torch.load(source, map_location=map_location, weights_only=True)
    missing = [k for k in CHECKPOINT_KEYS if k not in state]
    if missing:
        raise ValueError(f"{source}: not a detloader training checkpoint (lacks {missing})")
    return state
