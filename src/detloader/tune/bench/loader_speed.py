"""The loader section: images/s for num_workers 0..CPUs and decode threads against the decode
ceiling (the bare library calls, :data:`CEILING_CALLS`, from bytes in memory, in one process
per usable CPU, all at once: what any loader of these images at this size can reach on this
machine as it is), the untuned default, the best setting, the tutorial and
torchvision baselines and bytes per batch; with ``cache``, the loader reading the image store.
Every figure is the median of ``repeats`` runs taken round-robin (:func:`median_of`). See
docs/benchmarks.md, "What each section measures" (also: torchvision's recorded run).
"""

from __future__ import annotations

import functools
import gc
import io
import json
import multiprocessing
import os
import pickle
import statistics
import time
import warnings
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import numpy as np
import simplejpeg
import torch
import torch.nn.functional as F
from PIL import Image
from torch.utils.data import DataLoader, Dataset

from detloader.annotations.index import AnnotationIndex
from detloader.dataset import DetectionDataset
from detloader.loader import make_loader
from detloader.transforms import Resize
from detloader.tune.bench.baselines import TutorialDataset, torchvision_voc, tutorial_collate, voc_layout
from detloader.tune.bench.report import BenchReport

SECTION = "loader"
#: The run ``make bench-torchvision`` records (``$DETLOADER_TORCHVISION_RESULT`` first).
TORCHVISION_RESULT = Path(__file__).resolve().parents[4] / "benchmarks" / "results" / "torchvision.json"


def _loader(
    index: AnnotationIndex, size: int, batch_size: int, workers: int | str, threads: int, cache: str | None = None
) -> DataLoader[Any]:
    """``workers="auto"``: make_loader's own choice (no tuning result in the bench's cache)."""
    dataset = DetectionDataset(index, Resize((size, size)), seed=0, decode_threads=threads, cache=cache)  # type: ignore[arg-type]
    if workers == "auto":
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # "no tuning result": what this figure measures
            return make_loader(dataset, batch_size=batch_size, num_workers="auto")
    return make_loader(dataset, batch_size=batch_size, num_workers=workers, prefetch_factor=2 if workers else None)


#: What the ceiling times per image, in words (the report's notes say it).
CEILING_CALLS = (
    "simplejpeg.decode_jpeg (libjpeg-turbo; DCT-scaled to no less than the target where that halves both sides; "
    "PIL.Image.open().convert('RGB') for other formats) + torch.nn.functional.interpolate (uint8, bilinear, "
    "antialiased beyond 2x), from bytes already in memory"
)


def _bare_decode_resize(data: bytes, resize: Resize) -> None:
    """One image through the bare calls of :data:`CEILING_CALLS`, to the size ``resize`` gives it."""
    if data[:3] == b"\xff\xd8\xff":
        h, w, _, _ = simplejpeg.decode_jpeg_header(data)
        tw, th = resize.content_size(w, h)
        scaled = {"min_width": tw, "min_height": th} if 2 * tw <= w and 2 * th <= h else {}
        image = simplejpeg.decode_jpeg(data, colorspace="RGB", **scaled)
    else:
        with Image.open(io.BytesIO(data)) as img:
            image = np.asarray(img.convert("RGB"))
        tw, th = resize.content_size(image.shape[1], image.shape[0])
    x = torch.from_numpy(image).permute(2, 0, 1).unsqueeze(0)
    antialias = 2 * tw < image.shape[1] or 2 * th < image.shape[0]
    F.interpolate(x, size=(th, tw), mode="bilinear", align_corners=False, antialias=antialias)


def decode_rate(index: AnnotationIndex, size: int, images: int, repeats: int = 2) -> float:
    """Images per second of one core decoding the first ``images`` images of ``index`` and
    resizing them to ``size x size`` with the bare calls of :data:`CEILING_CALLS`, from their
    bytes read beforehand (an image those calls cannot decode is left out), best of ``repeats``
    passes. No file read, no check, no sample: what detloader's loader is measured against."""
    resize = Resize((size, size))
    blobs = []
    for i in range(min(images, len(index))):
        data = Path(index.image_path(i)).read_bytes()
        try:
            _bare_decode_resize(data, resize)  # also the first-call costs, untimed
        except (ValueError, OSError):
            continue
        blobs.append(data)
    best = 0.0
    for _ in range(repeats):
        start = time.perf_counter()
        for data in blobs:
            _bare_decode_resize(data, resize)
        best = max(best, len(blobs) / (time.perf_counter() - start))
    return best


