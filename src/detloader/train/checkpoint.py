"""Checkpoints: one ``*.pt`` file with everything a run needs to continue or be evaluated,
plain Python data and tensors, so ``torch.load(weights_only=True)`` reads it:

``model``, ``optimizer``, ``scheduler``   their ``state_dict`` (the model unwrapped from DDP)
``model_config``, ``task``   the Task's ``config`` and the model's class (``module.QualName``)
``loader``       :meth:`detloader.ResumableLoader.state_dict`: epoch and the batches the loop
                 consumed (not what workers prefetched), with the sampler's state
``epoch``, ``step``   the epoch in progress and the optimiser steps done in all
``config``       :meth:`~detloader.train.config.TrainConfig.to_dict`
``classes``, ``image_classes``, ``landmark_schema``   the vocabularies the model was built for
``history``      per-epoch figures so far (losses, data-wait fraction, samples)
``scaler``       the AMP gradient scaler's state (float16 on CUDA only), else absent
``data``         what the run was trained on (:func:`detloader.train.runs.data_record`)

Saving keeps the checkpoint it replaces as ``previous.pt`` (docs/training.md, "Damaged checkpoints").
"""

from __future__ import annotations

import os
import pickle
import zipfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from detloader.errors import CheckpointError, DetloaderFileNotFoundError, DetloaderValueError

#: The checkpoint a save replaces, kept beside it.
PREVIOUS = "previous.pt"
#: The keys every checkpoint has (``scaler``, ``task`` and ``data`` may be absent).
CHECKPOINT_KEYS: tuple[str, ...] = (
    "model", "model_config", "optimizer", "scheduler", "loader", "epoch", "step", "config", "classes",
    "image_classes", "landmark_schema", "history",
)


def save_checkpoint(path: str | os.PathLike[str], state: Mapping[str, Any]) -> Path:
    """Write ``state`` atomically (a temporary file, then a rename: a run killed while saving
    leaves the previous checkpoint intact). Missing keys of :data:`CHECKPOINT_KEYS` are an
    error."""
    missing = [k for k in CHECKPOINT_KEYS if k not in state]
    if missing:
        raise DetloaderValueError(f"save_checkpoint: state lacks {missing}")
    from detloader._files import atomic_write  # removes its temporary file; a full disk is named

    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    with atomic_write(target) as fh:
        torch.save(dict(state), fh)
        fh.flush()  # a full disk shows here, before previous.pt moves
        if target.is_file():  # keep it as previous.pt: a hard link, so last.pt never goes missing
            kept = target.with_name(f".{PREVIOUS}.{os.getpid()}.tmp")
            kept.unlink(missing_ok=True)
            os.link(target, kept)
            os.replace(kept, target.with_name(PREVIOUS))
    return target


def load_checkpoint(path: str | os.PathLike[str], map_location: str | torch.device = "cpu") -> dict[str, Any]:
    """Read a checkpoint written by :func:`save_checkpoint` (tensors on ``map_location``)."""
    source = Path(path)
    if not source.is_file():
        raise DetloaderFileNotFoundError(f"checkpoint={str(source)!r} does not exist")
    try:
        return _read(source, map_location)
    except CheckpointError as err:
        previous = source.with_name(PREVIOUS)
        if source.name == PREVIOUS or not _loads(previous):
            raise
        raise CheckpointError(f"{err}; the previous checkpoint {previous} is intact: resume from it") from None


def _loads(path: Path) -> bool:
    try:
        _read(path, "cpu")
        return True
    except (CheckpointError, OSError):
        return False


def _read(source: Path, map_location: str | torch.device) -> dict[str, Any]:
    size = source.stat().st_size
    try:
        state = torch.load(source, map_location=map_location, weights_only=True)
    except (RuntimeError, EOFError, pickle.UnpicklingError, zipfile.BadZipFile, OSError) as err:
        what = "an empty file" if size == 0 else f"{size} bytes, not a complete checkpoint"
        detail = str(err).split(". ")[0].strip() or type(err).__name__
        raise CheckpointError(f"{source}: damaged or truncated checkpoint ({what}: {detail})") from None
    missing = [k for k in CHECKPOINT_KEYS if k not in state] if isinstance(state, dict) else list(CHECKPOINT_KEYS)
    if missing:
        raise CheckpointError(f"{source}: not a detloader training checkpoint (lacks {missing})")
    return state
