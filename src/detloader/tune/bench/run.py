"""``run_bench``: every section of ``detloader bench`` in one run, on one data set (synthetic
without a path); index caches go to a temporary folder, so the run leaves nothing behind.
"""

from __future__ import annotations

import os
import platform
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from detloader._system import logical_cores, physical_cores, usable_cpus
from detloader._system.cache_dir import CACHE_DIR_ENV
from detloader._system.memory import memory_facts
from detloader.annotations.read import read_annotations
from detloader.annotations.synth import make_synthetic
from detloader.errors import DetloaderValueError
from detloader.tune.bench.baselines import voc_layout
from detloader.tune.bench.index_speed import bench_index
from detloader.tune.bench.loader_speed import bench_loader
from detloader.tune.bench.report import BenchReport
from detloader.tune.bench.samplers import bench_samplers

#: The sections, in the order they run.
SECTIONS = ("loader", "index", "sampler")


@dataclass(frozen=True)
class BenchSettings:
    """What one run measures. ``quick``: a tiny run (seconds) that exercises every section;
    its figures say nothing about speed."""

    size: int = 384
    batch_size: int = 16
    batches: int = 20
    quick: bool = False
    sampler_weights: int = 10_000_000
    sampler_draws: int = 1_000_000
    index_files: int = 5000
    repeats: int = 2
    sections: tuple[str, ...] = SECTIONS
    cache: str | None = None

    @classmethod
    def make(cls, quick: bool = False, **given: Any) -> BenchSettings:
        """Defaults, or the quick ones, overridden by every ``given`` value that is not None."""
        base: dict[str, Any] = dict(
            size=64, batch_size=4, batches=2, sampler_weights=20_000, sampler_draws=2000,
            index_files=40, repeats=1,
        ) if quick else {}
        base.update({k: v for k, v in given.items() if v is not None})
        if "sections" in base:
            base["sections"] = tuple(base["sections"])
            unknown = set(base["sections"]) - set(SECTIONS)
            if unknown or not base["sections"]:
                raise DetloaderValueError(f"sections={list(base['sections'])!r}: choose from {', '.join(SECTIONS)}")
        if base.get("cache") not in (None, "disk", "ram"):
            raise DetloaderValueError(f"cache={base['cache']!r} is not one of disk, ram")
        settings = cls(quick=quick, **base)
        for name in ("size", "batch_size", "batches", "sampler_weights", "sampler_draws", "index_files", "repeats"):
            value = getattr(settings, name)
            if not isinstance(value, int) or value < 1:
                raise DetloaderValueError(f"{name}={value!r} must be an int >= 1")
        return settings


def machine_description() -> dict[str, Any]:
    """The machine in words and numbers: CPU model, cores, memory, versions, load."""
    model = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as fh:
            model = next((ln.split(":", 1)[1].strip() for ln in fh if ln.startswith("model name")), model)
    except OSError:
        pass
    return {
        "cpu": model,
        "usable_cpus": usable_cpus(),
        "logical_cores": logical_cores(),
        "physical_cores": physical_cores(),
        "memory_gb": round(memory_facts().total / 2**30, 1),
        "system": f"{platform.system()} {platform.release()}",
        "python": platform.python_version(),
        "torch": torch.__version__,
        "numpy": np.__version__,
        "load_average_start": os.getloadavg()[0] if hasattr(os, "getloadavg") else None,
    }


def _image_set(path: str | os.PathLike[str] | None, s: BenchSettings, tmp: Path) -> Path:
    """``path``, or a synthetic image set of twice the images the loader section times."""
    if path is not None:
        return Path(path)
    images = (s.batches + 1) * s.batch_size * 2
    return make_synthetic(tmp / "images", images, seed=0, size=(80, 60) if s.quick else (640, 480))


def run_bench(
    path: str | os.PathLike[str] | None = None,
    settings: BenchSettings | None = None,
    progress: Callable[[str], None] | None = None,
    read_options: dict[str, Any] | None = None,
) -> BenchReport:
    """Measure every section and return the report (see :mod:`detloader.bench`);
    ``read_options``: how to read ``path`` (:func:`detloader.read_annotations`' keywords;
    ``on_error`` defaults to ``"skip"``)."""
    s = settings or BenchSettings()
    options = {"on_error": "skip", **(read_options or {})}
    say = progress or (lambda _: None)
    cpus = usable_cpus()
    report = BenchReport(
        settings={**asdict(s), "sections": list(s.sections), "data": "synthetic" if path is None else "given",
                  "date": time.strftime("%Y-%m-%d")},
        machine=machine_description(),
    )
    old_cache = os.environ.get(CACHE_DIR_ENV)
    with tempfile.TemporaryDirectory(prefix="detloader-bench-") as tmp:
        os.environ[CACHE_DIR_ENV] = str(Path(tmp) / "cache")
        try:
            if "loader" in s.sections:
                root = _image_set(path, s, Path(tmp))
                index = read_annotations(root, **options)
                report.settings["images"] = len(index)
                say("loader")
                bench_loader(
                    report, index, root if voc_layout(root) else None, size=s.size,
                    batch_size=s.batch_size, batches=s.batches, cpus=cpus,
                    decode_images=min(len(index), s.batch_size * s.batches),
                    workdir=Path(tmp), repeats=s.repeats, cache=s.cache,
                )
            if "index" in s.sections:
                say("index")
                index_root = Path(path) if path is not None else make_synthetic(
                    Path(tmp) / "xml", s.index_files, seed=1, write_images=False
                )
                if (index_root / "Annotations").is_dir():
                    bench_index(report, index_root, **options)
                else:
                    report.notes.append("index: the ElementTree baseline needs Annotations/*.xml: skipped")
            if "sampler" in s.sections:
                say("sampler")
                bench_samplers(report, s.sampler_weights, s.sampler_draws)
        finally:
            if old_cache is None:
                os.environ.pop(CACHE_DIR_ENV, None)
            else:
                os.environ[CACHE_DIR_ENV] = old_cache
    report.machine["load_average_end"] = os.getloadavg()[0] if hasattr(os, "getloadavg") else None
    return report