def _decode_share(index: AnnotationIndex, size: int, images: int, barrier: Any, rates: Any) -> None:
    """One process of :func:`concurrent_decode_rate`: waits for the others, then times."""
    torch.set_num_threads(1)
    barrier.wait()
    rates.put(decode_rate(index, size, images, repeats=1))


def concurrent_decode_rate(index: AnnotationIndex, size: int, images: int, processes: int) -> float:
    """Images per second of ``processes`` processes each doing what :func:`decode_rate` does,
    started together (a barrier after their start-up): the sum of their rates. Where the
    cores share caches, memory bandwidth or a frequency budget (or a neighbour takes a share),
    this is below one core's rate times ``processes``, and it is what the machine can give a
    loader."""
    ctx = multiprocessing.get_context()
    barrier, rates = ctx.Barrier(processes), ctx.Queue()
    procs = [ctx.Process(target=_decode_share, args=(index, size, images, barrier, rates), daemon=True)
             for _ in range(processes)]
    for proc in procs:
        proc.start()
    try:
        return sum(rates.get(timeout=600) for _ in procs)
    finally:
        for proc in procs:
            proc.join(timeout=10)
            if proc.is_alive():
                proc.kill()


def _rate(make: Callable[[], Iterable[Any]], count: Callable[[Any], int], batches: int) -> float:
    """Images per second of the loader ``make()`` gives over up to ``batches`` batches after
    the first (worker start-up is not throughput); its workers end before this returns."""
    it = iter(make())
    n, start = 0, time.perf_counter()
    for step, batch in enumerate(it):
        if step == 0:
            start = time.perf_counter()
            continue
        n += count(batch)
        if step >= batches:
            break
    elapsed = time.perf_counter() - start
    del it
    gc.collect()  # shut the workers down before the next setting starts its own
    return n / elapsed if n and elapsed > 0 else 0.0


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
    workdir: Path,
    repeats: int = 1,
    cache: str | None = None,
) -> None:
    """Fill ``report``'s loader figures and ratios (``root``: the annotation folder, for the
    baselines that read VOC files themselves; ``workdir``: a folder for torchvision's VOC
    tree). The main process runs torch on one thread, as the workers do (its intra-op threads
    would compete with the decoding for the same cores). ``cache``
    (``"disk"`` or ``"ram"``): also time the store's build and the loader reading it."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        _bench_loader(report, index, root, size, batch_size, batches, cpus, decode_images, repeats, workdir)
        if cache is not None:
            _bench_store(report, index, cache, size, batch_size, batches, cpus, repeats)
    finally:
        torch.set_num_threads(threads)


def median_of(measures: dict[str, Callable[[], float]], repeats: int) -> dict[str, float]:
    """The median of ``repeats`` runs of every measure, taken round-robin (one run of each,
    then again), so that a change of the machine's load falls on all of them alike."""
    runs: dict[str, list[float]] = {key: [] for key in measures}
    for _ in range(repeats):
        for key, measure in measures.items():
            runs[key].append(measure())
    return {key: statistics.median(values) for key, values in runs.items()}


