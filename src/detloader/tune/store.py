"""The tuning cache: one JSON file per (machine, dataset, transform, batch size).

Files live in ``<user cache folder>/tune/`` (``$XDG_CACHE_HOME/detloader/tune`` or
``~/.cache/detloader/tune``), or ``$DETLOADER_CACHE_DIR/tune`` when that variable is set. The
file name is a hash of the four fingerprints; the file holds the :class:`TuneResult` JSON.

* **machine**: host name, logical and physical CPUs, the affinity set, the cgroup CPU quota,
  total RAM (GiB) and the cgroup memory limit, the accelerator and its count, the torch
  version. Not the momentary load: a result measured on a busy machine stays valid for that
  machine until :func:`detloader.tune_loader` is run again with ``refresh=True``.
* **dataset**: the index's cache key (a hash of its annotation files) and size when the
  dataset has one, else its type, length and ``repr``.
* **transform**: ``repr(dataset.transform)`` with memory addresses removed.
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
from detloader.annotations.cache import CACHE_DIR_ENV, atomic_write, user_cache_dir
from detloader.tune.result import TuneResult

__all__ = [
    "cache_file",
    "cache_key",
    "dataset_fingerprint",
    "load_result",
    "machine_fingerprint",
    "save_result",
    "strip_addresses",
    "transform_fingerprint",
    "tune_cache_dir",
]

_ADDRESS = re.compile(r" at 0x[0-9a-fA-F]+")


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


def dataset_fingerprint(dataset: Any) -> str:
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
        if facts["key"] is None:
            blob = getattr(index, "_image_path_blob", None)
            if blob is not None:
                facts["paths"] = hashlib.blake2b(memoryview(blob).cast("B"), digest_size=10).hexdigest()
        return _hash(facts)
    return _hash({
        "type": f"{type(dataset).__module__}.{type(dataset).__qualname__}",
        "len": len(dataset),
        "repr": strip_addresses(repr(dataset)),
    })


def transform_fingerprint(dataset: Any) -> str:
    """``repr`` of the dataset's ``transform`` attribute (addresses removed), or ``None``."""
    return strip_addresses(repr(getattr(dataset, "transform", None)))


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
        raise ValueError("save_result: the result has no key (it was not built by tune_loader)")
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
