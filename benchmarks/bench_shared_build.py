"""One build per node: several processes (torchrun ranks, scripts) that open the same dataset at
once build its index cache and its store of decoded images once; the others wait and map the file.

``python benchmarks/bench_shared_build.py [--images 2000] [--procs 2] [--runs 3]`` writes the synthetic
dataset, then per run (a fresh cache folder each time) times a cold ``read_annotations`` +
``DetectionDataset(cache="disk")`` in one process alone and in ``--procs`` processes started together,
and counts how many processes parsed the annotations and built the store. Prints JSON.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import statistics
import tempfile
import time
from pathlib import Path


def _open(root: str, cache_dir: str, barrier: object, out: object) -> None:
    os.environ["DETLOADER_CACHE_DIR"] = cache_dir
    import detloader
    import detloader.annotations.read as read
    import detloader.dataset.store as store
    from detloader.transforms import Resize

    built = {"index": 0, "store": 0}
    build_index, build_store = read.build_index, store.ImageStore._build

    def count_index(*args: object, **kw: object) -> object:
        built["index"] += 1
        return build_index(*args, **kw)

    def count_store(*args: object, **kw: object) -> object:
        built["store"] += 1
        return build_store(*args, **kw)

    read.build_index, store.ImageStore._build = count_index, count_store  # type: ignore[assignment]
    barrier.wait()  # type: ignore[attr-defined]
    t0 = time.perf_counter()
    index = detloader.read_annotations(root, workers=1)
    detloader.DetectionDataset(index, Resize(128, mode="letterbox"), cache="disk")
    out.put({"seconds": time.perf_counter() - t0, **built})  # type: ignore[attr-defined]


def _together(root: str, procs: int) -> dict[str, float]:
    ctx = mp.get_context("spawn")
    with tempfile.TemporaryDirectory() as cache:
        barrier, out = ctx.Barrier(procs), ctx.Queue()
        workers = [ctx.Process(target=_open, args=(root, cache, barrier, out)) for _ in range(procs)]
        for w in workers:
            w.start()
        got = [out.get() for _ in workers]
        for w in workers:
            w.join()
    return {"wall": max(g["seconds"] for g in got), "index_builds": sum(g["index"] for g in got),
            "store_builds": sum(g["store"] for g in got)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--images", type=int, default=2000)
    p.add_argument("--procs", type=int, default=2)
    p.add_argument("--runs", type=int, default=3)
    args = p.parse_args()
    from detloader.annotations.synth import make_synthetic

    with tempfile.TemporaryDirectory() as tmp:
        root = str(make_synthetic(Path(tmp) / "faces", args.images, seed=0))
        alone, shared = [], []
        for _ in range(args.runs):  # alternating: one process alone, then --procs together
            alone.append(_together(root, 1))
            shared.append(_together(root, args.procs))
    result = {
        "images": args.images,
        "procs": args.procs,
        "alone_s": statistics.median(r["wall"] for r in alone),
        "together_s": statistics.median(r["wall"] for r in shared),
        "together_over_alone": statistics.median(s["wall"] / a["wall"] for a, s in zip(alone, shared)),
        "index_builds_together": [r["index_builds"] for r in shared],
        "store_builds_together": [r["store_builds"] for r in shared],
    }
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
