"""Resuming with other settings than the checkpoint's (docs/training.md, "Resume with other settings").

A setting given on resume that differs from the one the checkpoint records is never taken silently:

* :data:`APPLIED` (``lr``, ``weight_decay``, ``warmup_steps``, ``epochs``) go into the optimiser and the
  schedule from the resume step on; the sample order stays exact. One line says what changed and the
  learning rate at this step before and after (a :class:`DetloaderRuntimeWarning`, and
  ``metrics.json["resume_changes"]``).
* :data:`CHANGES_RUN` (the batch size, input size, seed, sampling, augmentation, AMP, the loss) change
  what the model sees or the order it sees it in: the resume would not be exact. Refused with a
  :class:`ResumeSettingsError` naming each, unless ``allow_setting_change``; then applied and said as above.
* :data:`FIXED` (``width``): the checkpoint's weights have its shape; always refused.
* ``read_options`` are not compared here: what they read is. A resume that reads other data with them
  (``images_by``, ``class_map``...) is refused as other data (:func:`~detloader.train.runs.data_changes`,
  the message naming the read options that differ); one that reads the same (``on_error="raise"`` on a
  clean dataset) resumes exactly. ``detloader train --resume`` reads with the run's unless given.

What ``config.json`` and ``metrics.json`` record is then what the optimiser runs with.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from typing import Any

import torch

from detloader.errors import ResumeSettingsError
from detloader.train.config import TrainConfig

#: Applied on resume from the step on, said in one line: what each changes.
APPLIED: dict[str, str] = {
    "lr": "the optimiser's base rate", "weight_decay": "the optimiser's weight decay",
    "warmup_steps": "the schedule's warm-up", "epochs": "the run's length",
}
#: Refused unless ``allow_setting_change`` (the resume would not be exact): what each changes.
CHANGES_RUN: dict[str, str] = {
    "batch_size": "the steps per epoch and the sample order", "size": "the input size the model sees",
    "seed": "the sample order and the augmentations", "balance": "the sampling", "balance_by": "the sampling",
    "mosaic": "the augmentation", "close_mosaic": "the augmentation", "affine": "the augmentation",
    "hflip": "the augmentation", "flip_pairs": "the augmentation", "class_flip_pairs": "the augmentation",
    "amp": "the numerics", "landmark_loss": "the loss", "loss_weights": "the loss",
    "cache": "the pixels (a stored image is resized before the colour jitter)",
}
_WHAT = {**APPLIED, **CHANGES_RUN, "width": "the weights' shape"}
#: Never changed on resume: the weights have the checkpoint's shape.
FIXED: tuple[str, ...] = ("width",)
#: Settings of the reference model only: a run with its own Task does not use them.
REFERENCE_ONLY: tuple[str, ...] = ("width", "landmark_loss", "loss_weights")


def _plain(value: Any) -> Any:
    """JSON-comparable (tuples as lists)."""
    return json.loads(json.dumps(value, default=str))


def setting_changes(saved: Mapping[str, Any], config: TrainConfig, *, reference: bool) -> dict[str, tuple[Any, Any]]:
    """``{field: (checkpoint's value, this run's)}`` of the settings of :data:`APPLIED`,
    :data:`CHANGES_RUN` and :data:`FIXED` that differ (a field the checkpoint lacks is not compared;
    without ``reference`` the reference model's own settings neither)."""
    now = config.to_dict()
    changes = {}
    for name in (*APPLIED, *CHANGES_RUN, *FIXED):
        if name not in saved or (not reference and name in REFERENCE_ONLY):
            continue
        if _plain(saved[name]) != _plain(now[name]):
            changes[name] = (_plain(saved[name]), _plain(now[name]))
    return changes


def _listed(changes: Mapping[str, tuple[Any, Any]], names: Any) -> str:
    return ", ".join(f"{n} {changes[n][0]!r} -> {changes[n][1]!r} ({_WHAT[n]})" for n in names)


def check_resume_settings(resume: str, changes: Mapping[str, tuple[Any, Any]], allow: bool) -> None:
    """:class:`ResumeSettingsError` for a change of :data:`FIXED`, or of :data:`CHANGES_RUN`
    without ``allow``; the message lists each with what it changes and how to proceed."""
    fixed = [n for n in FIXED if n in changes]
    if fixed:
        options = " ".join(f"--{n.replace('_', '-')} {changes[n][0]}" for n in fixed)
        raise ResumeSettingsError(
            f"resume={resume!r}: {_listed(changes, fixed)} cannot change on resume: the checkpoint's weights "
            f"have its shape; resume with {options} (or leave it out) or start a new run (another --out, no --resume)"
        )
    run = [n for n in CHANGES_RUN if n in changes]
    if run and not allow:
        raise ResumeSettingsError(
            f"resume={resume!r}: settings differ from the checkpoint's: {_listed(changes, run)}; the resume "
            "would not be exact. Resume with the checkpoint's settings (leave them out or give its values), start "
            "a new run (another --out, no --resume), or pass --allow-setting-change "
            "(TrainConfig(allow_setting_change=True)) to continue with them knowingly"
        )


def apply_settings(
    optimizer: torch.optim.Optimizer, scheduler: Any, config: TrainConfig, factor: Callable[[int], float], step: int
) -> tuple[float, float]:
    """Put ``config``'s rate and decay into the loaded ``optimizer`` and ``scheduler``, with the
    schedule ``factor`` in effect from ``step`` on; (rate at ``step`` before, after)."""
    before = float(optimizer.param_groups[0]["lr"])
    scheduler.lr_lambdas = [factor] * len(optimizer.param_groups)
    scheduler.base_lrs = [config.lr] * len(optimizer.param_groups)
    for group in optimizer.param_groups:
        group["initial_lr"] = config.lr
        group["weight_decay"] = config.weight_decay
        group["lr"] = config.lr * factor(step)
    scheduler._last_lr = [group["lr"] for group in optimizer.param_groups]
    return before, float(optimizer.param_groups[0]["lr"])


def describe(changes: Mapping[str, tuple[Any, Any]], step: int, total_steps: int, rates: tuple[float, float]) -> str:
    """The one line a resume with other settings gives (warning and ``metrics.json``)."""
    return (
        f"resumed at step {step} with other settings than the checkpoint's, applied from this step on and recorded "
        f"in config.json: {_listed(changes, changes)}; the schedule spans {total_steps} steps, the learning rate "
        f"at this step {rates[0]:.4g} -> {rates[1]:.4g}"
    )
