"""The tuner's store of results: :func:`save_result` writes a :class:`TuneResult` under its
:func:`~detloader.loader.auto.cache_key`, :func:`load_result` reads it back whole (the tuner reuses
a stored result). What ``make_loader(num_workers="auto")`` reads of these files, the load re-check
and the default without a result are :mod:`detloader.loader.auto`'s (the names below are its).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from detloader._system.files import atomic_write
from detloader.errors import DetloaderValueError
from detloader.loader.auto import (  # noqa: F401  (the names tune's users read here)
    WORKER_MEMORY_GUESS,
    LoadCheck,
    StaleTuneWarning,
    auto_loader_kwargs,
    auto_settings,
    cache_file,
    cache_key,
    check_load,
    current_free_cpus,
    dataset_hash,
    fit_to_load,
    heuristic_loader_kwargs,
    load_tolerance,
    machine_fingerprint,
    read_result_file,
    tune_cache_dir,
    untuned_loader_kwargs,
)
from detloader.loader.auto import find_saved as find_result  # noqa: F401
from detloader.tune.result import TuneResult


def save_result(result: TuneResult, folder: str | os.PathLike[str] | None = None) -> Path:
    """Write ``result`` under its ``key`` atomically; returns the file."""
    if not result.key:
        raise DetloaderValueError("save_result: the result has no key (it was not built by tune_loader)")
    path = cache_file(result.key, folder)
    path.parent.mkdir(parents=True, exist_ok=True)
    with atomic_write(path, "w") as fh:
        fh.write(result.to_json())
    return path


def load_result(key: dict[str, Any], folder: str | os.PathLike[str] | None = None) -> TuneResult | None:
    """The stored result for ``key``, whole; None when there is none or it cannot be read (an
    older layout, a damaged file: both are measured again; a FIFO there: a warning naming it)."""
    text = read_result_file(cache_file(key, folder))
    try:
        result = TuneResult.from_json(text) if text is not None else None
    except (ValueError, TypeError, KeyError):
        return None
    if result is None or result.key != key:
        return None
    result.from_cache = True
    return result
