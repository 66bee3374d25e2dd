"""The index section: cold build and warm (cached) reload against what a hand-written VOC
Dataset does at start-up, one ``ElementTree.parse`` per file in one process.
"""

from __future__ import annotations

import statistics
import time
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

from detloader.annotations.index import AnnotationIndex
from detloader.annotations.read import read_annotations
from detloader.tune.bench.report import BenchReport

SECTION = "index"


def warm_page_cache(root: Path) -> None:
    """Read every annotation file once, so that no contender pays for the first disk read."""
    for path in (root / "Annotations").iterdir():
        path.read_bytes()


def baseline_parse(root: Path) -> tuple[float, int]:
    """Seconds and objects of one ElementTree parse per file, names and boxes into lists."""
    start = time.perf_counter()
    n_objects = 0
    for path in sorted((root / "Annotations").glob("*.xml")):
        tree = ET.parse(path)
        for obj in tree.getroot().iter("object"):
            box = obj.find("bndbox")
            coords = [float(box.findtext(k)) for k in ("xmin", "ymin", "xmax", "ymax")]  # type: ignore[union-attr, arg-type]
            _ = (obj.findtext("name"), coords)
            n_objects += 1
    return time.perf_counter() - start, n_objects


def cold_build(root: Path, workers: int | None = None, **kwargs: Any) -> tuple[float, AnnotationIndex]:
    """Seconds of a build that ignores any cache (``cache="rebuild"``), and the index."""
    start = time.perf_counter()
    index = read_annotations(root, check_images=False, cache="rebuild", workers=workers, **kwargs)
    return time.perf_counter() - start, index


def warm_reload(root: Path, repeat: int = 5, **kwargs: Any) -> float:
    """Median seconds of reading the index back from its cache."""
    read_annotations(root, check_images=False, **kwargs)  # make sure the cache exists
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        read_annotations(root, check_images=False, **kwargs)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def bench_index(report: BenchReport, root: Path, **kwargs: Any) -> None:
    """Fill ``report``'s index figures: baseline, cold (1 process, then the default workers)
    and warm seconds on ``root`` (VOC)."""
    warm_page_cache(root)
    base_s, objects = baseline_parse(root)
    serial_s, _ = cold_build(root, workers=1, **kwargs)
    cold_s, index = cold_build(root, **kwargs)
    warm_s = warm_reload(root, **kwargs)
    report.figures[SECTION] = {
        "files": len(index), "objects": objects, "baseline_s": base_s, "cold_1_process_s": serial_s,
        "cold_s": cold_s, "warm_s": warm_s,
    }
    what = f"{len(index)} VOC files"
    baseline = ("ElementTree", base_s)
    for step, label, seconds in (
        ("cold build in 1 process", "cold", serial_s), ("cold build", "cold", cold_s), ("warm reload", "warm", warm_s)
    ):
        report.add(SECTION, f"{step}, {what}: ElementTree loop / detloader", baseline, (label, seconds), "s")
