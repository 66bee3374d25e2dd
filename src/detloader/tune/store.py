"""The tuning cache: one JSON file per (machine, dataset, transform, batch size).

Files live in ``<user cache folder>/tune/`` (``$XDG_CACHE_HOME/detloader/tune`` or
``~/.cache/detloader/tune``), or ``$DETLOADER_CACHE_DIR/tune`` when that variable is set. The
file name is a hash of the four fingerprints; the file holds the :class:`TuneResult` JSON.

* **machine**: host name, logical and physical CPUs, the affinity set, the cgroup CPU quota,
  total RAM (GiB) and the cgroup memory limit, the accelerator and its count, the torch
  version. Not the momentary load: that is stored *in* the result (``machine.busy_cpus`` /
  ``free_cpus``) and re-checked on every reuse (:mod:`detloader.tune.freshness`).
* **dataset**: the index's cache key (a hash of its annotation files) and size when the
  dataset has one; a dataset that wraps others (``dataset`` / ``datasets`` attributes, as
  ``torch.utils.data.Subset`` and ``ConcatDataset`` have, or the user's own wrapper) adds their
  fingerprints, its type, length and ``indices``; any other dataset its type, length and
  :func:`describe` (its ``repr``, or for the default ``<X object>`` repr, its attributes).
* **transform**: the ``transform``, ``transforms`` and ``target_transform`` attributes of the
  dataset and of the datasets it wraps, by :func:`describe` (memory addresses removed): a
  transform chain of the user's own classes counts with its parameters.
* **batch size**.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import socket
from pathlib import Path
from typing import Any

from detloader import _system
from detloader._files import atomic_write
from detloader.annotations.cache import CACHE_DIR_ENV, user_cache_dir
from detloader.errors import DetloaderValueError
from detloader.tune.result import TuneResult

_ADDRESS = re.compile(r" at 0x[0-9a-fA-F]+")
_TRANSFORM_ATTRIBUTES = ("transform", "transforms", "target_transform")
_SIMPLE = (str, int, float, bool, type(None), Path)


def tune_cache_dir(override: str | os.PathLike[str] | None = None) -> Path:
    """Folder of the tuning results (not created here)."""
    if override is not None:
        return Path(override)
    env = os.environ.get(CACHE_DIR_ENV)
    return (Path(env) if env else user_cache_dir()) / "tune"


def _hash(data: Any) -> str:
    blob = json.dumps(data, sort_keys=True, default=str).encode("utf-8")
    return hashlib.blake2b(blob, digest_size=10).hexdigest()


def machine_fingerprint() -> str:
    """Hash of what makes one machine's best loader setting differ from another's (cheap: no
    measurement, no CUDA context)."""
    import torch  # torch: lazy, keeps the CLI fast

    kind, name, count = _system.accelerator_info()
    mem = _system.memory_facts()
    facts = {
        "host": socket.gethostname(),
        "logical": _system.logical_cores(),
        "physical": _system.physical_cores(),
        "affinity": sorted(_system.affinity_set()),
        "quota": _system.cgroup_cpu_limit(),
        "ram_gib": round(mem.total / 2**30),
        "mem_limit": mem.cgroup_limit,
        "accelerator": [kind, name, count],
        "torch": torch.__version__,
    }
    return _hash(facts)


def strip_addresses(text: str) -> str:
    """``<function f at 0x7f..>`` -> ``<function f>``: a repr that is the same in every run."""
    return _ADDRESS.sub("", text)


def describe(value: Any, depth: int = 4) -> str:
    """A repr that is the same in every run and tells parameters apart: ``repr`` without
    memory addresses; an object whose repr holds a default ``<X object>`` repr (its own, or a
    part's: a chain of the user's transforms) is written
    ``X(name=value, ...)`` from its attributes, and lists, tuples and dicts element by
    element (``depth`` levels down)."""
    if depth > 0 and isinstance(value, (list, tuple)):
        inner = ", ".join(describe(v, depth - 1) for v in value)
        return f"[{inner}]" if isinstance(value, list) else f"({inner})"
    if depth > 0 and isinstance(value, dict):
        return "{" + ", ".join(f"{k!r}: {describe(v, depth - 1)}" for k, v in value.items()) + "}"
    text = strip_addresses(repr(value))
    if depth > 0 and " object>" in text and hasattr(value, "__dict__"):  # a default repr, maybe nested
        cls = type(value)
        fields = ", ".join(f"{k}={describe(v, depth - 1)}" for k, v in sorted(vars(value).items())
                           if not k.startswith("_") and (isinstance(v, _SIMPLE + (list, tuple, dict)) or callable(v)))
        return f"{cls.__module__}.{cls.__qualname__}({fields})"
    return text


def _wrapped(dataset: Any) -> list[Any]:
    """The datasets ``dataset`` wraps: its ``dataset`` attribute, or its ``datasets``, or else
    its attributes that are torch datasets (a user's wrapper: ``self.base = ...``)."""
    from torch.utils.data import Dataset  # torch: lazy, keeps the CLI fast

    inner = getattr(dataset, "dataset", None)
    if inner is not None and inner is not dataset and hasattr(inner, "__getitem__") and hasattr(inner, "__len__"):
        return [inner]
    many = getattr(dataset, "datasets", None)
    if isinstance(many, (list, tuple)) and all(hasattr(d, "__getitem__") for d in many):
        return list(many)
    return [v for _, v in sorted(getattr(dataset, "__dict__", {}).items())
            if isinstance(v, Dataset) and v is not dataset]


def dataset_fingerprint(dataset: Any, _depth: int = 0) -> str:
    """Hash identifying the dataset's content (not its transform)."""
    index = getattr(dataset, "index", None)
    if index is None and hasattr(dataset, "object_offsets"):
        index = dataset  # an AnnotationIndex itself
    if index is not None and hasattr(index, "meta"):
        meta = getattr(index, "meta", {}) or {}
        facts: dict[str, Any] = {
            "root": str(getattr(index, "root", "")),
            "images": len(index),
            "objects": int(getattr(index, "num_objects", 0)),
            "key": meta.get("cache_key"),
        }
        if hasattr(index, "paths_digest"):  # which images: two subsets of one size differ
            facts["paths"] = index.paths_digest()
        return _hash(facts)
    kind = f"{type(dataset).__module__}.{type(dataset).__qualname__}"
    inner = _wrapped(dataset) if _depth < 4 else []
    if inner:
        indices = getattr(dataset, "indices", None)
        return _hash({
            "type": kind,
            "len": len(dataset),
            "wraps": [dataset_fingerprint(d, _depth + 1) for d in inner],
            "indices": _hash([int(i) for i in indices]) if indices is not None else None,
        })
    return _hash({"type": kind, "len": len(dataset), "repr": describe(dataset)})


def _transforms(dataset: Any, depth: int = 0) -> list[str]:
    found = [f"{name}={describe(getattr(dataset, name))}" for name in _TRANSFORM_ATTRIBUTES
             if getattr(dataset, name, None) is not None]
    if depth < 4:
        for inner in _wrapped(dataset):
            found += [f"wrapped: {t}" for t in _transforms(inner, depth + 1)]
    return found


def transform_fingerprint(dataset: Any) -> str:
    """The dataset's transform chain as text (see the module docstring): ``repr`` of its
    ``transform`` alone when that is all it has (a :class:`~detloader.DetectionDataset`), else
    every transform attribute of it and of the datasets it wraps; ``"None"`` without any."""
    found = _transforms(dataset)
    if not found:
        return "None"
    if len(found) == 1 and found[0].startswith("transform="):
        return found[0][len("transform="):]
    return "; ".join(found)


def cache_key(dataset: Any, batch_size: int, machine: str | None = None) -> dict[str, Any]:
    """The four fingerprints of a tuning result."""
    return {
        "machine": machine if machine is not None else machine_fingerprint(),
        "dataset": dataset_fingerprint(dataset),
        "transform": transform_fingerprint(dataset),
        "batch_size": int(batch_size),
    }


def cache_file(key: dict[str, Any], folder: str | os.PathLike[str] | None = None) -> Path:
    return tune_cache_dir(folder) / f"{_hash(key)}.json"


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
    """The cached result for ``key``, or None when there is none or it cannot be read (an
    older layout, a damaged file: both are measured again)."""
    path = cache_file(key, folder)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError:
        return None
    try:
        result = TuneResult.from_json(text)
    except (ValueError, TypeError, KeyError):
        return None
    if result.key != key:
        return None
    result.from_cache = True
    return result
