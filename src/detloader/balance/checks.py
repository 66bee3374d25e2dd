"""Argument checks shared by the samplers: errors echo ``name=value`` and what is valid."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from detloader.balance.alias import MAX_WEIGHTS
from detloader.errors import DetloaderValueError


def check_int(name: str, value: Any, minimum: int, hint: str = "") -> int:
    """``int(value)``; raises ValueError ``"{name}={value!r} must be an int >= {minimum}"``
    (plus ``hint``) for a bool, a non-integer or a value below ``minimum``."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < minimum:
        raise DetloaderValueError(f"{name}={value!r} must be an int >= {minimum}{hint}")
    return int(value)


def as_weights(weights: Any) -> np.ndarray:
    """float64 ``[n]`` from numpy, torch or a sequence (a float64 numpy array is not copied);
    raises ValueError unless 1-D, non-empty, at most ``MAX_WEIGHTS`` long, finite, >= 0 and
    not all zero."""
    if isinstance(weights, torch.Tensor):
        weights = weights.detach().cpu().numpy()
    w = np.asarray(weights, dtype=np.float64)
    if w.ndim != 1 or len(w) == 0:
        raise DetloaderValueError(f"weights must be a non-empty 1-D sequence, got shape {w.shape}")
    if len(w) > MAX_WEIGHTS:
        raise DetloaderValueError(f"len(weights)={len(w)} exceeds {MAX_WEIGHTS}")
    bad = ~np.isfinite(w) | (w < 0)
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        raise DetloaderValueError(f"weights[{i}]={float(w[i])!r}: weights must be finite and >= 0")
    if not w.any():
        raise DetloaderValueError("weights are all zero: nothing can be drawn")
    return w
