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
``data``         what the run was trained on (:func:`detloader.train.run_data.data_record`)

Saving keeps the checkpoint it replaces as ``previous.pt`` (docs/training.md, "Damaged checkpoints"),
and refuses a state whose weights or optimiser moments hold a NaN or an infinity
(:class:`~detloader.errors.NonFiniteWeightsError`): the files already there stay as they were.

A resume's settings against the checkpoint's (:func:`setting_changes`): those of :data:`APPLIED`
take effect from the checkpoint's step on and are said in one line (:func:`apply_settings`,
:func:`describe`); those of :data:`CHANGES_RUN` are refused unless ``allow_setting_change``
(:class:`~detloader.errors.ResumeSettingsError`, :func:`check_resume_settings`).
"""

from __future__ import annotations

import json
import math
import os
import pickle
import zipfile
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import torch

from detloader.errors import (
    CheckpointError,
    DetloaderFileNotFoundError,
    DetloaderValueError,
    NonFiniteWeightsError,
    ResumeSettingsError,
)
from detloader.train.config import TrainConfig

#: The checkpoint a save replaces, kept beside it.
PREVIOUS = "previous.pt"
#: The keys every checkpoint has (``scaler``, ``task`` and ``data`` may be absent).
CHECKPOINT_KEYS: tuple[str, ...] = (
    "model", "model_config", "optimizer", "scheduler", "loader", "epoch", "step", "config", "classes",
    "image_classes", "landmark_schema", "history",
)


def _float_tensors(value: Any, name: str) -> Iterator[tuple[str, torch.Tensor]]:
    """``(dotted name, tensor)`` of every floating-point tensor in nested dicts / lists."""
    if isinstance(value, torch.Tensor):
        if value.is_floating_point() or value.is_complex():
            yield name, value
    elif isinstance(value, Mapping):
        for key, item in value.items():
            yield from _float_tensors(item, f"{name}.{key}")
    elif isinstance(value, (list, tuple)):
        for i, item in enumerate(value):
            yield from _float_tensors(item, f"{name}.{i}")


def non_finite_tensors(state: Mapping[str, Any], keys: tuple[str, ...] = ("model", "optimizer")) -> list[str]:
    """Names (``model.head.weight``, ``optimizer.state.3.exp_avg``) of the floating-point
    tensors under ``state[key]`` for ``key`` in ``keys`` that hold a NaN or an infinity, in
    the order found; ``[]`` when all are finite. One host synchronisation per device."""
    found = [(name, t) for key in keys if key in state for name, t in _float_tensors(state[key], key)]
    by_device: dict[torch.device, list[int]] = {}
    for i, (_, t) in enumerate(found):
        by_device.setdefault(t.device, []).append(i)
    bad: list[int] = []
    for rows in by_device.values():
        finite = torch.stack([torch.isfinite(found[i][1]).all() for i in rows]).cpu().tolist()
        bad.extend(i for i, ok in zip(rows, finite) if not ok)
    return [found[i][0] for i in sorted(bad)]


#: The most optimiser steps a checkpoint may record (30 years at a thousand steps a second).
MAX_STEP = 10**12
#: Non-finite tensors a :class:`NonFiniteWeightsError` names at most (the count of the rest follows).
SHOWN_TENSORS = 5


def check_finite_state(state: Mapping[str, Any], where: str = "") -> None:
    """:class:`NonFiniteWeightsError` when the model or optimiser state of ``state`` holds a NaN
    or an infinity: the message names the tensors, ``where`` (e.g. the step) and what to try."""
    bad = non_finite_tensors(state)
    if not bad:
        return
    shown = ", ".join(bad[:SHOWN_TENSORS])
    if len(bad) > SHOWN_TENSORS:
        shown += f" and {len(bad) - SHOWN_TENSORS} more ({len(bad)} in all)"
    at = f" {where}" if where else ""
    raise NonFiniteWeightsError(
        f"the checkpoint{at} would hold non-finite values (NaN or inf) in {len(bad)} tensors: {shown}; "
        "it was not written, the checkpoint already there is unchanged. Training diverged: try a lower "
        "--lr, more warm-up (--warmup-steps), AMP off (--no-amp), or check the data for boxes or landmarks "
        "far outside their images (detloader validate PATH)",
        bad,
    )


def save_checkpoint(path: str | os.PathLike[str], state: Mapping[str, Any]) -> Path:
    """Write ``state`` atomically and durably (a temporary file beside ``path``, flushed to the disk,
    then a rename: a run killed while saving leaves the previous checkpoint intact). Missing keys
    of :data:`CHECKPOINT_KEYS` are an error; so is a NaN or an infinity in the model or optimiser
    state (:class:`NonFiniteWeightsError`). A full disk, quota or file size limit is a
    :class:`~detloader.errors.DiskFullError` naming the file and the free space (``torch.save``'s
    wrapped ``RuntimeError`` unwrapped); a link or other non-regular file at ``path`` is refused
    (:class:`~detloader.errors.NotRegularFileError`). On any error nothing is written: ``path`` and
    ``previous.pt`` stay as they were and no temporary file is left."""
    missing = [k for k in CHECKPOINT_KEYS if k not in state]
    if missing:
        raise DetloaderValueError(f"save_checkpoint: state lacks {missing}")
    check_finite_state(state, f"{path} at step {state['step']}")
    from detloader._system.files import atomic_write, refuse_link  # removes its temporary file; a full disk is named

    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    refuse_link(target.with_name(PREVIOUS))
    with atomic_write(target, durable=True, no_follow=True) as fh:
        torch.save(dict(state), fh)
        fh.flush()  # a full disk shows here, before previous.pt moves
        os.fsync(fh.fileno())
        if target.is_file():  # keep it as previous.pt: a hard link, so last.pt never goes missing
            kept = target.with_name(f".{PREVIOUS}.{os.getpid()}.tmp")
            kept.unlink(missing_ok=True)
            os.link(target, kept)
            os.replace(kept, target.with_name(PREVIOUS))
    return target


def load_checkpoint(path: str | os.PathLike[str], map_location: str | torch.device = "cpu") -> dict[str, Any]:
    """Read a checkpoint written by :func:`save_checkpoint` (tensors on ``map_location``)."""
    source = Path(path)
    if source.is_dir():
        inside = source / "last.pt"
        hint = f": give its checkpoint, {inside}" if inside.is_file() else " (no last.pt in it)"
        raise CheckpointError(f"checkpoint={str(source)!r} is a folder, not a checkpoint file{hint}")
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
    changed = _failed_crc(source)
    if changed is not None:
        raise CheckpointError(
            f"{source}: damaged checkpoint: its record {changed} fails its CRC-32 check (bytes changed since "
            "it was saved), nothing was built from it"
        )
    problem = checkpoint_problem(state) or values_problem(state)
    if problem is not None:
        raise CheckpointError(
            f"{source}: {problem}: a damaged or hostile checkpoint, nothing was built from it; "
            "use a checkpoint written by detloader train"
        )
    return state


def _failed_crc(source: Path) -> str | None:
    """The first record of the zip file ``source`` whose bytes do not match the CRC-32 that
    ``torch.save`` wrote for it (``torch.load`` does not compare them), or None."""
    try:
        with zipfile.ZipFile(source) as archive:
            return archive.testzip()
    except (zipfile.BadZipFile, OSError, EOFError) as err:
        return f"(unreadable: {err})"


def _is_count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _non_finite_numbers(value: Any, name: str) -> Iterator[str]:
    """``name=value`` of each float (or list of them) in ``value`` that is a NaN or an infinity."""
    if isinstance(value, float):
        if not math.isfinite(value):
            yield f"{name}={value!r}"
    elif isinstance(value, (list, tuple)):
        for i, item in enumerate(value):
            yield from _non_finite_numbers(item, f"{name}[{i}]")


def values_problem(state: Mapping[str, Any]) -> str | None:
    """What makes the run state of ``state`` unfit to continue or evaluate from, checked on load as
    :func:`save_checkpoint` checks it on save, named ``field=value``: a NaN or an infinity in the
    model or optimiser tensors, in the optimiser's or schedule's rates (or a negative rate); an
    ``epoch`` other than the count of finished epochs its ``history`` records; a ``step`` outside
    ``[0, MAX_STEP]`` (a resumed epoch's history counts only its steps after the resume, so
    the history bounds no step count); a ``loader``
    state that is not ResumableLoader's (``epoch``, ``batches``, ``sampler`` with ``epoch`` and
    ``offset``, all counts). None when it is fit."""
    bad = non_finite_tensors(state)
    if bad:
        more = f" and {len(bad) - SHOWN_TENSORS} more" if len(bad) > SHOWN_TENSORS else ""
        return f"{len(bad)} tensors hold NaN or inf: {', '.join(bad[:SHOWN_TENSORS])}{more}"
    optimizer, scheduler = state["optimizer"], state["scheduler"]
    groups = optimizer.get("param_groups") if isinstance(optimizer, Mapping) else None
    if not isinstance(groups, list) or not all(isinstance(g, Mapping) for g in groups):
        return f"optimizer param_groups ({type(groups).__name__}) is not a list of mappings"
    if not isinstance(scheduler, Mapping):
        return f"scheduler is a {type(scheduler).__name__}, not a mapping"
    rates = [(f"optimizer param_groups[{i}].{k}", v) for i, g in enumerate(groups) for k, v in g.items()
             if k != "params"]
    rates += [(f"scheduler {k}", v) for k, v in scheduler.items() if k in ("base_lrs", "_last_lr")]
    for name, value in rates:
        for shown in _non_finite_numbers(value, name):
            return f"{shown} is not finite"
    for i, group in enumerate(groups):
        lr = group.get("lr")
        if isinstance(lr, bool) or not isinstance(lr, (int, float)) or lr < 0:
            return f"optimizer param_groups[{i}].lr={lr!r} is not a rate >= 0"
    history, loader = state["history"], state["loader"]
    if not isinstance(history, list) or not all(isinstance(h, Mapping) and _is_count(h.get("steps")) for h in history):
        return "history is not a list of epoch records with their steps"
    if not isinstance(loader, Mapping) or not isinstance(loader.get("sampler"), Mapping):
        shown = repr(loader)[:80]
        return f"loader={shown} is not a loader state (a mapping of epoch, batches and sampler)"
    sampler = loader["sampler"]
    counts = (("loader epoch", loader.get("epoch")), ("loader batches", loader.get("batches")),
              ("loader sampler epoch", sampler.get("epoch")), ("loader sampler offset", sampler.get("offset")))
    for name, value in counts:
        if not _is_count(value):
            return f"{name}={value!r} is not a count (an int >= 0)"
    epoch, step = state["epoch"], state["step"]
    if not _is_count(epoch):
        return f"epoch={epoch!r} is not a count (an int >= 0)"
    if epoch != len(history):
        return f"epoch={epoch!r} does not match the {len(history)} finished epochs its history records"
    if not _is_count(step) or step > MAX_STEP:
        return f"step={step!r} is outside [0, {MAX_STEP}] (an int; no real run makes more optimiser steps)"
    return None


def checkpoint_problem(state: Mapping[str, Any]) -> str | None:
    """What makes ``state`` unsafe to build a model from, checked before anything is built (a
    width of a million or a billion classes would exhaust the memory): the reference model's
    ``model_config`` outside :data:`~detloader.train.model.MODEL_BOUNDS` or at odds with the
    class lists, the config's ``width`` or ``size`` outside their bounds, its ``read_options`` (which
    evaluate and resume read with) not a mapping; None when it is fit."""
    from detloader.train.model import MAX_INPUT_SIZE, MODEL_BOUNDS, model_config_problem
    from detloader.train.task import REFERENCE

    config = state["config"]
    if not isinstance(config, Mapping):
        return f"config is a {type(config).__name__}, not a mapping"
    read_options = config.get("read_options", {})
    if not isinstance(read_options, Mapping) or not all(isinstance(k, str) for k in read_options):
        return f"config read_options ({type(read_options).__name__}) is not a mapping of read_annotations keywords"
    for name, (low, high) in (("width", (1, MODEL_BOUNDS["width"][1])), ("size", (1, MAX_INPUT_SIZE))):
        value = config.get(name, low)
        if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
            return f"config {name}={value!r} is outside [{low}, {high}] (an int; no real model needs more)"
    if state.get("task", REFERENCE) != REFERENCE:
        return None  # another model's config is its Task's business
    shape = state["model_config"]
    problem = model_config_problem(shape)
    if problem is not None:
        return problem
    schema = state["landmark_schema"]
    names = schema.get("names", []) if isinstance(schema, Mapping) else []
    for key, what, listed in (("num_classes", "classes", state["classes"]),
                              ("num_image_classes", "image_classes", state["image_classes"]),
                              ("num_landmarks", "landmark_schema names", names)):
        count = len(listed) if isinstance(listed, (list, tuple)) else -1
        if shape.get(key, 0) != count:
            return f"model_config {key}={shape.get(key, 0)!r} does not match its {count} {what}"
    return None


def load_weights(target: Any, weights: Any, source: str | os.PathLike[str], what: str = "model") -> None:
    """``target.load_state_dict(weights)`` (a model or an optimiser), a mismatch being a
    :class:`CheckpointError` naming ``source`` and the first difference, not a traceback."""
    try:
        target.load_state_dict(weights)
    except (RuntimeError, ValueError, KeyError, TypeError) as err:
        first = str(err).strip().splitlines()[0][:300] if str(err).strip() else type(err).__name__
        raise CheckpointError(
            f"{source}: its {what} state does not fit the {what} this run builds ({first}); the checkpoint "
            "is damaged or was written for other settings: resume with its own settings or start a new run"
        ) from None


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
