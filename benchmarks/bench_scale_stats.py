"""``stats`` figures and sampler builds at scale, as ratios to a baseline of the same run.

On synthetic LVIS-shaped arrays (``--classes`` 1,203 classes with Zipf-like frequencies,
``--images`` images with about 6.7 objects each on average), in one process:

* ``reload``           mapping the index back from its cache file (what a warm ``index`` costs);
* ``argsort``          ``np.argsort`` of the object classes (the sampler builds' baseline);
* ``dataset_stats``    :func:`detloader.stats.dataset_stats` (what ``detloader stats`` computes);
* ``balance_report``   :func:`detloader.stats.balance_report` with ``sqrt``, without its draw;
* ``weighted sqrt``, ``weighted inverse``, ``repeat_factor``, ``class_aware``: building the
  sampler :func:`detloader.balance.make_balanced_sampler` gives.

Each measure runs ``--runs`` times, alternating with its baseline (the reload for the stats,
the argsort for the samplers); the table gives the medians and the median of the pairwise
ratios. The machine may be shared: only the ratios are meant to be compared.

With ``--loader FOLDER`` (a folder of JPEGs of one size), the same index's image paths cycle
over those files and, per size, a loader as ``detloader train`` makes one
(``DetectionDataset(index, Resize((384, 384)))``, the ``class_aware`` sampler,
``num_workers=2``, batches of 16) is timed from its construction to the first batch (the
sampler build, the dataset, the workers' start) and over the next 20 batches, against the
decode ceiling of the same files (one bare decode + resize process per usable CPU, all at
once; ``detloader bench``), alternating ``--runs`` times.

    python benchmarks/bench_scale_stats.py --images 30000 300000 1000000
    python benchmarks/bench_scale_stats.py --images 10000 100000 1000000 --loader DATA/JPEGImages
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch
from PIL import Image

from detloader import DetectionDataset, make_loader
from detloader.annotations.cache import load_index_file, save_index
from detloader.annotations.fields import pack_strings
from detloader.annotations.index import MISSING, AnnotationIndex, Vocabulary
from detloader.annotations.landmarks import LandmarkSchema
from detloader.balance import make_balanced_sampler
from detloader.tune.bench.loader_speed import concurrent_decode_rate
from detloader.stats import balance_report, dataset_stats
from detloader.transforms import Resize

#: the issue's goals: stats within this many reloads, a sampler build within this many argsorts
GOAL_STATS = 20.0
GOAL_SAMPLER = 5.0


def lvis_like(
    num_images: int, num_classes: int = 1203, seed: int = 0, files: list[Path] | None = None
) -> AnnotationIndex:
    """An index of ``num_images`` 640x480 images whose objects follow a long tail over
    ``num_classes`` classes (class ``c`` drawn with probability ~ 1 / (c + 1)^1.1, so the tail
    holds classes with a handful of objects or none); built from arrays, no files. ``files``
    (images of one size in one folder): image ``i`` is ``files[i % len(files)]``, at their size."""
    rng = np.random.default_rng(seed)
    per_image = rng.poisson(6.7, num_images)
    offsets = np.zeros(num_images + 1, dtype=np.int64)
    np.cumsum(per_image, out=offsets[1:])
    m = int(offsets[-1])
    p = 1.0 / np.arange(1, num_classes + 1) ** 1.1
    labels = rng.choice(num_classes, size=m, p=p / p.sum()).astype(np.int32)
    xy = rng.uniform(0, 500, (m, 2))
    wh = rng.uniform(2, 140, (m, 2))
    boxes = np.concatenate([xy, xy + wh], axis=1).astype(np.float32)
    names = [f"img{i}.jpg" for i in range(num_images)] if files is None else [
        files[i % len(files)].name for i in range(num_images)]
    blob, poffs = pack_strings(names)
    width, height = (640, 480) if files is None else Image.open(files[0]).size
    ablob, aoffs = pack_strings([""] * num_images)
    arrays = {
        "width": np.full(num_images, width, dtype=np.int32), "height": np.full(num_images, height, dtype=np.int32),
        "image_labels": np.full(num_images, MISSING, dtype=np.int32),
        "image_attributes": np.zeros((num_images, 0), dtype=np.int32), "verified": np.zeros(num_images, dtype=bool),
        "object_offsets": offsets, "boxes": boxes, "labels": labels, "difficult": np.zeros(m, dtype=bool),
        "truncated": np.zeros(m, dtype=bool), "occluded": np.zeros(m, dtype=bool),
        "object_attributes": np.zeros((m, 0), dtype=np.int32), "landmarks": np.zeros((m, 0, 2), dtype=np.float32),
        "visibility": np.zeros((m, 0), dtype=np.uint8), "image_paths_blob": blob, "image_paths_offsets": poffs,
        "annotation_paths_blob": ablob, "annotation_paths_offsets": aoffs,
    }
    vocab = Vocabulary(classes=tuple(f"class{c:04d}" for c in range(num_classes)), image_classes=(),
                       object_attributes=(), landmarks=LandmarkSchema())
    root = "/nonexistent" if files is None else str(files[0].parent)
    return AnnotationIndex(root=root, arrays=arrays, vocab=vocab)


def _seconds(fn: Callable[[], object]) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def paired(measure: Callable[[], object], baseline: Callable[[], object], runs: int) -> tuple[float, float, float]:
    """(median seconds of ``measure``, of ``baseline``, median of the pairwise ratios), the two
    timed in turn ``runs`` times after one untimed warm-up of each."""
    measure(), baseline()
    pairs = [(_seconds(measure), _seconds(baseline)) for _ in range(runs)]
    ours, base = zip(*pairs)
    return statistics.median(ours), statistics.median(base), statistics.median(a / b for a, b in pairs)


def run_size(num_images: int, runs: int, folder: Path) -> tuple[int, list[tuple[str, float, float, float, str]]]:
    """Objects, and the table rows of one size: (measure, seconds, baseline seconds, ratio,
    baseline name)."""
    index = lvis_like(num_images)
    path = folder / f"lvis{num_images}.idx"
    save_index(index, path, key="bench")
    mapped = load_index_file(path)
    labels = np.asarray(mapped.labels)

    def reload() -> None:
        load_index_file(path).num_objects  # noqa: B018 - touch the header-backed count

    def argsort() -> None:
        np.argsort(labels)

    rows = []
    for name, fn in (("dataset_stats", lambda: dataset_stats(mapped)),
                     ("balance_report sqrt", lambda: balance_report(mapped, "sqrt", draw=False))):
        ours, base, ratio = paired(fn, reload, runs)
        rows.append((name, ours, base, ratio, "reload"))
    for name, balance in (("weighted sqrt", "sqrt"), ("weighted inverse", "inverse"),
                          ("repeat_factor", "repeat_factor"), ("class_aware", "class_aware")):
        ours, base, ratio = paired(lambda b=balance: make_balanced_sampler(mapped, b), argsort, runs)
        rows.append((f"build {name}", ours, base, ratio, "argsort"))
    return mapped.num_objects, rows


def loader_at_scale(num_images: int, files: list[Path], runs: int) -> tuple[float, float, float]:
    """(median seconds to the first batch, median images/s over the next 20, median of the
    rate / decode ceiling pairs) of a class-aware ``num_workers=2`` loader over ``num_images``
    images that cycle over ``files``."""
    index = lvis_like(num_images, files=files)
    torch.set_num_threads(1)  # as the workers, and as `detloader bench`
    for f in files:
        f.read_bytes()  # every contender reads from memory

    def loader() -> tuple[float, float]:
        start = time.perf_counter()
        dataset = DetectionDataset(index, Resize((384, 384)), seed=0)
        sampler = make_balanced_sampler(index, "class_aware", seed=0)
        it = iter(make_loader(dataset, batch_size=16, sampler=sampler, num_workers=2))
        next(it)
        first = time.perf_counter() - start
        start, n = time.perf_counter(), 0
        for _, batch in zip(range(20), it):
            n += len(batch)
        rate = n / (time.perf_counter() - start)
        del it
        return first, rate

    def ceiling() -> float:
        return concurrent_decode_rate(index, 384, min(len(files), 320), 2)

    loader(), ceiling()
    pairs = [(loader(), ceiling()) for _ in range(runs)]
    return (statistics.median(f for (f, _), _ in pairs), statistics.median(r for (_, r), _ in pairs),
            statistics.median(r / c for (_, r), c in pairs))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--images", type=int, nargs="+", default=[30_000, 300_000], help="sizes (images)")
    parser.add_argument("--runs", type=int, default=5, help="alternating pairs per measure (default 5)")
    parser.add_argument("--loader", type=Path, metavar="FOLDER",
                        help="time a loader at each size over the JPEGs of FOLDER instead")
    args = parser.parse_args(argv)
    if args.loader is not None:
        files = sorted(args.loader.glob("*.jpg"))
        print(f"{len(files)} JPEGs of {Image.open(files[0]).size} in {args.loader}")
        print("| images | first batch s | loader img/s | loader / decode ceiling |")
        print("|---:|---:|---:|---:|")
        for n in args.images:
            first, rate, ratio = loader_at_scale(n, files, args.runs)
            print(f"| {n:,} | {first:.2f} | {rate:,.0f} | {ratio:.2f} |", flush=True)
        return 0
    print("| images | objects | measure | seconds | baseline | baseline s | ratio | goal |")
    print("|---:|---:|---|---:|---|---:|---:|---:|")
    with tempfile.TemporaryDirectory() as tmp:
        for n in args.images:
            objects, rows = run_size(n, args.runs, Path(tmp))
            for name, ours, base, ratio, base_name in rows:
                goal = GOAL_STATS if base_name == "reload" else GOAL_SAMPLER
                print(f"| {n:,} | {objects:,} | {name} | {ours:.3f} | {base_name} | {base:.4f} | {ratio:.1f} | "
                      f"{'<=' if ratio <= goal else '>'} {goal:g} |", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
