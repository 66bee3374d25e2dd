"""Loader settings without measuring: what ``make_loader(num_workers="auto")`` resolves to. It
never waits: files and instant figures only. A stored :func:`detloader.tune_loader` result (one
JSON file per :func:`cache_key` in :func:`tune_cache_dir`, read here as a :class:`SavedResult`:
the fields the loader needs, not the tuner's whole :class:`~detloader.tune.result.TuneResult`),
the load re-check (:func:`check_load`) and the default without a result
(:func:`heuristic_loader_kwargs`): docs/tuning.md, "When the load changes" and "The default
without tuning". The tuner writes the files (:mod:`detloader.tune.saved`); the loader only reads
them, so it never imports the tuner.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import socket
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from detloader import _system
from detloader._system.cache_dir import cache_root
from detloader._system.files import read_capped
from detloader.errors import (
    DetloaderRuntimeWarning,
    DetloaderValueError,
    NotRegularFileError,
    StaleTuneWarning,
    TuneWarning,
)

#: The stored results' layout (:class:`~detloader.tune.result.TuneResult` writes it); another is measured again.
RESULT_VERSION = 1

#: Most workers the default gives; tune_loader measures beyond it.
MAX_HEURISTIC_WORKERS = 8
#: Memory assumed per worker process when nothing was measured (bytes).
WORKER_MEMORY_GUESS = 512 * 2**20
#: Size cap of a stored result (a few KiB in practice); a larger file is measured again.
MAX_RESULT_BYTES = 4 * 2**20

_ADDRESS = re.compile(r" at 0x[0-9a-fA-F]+")
_TRANSFORM_ATTRIBUTES = ("transform", "transforms", "target_transform")
_SIMPLE = (str, int, float, bool, type(None), Path, list, tuple, dict)


# -- the key ------------------------------------------------------------------------------------
def _hash(data: Any) -> str:
    return hashlib.blake2b(json.dumps(data, sort_keys=True, default=str).encode(), digest_size=10).hexdigest()


def machine_fingerprint() -> str:
    """Hash of what makes one machine's best loader setting differ from another's (cheap: no
    measurement, no CUDA context)."""
    import torch  # lazy, keeps the CLI fast

    mem = _system.memory_facts()
    return _hash({
        "host": socket.gethostname(), "logical": _system.logical_cores(), "physical": _system.physical_cores(),
        "affinity": sorted(_system.affinity_set()), "quota": _system.cgroup_cpu_limit(),
        "ram_gib": round(mem.total / 2**30), "mem_limit": mem.cgroup_limit,
        "accelerator": list(_system.accelerator_info()), "torch": torch.__version__,
    })


def describe(value: Any, depth: int = 4) -> str:
    """A repr that is the same in every run and tells parameters apart: without memory
    addresses; an object whose repr holds a default ``<X object>`` (its own or a part's) is
    written ``X(name=value, ...)`` from its public attributes; lists, tuples and dicts element
    by element (``depth`` levels down)."""
    if depth > 0 and isinstance(value, (list, tuple)):
        inner = ", ".join(describe(v, depth - 1) for v in value)
        return f"[{inner}]" if isinstance(value, list) else f"({inner})"
    if depth > 0 and isinstance(value, dict):
        return "{" + ", ".join(f"{k!r}: {describe(v, depth - 1)}" for k, v in value.items()) + "}"
    text = _ADDRESS.sub("", repr(value))
    if depth > 0 and " object>" in text and hasattr(value, "__dict__"):
        cls = type(value)
        fields = ", ".join(f"{k}={describe(v, depth - 1)}" for k, v in sorted(vars(value).items())
                           if not k.startswith("_") and (isinstance(v, _SIMPLE) or callable(v)))
        return f"{cls.__module__}.{cls.__qualname__}({fields})"
    return text


def _wrapped(dataset: Any) -> list[Any]:
    """The datasets ``dataset`` wraps: its ``dataset``, or its ``datasets``, or else its
    attributes that are torch datasets (a user's wrapper: ``self.base = ...``)."""
    from torch.utils.data import Dataset  # lazy, keeps the CLI fast

    inner = getattr(dataset, "dataset", None)
    if inner is not None and inner is not dataset and hasattr(inner, "__getitem__") and hasattr(inner, "__len__"):
        return [inner]
    many = getattr(dataset, "datasets", None)
    if isinstance(many, (list, tuple)) and all(hasattr(d, "__getitem__") for d in many):
        return list(many)
    return [v for _, v in sorted(vars(dataset).items()) if isinstance(v, Dataset) and v is not dataset] \
        if hasattr(dataset, "__dict__") else []


def _identity(dataset: Any, depth: int = 0) -> tuple[dict[str, Any], list[str]]:
    """``(content facts, transform descriptions)`` of ``dataset`` and the datasets it wraps."""
    transforms = [f"{name}={describe(getattr(dataset, name))}" for name in _TRANSFORM_ATTRIBUTES
                  if getattr(dataset, name, None) is not None]
    index = dataset if hasattr(dataset, "object_offsets") else getattr(dataset, "index", None)
    if index is not None and hasattr(index, "meta"):
        return {"root": str(getattr(index, "root", "")), "images": len(index),
                "objects": int(getattr(index, "num_objects", 0)), "key": (index.meta or {}).get("cache_key"),
                "paths": index.paths_digest() if hasattr(index, "paths_digest") else None}, transforms
    facts: dict[str, Any] = {"type": f"{type(dataset).__module__}.{type(dataset).__qualname__}", "len": len(dataset)}
    inner = _wrapped(dataset) if depth < 4 else []
    if not inner:
        return {**facts, "repr": describe(dataset)}, transforms
    indices = getattr(dataset, "indices", None)
    facts["indices"] = _hash([int(i) for i in indices]) if indices is not None else None
    facts["wraps"] = []
    for d in inner:
        content, more = _identity(d, depth + 1)
        facts["wraps"].append(_hash(content))
        transforms += [f"wrapped: {t}" for t in more]
    return facts, transforms


def cache_key(dataset: Any, batch_size: int) -> dict[str, Any]:
    """What a result is stored under: the ``machine`` hash (not the load), the ``dataset`` hash,
    the ``transform`` text (``"None"`` without any) and ``batch_size`` (docs/tuning.md, "Your
    own dataset")."""
    content, transforms = _identity(dataset)
    transform = "; ".join(transforms) if transforms else "None"
    if len(transforms) == 1 and transform.startswith("transform="):
        transform = transform[len("transform="):]
    return {"machine": machine_fingerprint(), "dataset": _hash(content), "transform": transform,
            "batch_size": int(batch_size)}


# -- the files ----------------------------------------------------------------------------------
def tune_cache_dir(override: str | os.PathLike[str] | None = None) -> Path:
    """Folder of the stored results (not created here)."""
    if override is not None:
        return Path(override)
    return cache_root() / "tune"


def cache_file(key: dict[str, Any], folder: str | os.PathLike[str] | None = None) -> Path:
    return tune_cache_dir(folder) / f"{_hash(key)}.json"


def loader_kwargs(
    num_workers: int, pin_memory: bool = False, prefetch_factor: int | None = 2, persistent_workers: bool = True
) -> dict[str, Any]:
    """The four DataLoader keyword arguments the tuner sets, valid together (with
    ``num_workers=0`` DataLoader refuses a ``prefetch_factor`` and ``persistent_workers``)."""
    if num_workers < 0:
        raise DetloaderValueError(f"num_workers={num_workers} must be >= 0")
    if num_workers == 0:
        return {"num_workers": 0, "pin_memory": bool(pin_memory), "prefetch_factor": None, "persistent_workers": False}
    if prefetch_factor is None or prefetch_factor < 1:
        raise DetloaderValueError(f"prefetch_factor={prefetch_factor} must be >= 1 when num_workers > 0")
    return {"num_workers": int(num_workers), "pin_memory": bool(pin_memory),
            "prefetch_factor": int(prefetch_factor), "persistent_workers": bool(persistent_workers)}


def free_cpus(usable: int, affinity: int, busy: float) -> float:
    """CPUs left for us: affinity CPUs minus those others keep busy, capped by ``usable``."""
    return max(0.0, min(float(usable), affinity - busy))


@dataclass(frozen=True)
class SavedMachine:
    """What :func:`check_load` reads of the machine a result was measured on."""

    free_cpus: float


@dataclass(frozen=True)
class SavedResult:
    """The fields of a stored tuning result that ``"auto"`` reads (the file is a
    :class:`~detloader.tune.result.TuneResult`'s JSON): what it is filed under (``key``), the
    recommended DataLoader settings and ``decode_threads``, its one-line ``summary``, the
    ``batch_size`` and ``created`` time, the chosen setting's ``images_per_s`` and the free CPUs
    then (``machine.free_cpus``)."""

    key: dict[str, Any]
    recommended: dict[str, Any]
    decode_threads: int
    summary: str
    batch_size: int
    created: str
    images_per_s: float
    machine: SavedMachine
    #: read from the store (as a :class:`~detloader.tune.result.TuneResult` that ``load_result`` gives)
    from_cache = True

    @classmethod
    def from_json(cls, text: str) -> SavedResult:
        """ValueError (or KeyError, TypeError) for a file that is not a result of this layout."""
        data = json.loads(text)
        if not isinstance(data, dict) or data.get("version") != RESULT_VERSION:
            raise DetloaderValueError(f"not a tuning result of version {RESULT_VERSION}")
        return cls(
            key=dict(data["key"]), recommended=dict(data["recommended"]),
            decode_threads=int(data.get("decode_threads", 0)), summary=str(data["summary"]),
            batch_size=int(data["batch_size"]), created=str(data.get("created", "")),
            images_per_s=float(data["trials"][int(data["chosen"])]["images_per_s"]),
            machine=SavedMachine(float(data["machine"]["free_cpus"])),
        )


def read_result_file(path: Path) -> str | None:
    """The text of the stored result at ``path``; None when there is none or it cannot be read.
    A FIFO, socket or device there is never opened (it would block): None, with a
    :class:`DetloaderRuntimeWarning` naming it."""
    try:
        return read_capped(path, MAX_RESULT_BYTES).decode("utf-8")
    except NotRegularFileError as err:
        warnings.warn(f"{path}: {err}; stored tuning result not read (remove it)", DetloaderRuntimeWarning,
                      stacklevel=3)
    except (OSError, ValueError):
        pass
    return None


def load_saved(key: dict[str, Any], folder: str | os.PathLike[str] | None = None) -> SavedResult | None:
    """The stored result for ``key``; None when there is none or it cannot be read (an older
    layout, a damaged file: both are measured again)."""
    text = read_result_file(cache_file(key, folder))
    try:
        result = SavedResult.from_json(text) if text is not None else None
    except (ValueError, TypeError, KeyError, IndexError):
        return None
    return result if result is not None and result.key == key else None


def find_saved(dataset: str, batch_size: int | None = None,
               folder: str | os.PathLike[str] | None = None) -> SavedResult | None:
    """A stored result for this machine and the data whose :func:`dataset_hash` is ``dataset``,
    whatever its transform and batch size: one at ``batch_size`` first, then the newest; None
    when there is none. Unreadable files are passed over (as by :func:`load_saved`)."""
    machine, found = machine_fingerprint(), []
    try:
        paths = sorted(tune_cache_dir(folder).glob("*.json"))
    except OSError:
        return None
    for path in paths:
        try:
            result = SavedResult.from_json(read_capped(path, MAX_RESULT_BYTES).decode("utf-8"))
        except (OSError, ValueError, TypeError, KeyError, IndexError):
            continue
        if result.key.get("machine") == machine and result.key.get("dataset") == dataset:
            found.append(result)
    found.sort(key=lambda r: (r.batch_size == batch_size, r.created), reverse=True)
    return found[0] if found else None


# -- the load -----------------------------------------------------------------------------------
def load_tolerance(usable_cpus: int) -> float:
    """Free CPUs more or fewer that count as a changed load: 1, or a quarter of the usable CPUs
    when that is more."""
    return max(1.0, 0.25 * usable_cpus)


def current_free_cpus() -> tuple[float, int]:
    """``(free CPUs now, usable CPUs)`` from the instant load figure (no waiting)."""
    usable = _system.usable_cpus()
    return free_cpus(usable, _system.affinity_cpus(), _system.busy_now()), usable


@dataclass(frozen=True)
class LoadCheck:
    """Free CPUs when the result was measured (``then``) and now."""

    then: float
    now: float
    usable: int
    tolerance: float

    @property
    def changed(self) -> bool:
        return abs(self.now - self.then) >= self.tolerance

    @property
    def busier(self) -> bool:
        return self.then - self.now >= self.tolerance

    def describe(self) -> str:
        way = "busier" if self.busier else "quieter" if self.changed else "as busy"
        return (f"the machine is {way} than when it was tuned: {self.now:.1f} of {self.usable} CPUs free now, "
                f"{self.then:.1f} then")


def check_load(result: Any) -> LoadCheck:
    """The free CPUs stored in ``result`` (a :class:`TuneResult`) against the free CPUs now."""
    now, usable = current_free_cpus()
    return LoadCheck(float(result.machine.free_cpus), now, usable, load_tolerance(usable))


def fit_to_load(recommended: dict[str, Any], check: LoadCheck) -> dict[str, Any]:
    """``recommended`` with at most ``max(1, round(free now))`` workers on a busier machine
    (the tuner's own cap on a busy machine); unchanged otherwise."""
    cap = max(1, int(check.now + 0.5))
    if not check.busier or recommended.get("num_workers", 0) <= cap:
        return dict(recommended)
    return loader_kwargs(cap, pin_memory=bool(recommended.get("pin_memory")),
                         prefetch_factor=recommended.get("prefetch_factor") or 2,
                         persistent_workers=bool(recommended.get("persistent_workers", True)))


# -- the default and the lookup -----------------------------------------------------------------
def heuristic_loader_kwargs(
    *, free: float, memory_available: int, can_pin: bool, processes: int = 1, usable: int | None = None
) -> tuple[dict[str, Any], str]:
    """The default without a tuning result (``decode_threads`` included) and its reason: with 3
    or more free CPUs per loader, CPUs - 1 workers (at most :data:`MAX_HEURISTIC_WORKERS`);
    with fewer, 2 workers when ``usable`` gives the loader 2 CPUs and other processes keep less
    than half a CPU busy; every worker must fit in half the memory at
    :data:`WORKER_MEMORY_GUESS` each. No worker and 2 usable CPUs: 2 decode threads in the
    main process. ``free``: CPUs free for this machine's training processes; ``processes``:
    how many share it (each with its own loader); ``memory_available``: bytes; ``usable``:
    CPUs this process may use, whatever the load (default: ``free``, rounded). The
    measurements behind each rule: docs/tuning.md, "The default without tuning"."""
    if processes < 1:
        raise DetloaderValueError(f"processes={processes} must be >= 1")
    cpus = int(free / processes + 0.5)
    mem_workers = int(0.5 * max(0, memory_available) // WORKER_MEMORY_GUESS)
    usable_cpus = usable if usable is not None else cpus * processes
    two, busy = usable_cpus / processes >= 2, free < usable_cpus - 0.5 * processes
    if cpus >= 3:
        workers = max(0, min(cpus - 1, MAX_HEURISTIC_WORKERS, mem_workers))
    else:  # 2 quiet CPUs: 2 workers (1 is slower than threads in the main process)
        workers = 2 if two and not busy and mem_workers >= 2 else 0
    threads = 2 if workers == 0 and two else 0
    kwargs = {**loader_kwargs(workers, pin_memory=can_pin), "decode_threads": threads}
    per = f" / {processes} processes" if processes > 1 else ""
    return kwargs, (f"heuristic: {free:.1f} of {usable_cpus} CPUs free{per} -> num_workers={workers}, "
                    f"decode_threads={threads}, pin_memory={can_pin}")


def untuned_loader_kwargs() -> tuple[dict[str, Any], str]:
    """The untuned default of this machine (``decode_threads`` included) and its reason:
    :func:`heuristic_loader_kwargs` for the usable CPUs (affinity mask, cgroup quota) and the
    available memory, all of them counted free. The load of other processes is not read: its
    instant figures flip between runs on the same machine (one task more or less is half of a
    2-CPU machine), and the choice must not (docs/tuning.md, "The default without tuning")."""
    usable, processes = _system.usable_cpus(), _system.local_world_size()
    can_pin = _system.accelerator_info()[0] in _system.PINNABLE
    kwargs, _ = heuristic_loader_kwargs(free=float(usable), usable=usable, processes=processes,
                                        memory_available=_system.memory_facts().available, can_pin=can_pin)
    per = f" / {processes} processes" if processes > 1 else ""
    return kwargs, (f"heuristic: untuned default for {usable} usable CPUs{per} -> num_workers={kwargs['num_workers']}, "
                    f"decode_threads={kwargs['decode_threads']}, pin_memory={can_pin}")


def dataset_hash(dataset: Any) -> str:
    """The ``dataset`` part of :func:`cache_key` of ``dataset`` (an index, or a dataset over one)."""
    return _hash(_identity(dataset)[0])


@dataclass(frozen=True)
class AutoSettings:
    """What ``num_workers="auto"`` resolves to (:func:`auto_settings`): ``kwargs`` (``num_workers``,
    ``pin_memory``, ``prefetch_factor``, ``persistent_workers``, ``decode_threads``), the one-line
    ``reason``, and the stored ``result`` with its ``load`` re-check (both None for the untuned default)."""

    kwargs: dict[str, Any]
    reason: str
    result: SavedResult | None = None
    load: LoadCheck | None = None


def auto_settings(
    dataset: Any, batch_size: int, *, data_hash: str | None = None,
    cache_dir: str | os.PathLike[str] | None = None,
) -> AutoSettings:
    """The one resolution of ``num_workers="auto"`` (``make_loader`` and ``detloader train``), quietly.
    Never waits. The stored :func:`detloader.tune_loader` result for ``dataset`` at ``batch_size``
    (with ``data_hash``, a :func:`dataset_hash`, else any result for that data: :func:`find_saved`),
    on a busier machine capped to the CPUs free now (:func:`fit_to_load`); else
    :func:`untuned_loader_kwargs`."""
    if batch_size < 1:
        raise DetloaderValueError(f"batch_size={batch_size} must be >= 1")
    result = load_saved(cache_key(dataset, batch_size), cache_dir)
    if result is None and data_hash is not None:
        result = find_saved(data_hash, batch_size, cache_dir)
    if result is None:
        kwargs, reason = untuned_loader_kwargs()
        return AutoSettings(kwargs, reason)
    check = check_load(result)
    kwargs = {**fit_to_load(result.recommended, check), "decode_threads": int(result.decode_threads)}
    changed = f", load changed: {result.summary}; {check.describe()}" if check.changed else f": {result.summary}"
    return AutoSettings(kwargs, f"tuned{changed}", result, check)

def auto_loader_kwargs(
    dataset: Any,
    batch_size: int,
    *,
    cache_dir: str | os.PathLike[str] | None = None,
    warn: bool = True,
    stacklevel: int = 2,
    decode_threads: bool = False,
) -> tuple[dict[str, Any], str]:
    """DataLoader keyword arguments ``num_workers``, ``pin_memory``, ``prefetch_factor``,
    ``persistent_workers`` for ``dataset`` at ``batch_size``, and a one-line reason: :func:`auto_settings`
    and, with ``warn``, a :class:`StaleTuneWarning` when the load changed since the stored result was
    measured or a :class:`TuneWarning` when there is none, pointing ``stacklevel`` frames up. With
    ``decode_threads`` the dict also holds ``decode_threads`` (the
    :class:`~detloader.dataset.DetectionDataset` setting, not a DataLoader argument).
    """
    auto = auto_settings(dataset, batch_size, cache_dir=cache_dir)
    kwargs = dict(auto.kwargs)
    if warn and auto.result is not None and auto.load is not None and auto.load.changed:
        tuned = auto.result.recommended["num_workers"]
        fitted = {k: v for k, v in kwargs.items() if k != "decode_threads"}
        capped = (f"num_workers={kwargs['num_workers']} instead of the tuned {tuned}"
                  if fitted != auto.result.recommended else f"the tuned num_workers={tuned} is kept")
        warnings.warn(f"{auto.load.describe()}: {capped}. Run detloader.tune_loader(dataset, batch_size=...) or "
                      "`detloader tune PATH` again to measure under this load.", StaleTuneWarning,
                      stacklevel=stacklevel)
    elif warn and auto.result is None:
        warnings.warn("no tuning result for this machine, dataset, transform and batch size: loader settings "
                      "come from a heuristic. Run detloader.tune_loader(dataset, batch_size=...) or "
                      "`detloader tune PATH` once to measure them.", TuneWarning, stacklevel=stacklevel)
    if not decode_threads:
        del kwargs["decode_threads"]
    return kwargs, auto.reason
