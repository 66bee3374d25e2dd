"""Worker memory over an epoch of a large index (loader throughput: ``detloader bench``).

A ``--images`` synthetic index (default 200,000; images hard-linked to a pool of 256), one
epoch with 2 workers, USS of each worker after its first batch and at the end of the epoch
(psutil). Goal: growth <= 50 MB per worker.

Throughput against the decode ceiling and the tutorial / torchvision baselines is
``detloader bench [PATH]`` (``make bench``); this script keeps the long memory check.

Run: ``python benchmarks/bench_loader.py [--images N]``.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from detloader import DetectionDataset, make_loader, read_annotations
from detloader.annotations.synth import make_synthetic
from detloader.transforms import Resize


def _uss(pid: int) -> int:
    import psutil

    return int(psutil.Process(pid).memory_full_info().uss)


def memory(images: int, batch_size: int) -> dict[str, Any]:
    import psutil

    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "big"
        t = time.perf_counter()
        make_synthetic(root, images, seed=0, image_pool=min(256, images))
        made = time.perf_counter() - t
        t = time.perf_counter()
        index = read_annotations(root)
        built = time.perf_counter() - t
        print(f"\nmemory: {images} images (synthesised {made:.0f} s, indexed {built:.0f} s)")
        mapped = sum(index.nbytes().values())
        dataset = DetectionDataset(index, Resize((64, 64)), seed=0)
        loader = make_loader(dataset, batch_size=batch_size, num_workers=2)
        first: dict[int, int] = {}
        last: dict[int, int] = {}
        peak: dict[int, int] = {}

        def sample(pids: list[int]) -> None:
            for pid in pids:
                try:
                    uss = _uss(pid)
                except psutil.Error:
                    continue
                first.setdefault(pid, uss)
                last[pid] = uss
                peak[pid] = max(peak.get(pid, 0), uss)

        t = time.perf_counter()
        seen = 0
        it = iter(loader)
        pids = [w.pid for w in it._workers]  # type: ignore[attr-defined]  (the DataLoader's workers)
        total = len(loader)
        for step, batch in enumerate(it):
            seen += len(batch)
            # first figure once both workers delivered a batch; last one just before the end
            if step == 3 or (step > 3 and step % 500 == 0) or step == total - 3:
                sample(pids)
        elapsed = time.perf_counter() - t
        del it
        growth = {pid: (last[pid] - first[pid]) / 2**20 for pid in first if pid in last}
        result = {
            "images": images,
            "index_mapped_mb": mapped / 2**20,
            "epoch_s": elapsed,
            "images_per_s": seen / elapsed,
            "uss_first_mb": [first[p] / 2**20 for p in growth],
            "uss_last_mb": [last[p] / 2**20 for p in growth],
            "uss_growth_mb": list(growth.values()),
            "uss_peak_mb": [peak[p] / 2**20 for p in growth],
        }
        print(
            f"index {mapped / 2**20:.0f} MB mapped; epoch {elapsed:.0f} s ({seen / elapsed:.0f} img/s); "
            "USS per worker first -> last (growth): "
            + ", ".join(
                f"{a:.0f} -> {b:.0f} MB ({g:+.1f} MB)"
                for a, b, g in zip(result["uss_first_mb"], result["uss_last_mb"], result["uss_growth_mb"])
            )
        )
        del loader
        return result


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--images", type=int, default=200_000, help="synthetic images (default 200,000)")
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--json", type=Path, help="write the figures here")
    args = p.parse_args(argv)
    result = memory(args.images, args.batch_size)
    if args.json:
        args.json.write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