def _bench_loader(
    report: BenchReport, index: AnnotationIndex, root: Any, size: int, batch_size: int,
    batches: int, cpus: int, decode_images: int, repeats: int, workdir: Path,
) -> None:
    for i in range(min(len(index), (batches + 1) * batch_size)):  # every contender reads from memory
        Path(index.image_path(i)).read_bytes()

    def ours(workers: int, threads: int = 0) -> Callable[[], float]:
        return lambda: _rate(lambda: _loader(index, size, batch_size, workers, threads), len, batches)

    first = median_of(
        {"1 core": lambda: decode_rate(index, size, decode_images, repeats=1),
         "ceiling": lambda: concurrent_decode_rate(index, size, decode_images, cpus)}
        | {str(w): ours(w) for w in range(cpus + 1)},
        repeats,
    )
    single, ceiling = first.pop("1 core"), first.pop("ceiling")
    rates = {int(w): r for w, r in first.items()}
    best = max(rates, key=lambda w: rates[w])
    fig: dict[str, Any] = {
        "decode_single_core": single, "decode_ceiling": ceiling, "cpus": cpus,
        "detloader": first, "best_num_workers": best, "repeats": repeats, "ceiling_calls": CEILING_CALLS,
    }
    report.notes.append(f"loader: the decode ceiling times {CEILING_CALLS}")
    report.add(SECTION, f"decode ceiling ({cpus} processes at once) / 1 core x {cpus}",
               ("ceiling", ceiling), (f"1 core x {cpus}", single * cpus), "img/s")
    for w, rate in rates.items():
        report.add(
            SECTION, f"detloader num_workers={w} / decode ceiling",
            ("detloader", rate), ("ceiling", ceiling), "img/s",
        )
    workers = sorted({0, best})
    second: dict[str, Callable[[], float]] = {f"num_workers={w},decode_threads={cpus}": ours(w, cpus) for w in workers}
    auto = _loader(index, size, batch_size, "auto", 0)  # what the default picks on this machine now
    fig["auto_setting"] = f"num_workers={auto.num_workers},decode_threads={auto.dataset.decode_threads}"  # type: ignore[attr-defined]
    del auto
    second["auto"] = ours("auto")  # type: ignore[arg-type]
    baselines = _baselines(report, index, root, size, batch_size, batches, workers, workdir)
    second |= baselines
    measured = median_of(second, repeats)
    fig["detloader_decode_threads"] = {}
    for w, t in [(w, t) for w in workers for t in (0, cpus)]:  # threads 0: the first round's figure
        rate = measured[f"num_workers={w},decode_threads={t}"] if t else rates[w]
        fig["detloader_decode_threads"][f"num_workers={w},decode_threads={t}"] = rate
        report.add(
            SECTION, f"detloader num_workers={w} decode_threads={t} / decode ceiling",
            ("detloader", rate), ("ceiling", ceiling), "img/s",
        )
    every = {f"num_workers={w},decode_threads=0": r for w, r in rates.items()} | fig["detloader_decode_threads"]
    fig["best_setting"] = top = max(every, key=lambda k: every[k])
    # the default that picks the best setting is that setting: one figure, not two samples of it
    # (the best is the highest of several noisy medians; its own run is kept as auto_measured)
    same = fig["auto_setting"] == top
    fig["best_setting_rate"], fig["auto_measured"] = every[top], measured["auto"]
    fig["auto"] = every[top] if same else measured["auto"]
    report.add(SECTION, f"best setting ({top}) / decode ceiling", ("best", every[top]), ("ceiling", ceiling), "img/s")
    report.add(
        SECTION, f"untuned default (num_workers='auto' -> {fig['auto_setting']}) / best setting",
        ("default", fig["auto"]), ("best", every[top]), "img/s",
    )
    if same:
        report.notes.append(f"loader: the untuned default is the best setting (timed on its own: "
                            f"{measured['auto']:,.0f} img/s)")
    for key in baselines:
        name, w = key.split(":")
        fig.setdefault(name, {})[w] = measured[key]
        report.add(
            SECTION, f"num_workers={w}: detloader / {name}",
            ("detloader", rates[int(w)]), (name, measured[key]), "img/s",
        )
    _torchvision_ratio(report, fig)
    _bytes_per_batch(report, fig, index, root, size, batch_size)
    report.figures[SECTION] = fig


def _torchvision_ratio(report: BenchReport, fig: dict[str, Any]) -> None:
    """best setting / torchvision ``VOCDetection`` at its best num_workers: measured in this
    run, else the run ``make bench-torchvision`` recorded (its own best setting beside it),
    labelled as not measured here, with its date, data and machine, and noted."""
    what = "best setting / torchvision VOCDetection (its best num_workers)"
    if fig.get("torchvision"):
        report.add(SECTION, what, ("best", fig["best_setting_rate"]), ("torchvision", max(fig["torchvision"].values())),
                   "img/s")
        return
    path = Path(os.environ.get("DETLOADER_TORCHVISION_RESULT", TORCHVISION_RESULT))
    try:
        run = json.loads(path.read_text())
        theirs = run["figures"][SECTION]
        best, tv = theirs["best_setting_rate"], max(theirs["torchvision"].values())
    except (OSError, ValueError, KeyError, TypeError):
        report.notes.append(f"loader: no torchvision run recorded at {path} (`make bench-torchvision` makes it)")
        return
    settings, machine = run.get("settings", {}), run.get("machine", {})
    data = os.path.basename(str(settings.get("data_path", ""))) or settings.get("data", "?")
    where = (
        f"NOT measured in this run: recorded {settings.get('date', '?')} in {path.name} on {data} "
        f"({settings.get('images', '?')} images, {settings.get('size', '?')} px; {machine.get('cpu', '?')}, "
        f"{machine.get('usable_cpus', '?')} CPUs)"
    )
    report.add(SECTION, f"{what}, {where}", ("best", best), ("torchvision", tv), "img/s")
    report.notes.append(
        f"loader: the torchvision row is {where}: not this run's data or machine; measure it here with torchvision "
        "installed"
    )


