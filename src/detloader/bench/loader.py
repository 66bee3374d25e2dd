"""The loader section: images/s for num_workers 0..CPUs against the decode ceiling, the
optional in-process decode threads, the tutorial and torchvision baselines, bytes per batch.
"""

from __future__ import annotations

import gc
import inspect
import pickle
import tempfile
from typing import Any, Callable

import torch
from torch.utils.data import DataLoader, Dataset

from detloader.annotations.index import AnnotationIndex
from detloader.bench.baselines import TutorialDataset, torchvision_voc, tutorial_collate, voc_layout
from detloader.bench.report import BenchReport
from detloader.bench.throughput import decode_rate, loader_rate
from detloader.dataset import DetectionDataset
from detloader.loader import make_loader
from detloader.transforms import Resize

__all__ = ["bench_loader", "decode_threads_target"]

SECTION = "loader"


def decode_threads_target() -> str | None:
    """Which of ``DetectionDataset`` / ``make_loader`` takes ``decode_threads`` (in-process
    decoding of a batch on threads), or None when neither does."""
    for name, fn in (("dataset", DetectionDataset), ("loader", make_loader)):
        if "decode_threads" in inspect.signature(fn).parameters:
            return name
    return None


def _loader(index: AnnotationIndex, size: int, batch_size: int, workers: int, threads: int | None) -> DataLoader[Any]:
    target = decode_threads_target() if threads is not None else None
    extra = {"decode_threads": threads} if target else {}
    dataset = DetectionDataset(index, Resize((size, size)), seed=0, **(extra if target == "dataset" else {}))
    return make_loader(
        dataset,
        batch_size=batch_size,
        num_workers=workers,
        prefetch_factor=2 if workers else None,
        **(extra if target == "loader" else {}),
    )


def _rate(make: Callable[[], Any], count: Callable[[Any], int], batches: int) -> float:
    loader = make()
    try:
        return loader_rate(loader, count, batches)
    finally:
        del loader
        gc.collect()


def bench_loader(
    report: BenchReport,
    index: AnnotationIndex,
    root: Any,
    *,
    size: int,
    batch_size: int,
    batches: int,
    cpus: int,
    decode_images: int,
) -> None:
    """Fill ``report``'s loader figures and ratios (``root``: the annotation folder, for the
    baselines that read VOC files themselves). The main process runs torch on one thread, as
    the workers do (``torch.set_num_threads(1)``): torch's intra-op threads would compete
    with the workers and the decoding for the same cores."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        _bench_loader(report, index, root, size, batch_size, batches, cpus, decode_images)
    finally:
        torch.set_num_threads(threads)


def _bench_loader(
    report: BenchReport, index: AnnotationIndex, root: Any, size: int, batch_size: int,
    batches: int, cpus: int, decode_images: int,
) -> None:
    single = decode_rate(index, size, decode_images)
    ceiling = single * cpus
    fig: dict[str, Any] = {"decode_single_core": single, "decode_ceiling": ceiling, "cpus": cpus}
    report.add(SECTION, f"decode ceiling: 1 core x {cpus} CPUs", ("ceiling", ceiling), ("1 core", single), "img/s")
    ours: dict[int, float] = {}
    for workers in range(cpus + 1):
        ours[workers] = _rate(lambda w=workers: _loader(index, size, batch_size, w, None), len, batches)
        report.add(
            SECTION, f"detloader num_workers={workers} / decode ceiling",
            ("detloader", ours[workers]), ("ceiling", ceiling), "img/s",
        )
    best = max(ours, key=lambda w: ours[w])
    fig["detloader"] = {str(w): r for w, r in ours.items()}
    fig["best_num_workers"] = best
    target = decode_threads_target()
    fig["decode_threads"] = target
    if target is None:
        report.notes.append("loader: decode_threads not accepted by DetectionDataset or make_loader: skipped")
    else:
        threaded: dict[str, float] = {}
        for workers in sorted({0, best}):
            for threads in (0, cpus):
                rate = _rate(lambda w=workers, t=threads: _loader(index, size, batch_size, w, t), len, batches)
                threaded[f"num_workers={workers},decode_threads={threads}"] = rate
                report.add(
                    SECTION, f"detloader num_workers={workers} decode_threads={threads} / decode ceiling",
                    ("detloader", rate), ("ceiling", ceiling), "img/s",
                )
        fig["detloader_decode_threads"] = threaded
    _baselines(report, fig, index, root, size, batch_size, batches, sorted({0, best}), ours)
    _bytes_per_batch(report, fig, index, root, size, batch_size)
    report.figures[SECTION] = fig


def _baselines(
    report: BenchReport, fig: dict[str, Any], index: AnnotationIndex, root: Any, size: int,
    batch_size: int, batches: int, workers: list[int], ours: dict[int, float],
) -> None:
    if root is None or not voc_layout(root):
        report.notes.append("loader: tutorial and torchvision baselines need Annotations/ + JPEGImages/: skipped")
        return
    classes = list(index.classes)
    with tempfile.TemporaryDirectory(prefix="detloader-bench-voc-") as tmp:
        candidates: dict[str, Dataset | None] = {  # type: ignore[type-arg]
            "tutorial": TutorialDataset(root, classes, size),
            "torchvision": torchvision_voc(root, classes, size, tmp),
        }
        for name, dataset in candidates.items():
            if dataset is None:
                report.notes.append(f"loader: {name} baseline skipped: torchvision is not installed")
                continue
            rates = {}
            for w in workers:
                rates[w] = _rate(
                    lambda d=dataset, w=w: DataLoader(d, batch_size=batch_size, num_workers=w, collate_fn=tutorial_collate),
                    lambda b: len(b[0]),
                    batches,
                )
                report.add(SECTION, f"num_workers={w}: detloader / {name}", ("detloader", ours[w]), (name, rates[w]), "img/s")
            fig[name] = {str(w): r for w, r in rates.items()}


def _bytes_per_batch(report: BenchReport, fig: dict[str, Any], index: AnnotationIndex, root: Any, size: int, batch_size: int) -> None:
    """Pickled bytes of one batch: what a worker hands to the main process."""
    batch = next(iter(_loader(index, size, batch_size, 0, None)))
    ours = len(pickle.dumps(batch, protocol=pickle.HIGHEST_PROTOCOL))
    fig["batch_bytes"] = ours
    fig["batch_images"] = len(batch)
    if root is None or not voc_layout(root):
        return
    tutorial = next(iter(DataLoader(TutorialDataset(root, list(index.classes), size), batch_size=len(batch), collate_fn=tutorial_collate)))
    theirs = len(pickle.dumps(tutorial, protocol=pickle.HIGHEST_PROTOCOL))
    fig["tutorial_batch_bytes"] = theirs
    report.add(SECTION, f"pickled bytes per batch of {len(batch)}: tutorial / detloader", ("tutorial", theirs), ("detloader", ours), "B")
