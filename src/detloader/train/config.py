"""The training configuration: one frozen dataclass, checked on construction, saved as JSON.

The defaults are the demo's budget: on the embedded synthetic dataset (``data=None``) a run
finishes in about three minutes on two CPU cores and reaches box mAP@0.5 above 0.5 on the
validation split (figures in ``docs/training.md``).
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from detloader.balance.weights import NO_BALANCE, check_strategy
from detloader.errors import DetloaderValueError
from detloader.train.losses import LANDMARK_LOSSES, LossWeights
from detloader.train.model import INPUT_MULTIPLE, MAX_INPUT_SIZE, MODEL_BOUNDS

DEVICES: tuple[str, ...] = ("auto", "cpu", "cuda")


@dataclass(frozen=True)
class TrainConfig:
    """Everything a run depends on. What each field means: docs/training.md, "Settings: ``TrainConfig``" (a
    field added here goes into that table too). ``width``, ``landmark_loss`` and ``loss_weights`` are the
    reference model's: a run with ``train(config, task=...)`` does not use them.
    """

    data: str | None = None
    out: str = "runs/train"
    read_options: Mapping[str, Any] = field(default_factory=dict)
    on_decode_error: str = "raise"
    train_split: str = "train"
    val_split: str = "val"
    synthetic_images: int = 400
    synthetic_seed: int = 0
    size: int = 128
    batch_size: int = 16
    epochs: int = 20
    lr: float = 3e-3
    weight_decay: float = 1e-4
    warmup_steps: int = 50
    balance: str = NO_BALANCE
    balance_by: Any = "class"
    num_workers: int | str = "auto"
    cache: str | None = None
    device: str = "auto"
    amp: bool = True
    seed: int = 0
    width: int = 16
    landmark_loss: str = "l1"
    mosaic: float = 0.0
    close_mosaic: int = 2
    affine: bool = False
    hflip: float = 0.5
    flip_pairs: tuple[tuple[str, str], ...] | None = None
    class_flip_pairs: tuple[tuple[str, str], ...] | None = None
    loss_weights: LossWeights = field(default_factory=LossWeights)
    checkpoint_every: int = 0
    max_steps: int | None = None
    resume: str | None = None
    allow_data_change: bool = False
    allow_setting_change: bool = False
    exist_ok: bool = False
    score_threshold: float = 0.3
    eval_backend: str = "auto"
    evaluate: bool = True

    def __post_init__(self) -> None:
        from detloader.dataset import DECODE_ERROR_CHOICES
        from detloader.loader.make import check_num_workers
        from detloader.train.coco_eval import BACKENDS

        def is_int(value: Any, low: int) -> bool:
            return isinstance(value, int) and not isinstance(value, bool) and value >= low

        for name, low in (("batch_size", 1), ("epochs", 1), ("synthetic_images", 1), ("width", 1),
                          ("warmup_steps", 0), ("checkpoint_every", 0), ("close_mosaic", 0)):
            if not is_int(getattr(self, name), low):
                raise DetloaderValueError(f"{name}={getattr(self, name)!r} must be an int >= {low}")
        for name in ("mosaic", "hflip"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value <= 1:
                raise DetloaderValueError(f"{name}={value!r} must be a probability in [0, 1]")
        for name in ("flip_pairs", "class_flip_pairs"):
            value = getattr(self, name)
            if value is None:
                continue
            if isinstance(value, (str, bytes)) or not all(
                isinstance(p, (list, tuple)) and len(p) == 2 and all(isinstance(n, str) for n in p) for p in value
            ):
                raise DetloaderValueError(f"{name}={value!r} must be None or a list of (name, name) pairs")
            object.__setattr__(self, name, tuple((str(a), str(b)) for a, b in value))
        if not is_int(self.size, INPUT_MULTIPLE) or self.size % INPUT_MULTIPLE or self.size > MAX_INPUT_SIZE:
            raise DetloaderValueError(
                f"size={self.size!r} must be a positive multiple of {INPUT_MULTIPLE}, at most {MAX_INPUT_SIZE}"
            )
        if self.width > MODEL_BOUNDS["width"][1]:
            raise DetloaderValueError(
                f"width={self.width!r} exceeds {MODEL_BOUNDS['width'][1]}, far beyond any real model"
            )
        if self.max_steps is not None and (not isinstance(self.max_steps, int) or self.max_steps < 1):
            raise DetloaderValueError(f"max_steps={self.max_steps!r} must be None or an int >= 1")
        for name, choices in (("on_decode_error", DECODE_ERROR_CHOICES), ("device", DEVICES),
                              ("landmark_loss", LANDMARK_LOSSES), ("eval_backend", BACKENDS)):
            if getattr(self, name) not in choices:
                raise DetloaderValueError(f"{name}={getattr(self, name)!r} is not one of {choices}")
        check_num_workers(self.num_workers)  # make_loader's own check
        if self.cache is not None and self.cache not in ("disk", "ram"):
            raise DetloaderValueError(f"cache={self.cache!r} must be None, 'disk' or 'ram'")
        if not (self.lr > 0 and self.weight_decay >= 0):
            raise DetloaderValueError(f"lr={self.lr!r} must be > 0 and weight_decay={self.weight_decay!r} >= 0")
        if not 0.0 <= self.score_threshold <= 1.0:
            raise DetloaderValueError(f"score_threshold={self.score_threshold!r} must be in [0, 1]")
        if not isinstance(self.balance, str) or not self.balance:
            raise DetloaderValueError(f"balance={self.balance!r} must be 'none' or a strategy name")
        if self.balance != NO_BALANCE:  # the strategies and their message: make_loader's
            check_strategy(self.balance)
        if isinstance(self.loss_weights, Mapping):
            object.__setattr__(self, "loss_weights", LossWeights.from_dict(self.loss_weights))

    @property
    def out_dir(self) -> Path:
        return Path(self.out)

    def replace(self, **changes: Any) -> TrainConfig:
        """A copy with ``changes`` (checked again)."""
        return replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-ready data (``loss_weights`` as a dict, ``balance_by`` as a list when a
        tuple)."""
        data = asdict(self)
        data["read_options"] = dict(self.read_options)
        if isinstance(self.balance_by, tuple):
            data["balance_by"] = list(self.balance_by)
        return data

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> TrainConfig:
        """Inverse of :meth:`to_dict`; unknown keys are an error naming them."""
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise DetloaderValueError(f"TrainConfig: unknown keys {unknown}; known: {sorted(known)}")
        values = dict(data)
        if isinstance(values.get("balance_by"), list):
            values["balance_by"] = tuple(values["balance_by"])
        return cls(**values)

    def save(self, path: str | os.PathLike[str]) -> None:
        """Write :meth:`to_dict` as JSON to ``path``, atomically and durably, never through a link
        (:func:`detloader._system.files.write_file`: a link at ``path`` is a ``NotRegularFileError``)."""
        from detloader._system.files import write_file

        write_file(path, json.dumps(self.to_dict(), indent=2) + "\n", durable=True, no_follow=True)