def _baselines(
    report: BenchReport, index: AnnotationIndex, root: Any, size: int, batch_size: int,
    batches: int, workers: list[int], workdir: Path,
) -> dict[str, Callable[[], float]]:
    """``{"tutorial:W": measure, "torchvision:W": measure}`` for each ``W`` in ``workers``
    (the baselines that can run here)."""
    if root is None or not voc_layout(root):
        report.notes.append("loader: tutorial and torchvision baselines need Annotations/ + JPEGImages/: skipped")
        return {}
    classes = list(index.classes)
    datasets: dict[str, Dataset] = {"tutorial": TutorialDataset(root, classes, size)}  # type: ignore[type-arg]
    voc = torchvision_voc(root, classes, size, workdir)
    if voc is None:
        report.notes.append("loader: torchvision baseline skipped: torchvision is not installed")
    else:
        datasets["torchvision"] = voc
    def rate(d: Dataset, w: int) -> float:  # type: ignore[type-arg]
        return _rate(lambda: DataLoader(d, batch_size=batch_size, num_workers=w, collate_fn=tutorial_collate),
                     lambda b: len(b[0]), batches)

    return {f"{name}:{w}": functools.partial(rate, d, w) for name, d in datasets.items() for w in workers}


def _bytes_per_batch(
    report: BenchReport, fig: dict[str, Any], index: AnnotationIndex, root: Any, size: int, batch_size: int
) -> None:
    """Pickled bytes of one batch: what a worker hands to the main process."""
    batch = next(iter(_loader(index, size, batch_size, 0, 0)))
    ours = len(pickle.dumps(batch, protocol=pickle.HIGHEST_PROTOCOL))
    fig["batch_bytes"], fig["batch_images"] = ours, len(batch)
    if root is None or not voc_layout(root):
        return
    tutorial_set = TutorialDataset(root, list(index.classes), size)
    tutorial = next(iter(DataLoader(tutorial_set, batch_size=len(batch), collate_fn=tutorial_collate)))
    theirs = len(pickle.dumps(tutorial, protocol=pickle.HIGHEST_PROTOCOL))
    fig["tutorial_batch_bytes"] = theirs
    report.add(
        SECTION, f"pickled bytes per batch of {len(batch)}: tutorial / detloader",
        ("tutorial", theirs), ("detloader", ours), "B",
    )


def _bench_store(
    report: BenchReport, index: AnnotationIndex, cache: str, size: int, batch_size: int,
    batches: int, cpus: int, repeats: int,
) -> None:
    """The store's build time and the loader reading it (each image at the size the bench's
    ``Resize`` gives it) against the decode ceiling and decoding at the same ``num_workers``."""
    fig = report.figures[SECTION]
    start = time.perf_counter()
    store = DetectionDataset(index, Resize((size, size)), cache=cache).store  # type: ignore[arg-type]
    assert store is not None
    built = time.perf_counter() - start
    try:
        rates = median_of(
            {str(w): lambda w=w: _rate(lambda: _loader(index, size, batch_size, w, 0, cache), len, batches)
             for w in range(cpus + 1)},
            repeats,
        )
        best = max(rates, key=lambda w: rates[w])
        fig["store"] = {"cache": cache, "build_seconds": built, "bytes": store.path.stat().st_size,
                        "detloader": rates, "best_num_workers": int(best)}
        report.add(
            SECTION, f"cache={cache}: best store epoch (num_workers={best}) / decode ceiling",
            ("store", rates[best]), ("ceiling", fig["decode_ceiling"]), "img/s",
        )
        for w, rate in rates.items():
            report.add(
                SECTION, f"num_workers={w}: cache={cache} / decoding",
                ("store", rate), ("decoding", fig["detloader"][w]), "img/s",
            )
        report.notes.append(
            f"loader: image store built in {built:.1f} s ({store.path.stat().st_size / 2**20:.1f} MiB, cache={cache})"
        )
    finally:
        if cache == "ram":  # shared memory is not the temporary folder: leave nothing behind
            for path in (store.path, f"{store.path}.lock"):
                if os.path.exists(path):
                    os.unlink(path)
