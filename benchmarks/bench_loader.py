"""Loader throughput against a tutorial-style baseline, and worker memory over an epoch.

Throughput (images/s for decode + resize to 512x512 + collate, one epoch, best of
``--repeats``), for each ``num_workers`` in ``--workers``, on a synthetic set generated into a
temporary folder and on ../shared/datasets/bccd when it is present:

* **detloader**: ``read_annotations`` (cached index) -> ``DetectionDataset(index,
  Resize((512, 512)))`` -> ``make_loader(..., collate_fn=collate_detection)``; uint8 batches
  with boxes, labels, landmarks, visibility.
* **baseline**, as tutorials write it: a Dataset holding the list of XML files, one
  ``ElementTree.parse`` per item, ``PIL.Image.open(...).convert("RGB")``, PIL resize,
  ``to_tensor`` (float32 / 255), a target dict, and ``collate_fn=lambda b: tuple(zip(*b))``.

Both run in the same process, interleaved, so the ratio holds on a busy machine.

Memory (``--memory``): a ``--memory-images`` synthetic index (default 200,000; images
hard-linked to a pool of 256), one epoch with 2 workers, USS of each worker after its first
batch and at the end of the epoch (psutil). Goal: growth <= 50 MB per worker.

Run: ``python benchmarks/bench_loader.py`` (add ``--memory`` for the memory check).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch
from PIL import Image
from torch.utils.data import DataLoader, Dataset

from detloader import DetectionDataset, make_loader, read_annotations
from detloader.synth import make_synthetic
from detloader.transforms import Resize

BCCD = Path(__file__).resolve().parents[2] / "shared" / "datasets" / "bccd"
SIZE = 512


# -- the tutorial-style baseline -------------------------------------------------------------
def to_tensor(pic: Image.Image) -> torch.Tensor:
    """torchvision.transforms.functional.to_tensor for an RGB PIL image."""
    img = torch.from_numpy(np.array(pic, np.uint8, copy=True))
    img = img.view(pic.size[1], pic.size[0], 3).permute((2, 0, 1)).contiguous()
    return img.to(dtype=torch.float32).div(255)


class TutorialDataset(Dataset):  # type: ignore[type-arg]
    """What a detection tutorial writes: XML parsed per item, PIL, float tensors, dicts."""

    def __init__(self, root: Path, classes: list[str], size: int = SIZE) -> None:
        self.root = root
        self.xml_files = sorted((root / "Annotations").glob("*.xml"))
        self.class_to_id = {c: i for i, c in enumerate(classes)}
        self.size = size

    def __len__(self) -> int:
        return len(self.xml_files)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        tree = ET.parse(self.xml_files[i])
        ann = tree.getroot()
        filename = ann.find("filename").text  # type: ignore[union-attr]
        img = Image.open(self.root / "JPEGImages" / filename).convert("RGB")  # type: ignore[operator]
        w, h = img.size
        boxes, labels = [], []
        for obj in ann.findall("object"):
            bb = obj.find("bndbox")
            box = [float(bb.find(k).text) for k in ("xmin", "ymin", "xmax", "ymax")]  # type: ignore[union-attr]
            boxes.append(box)
            labels.append(self.class_to_id[obj.find("name").text])  # type: ignore[union-attr, index]
        img = img.resize((self.size, self.size), Image.BILINEAR)
        scale = torch.tensor([self.size / w, self.size / h] * 2)
        target = {
            "boxes": torch.tensor(boxes, dtype=torch.float32).reshape(-1, 4) * scale,
            "labels": torch.tensor(labels, dtype=torch.int64),
        }
        return to_tensor(img), target


def tutorial_collate(batch: list[Any]) -> tuple[Any, ...]:
    return tuple(zip(*batch))


# -- measurement -----------------------------------------------------------------------------
def images_per_second(loader: DataLoader, count: Callable[[Any], int]) -> float:  # type: ignore[type-arg]
    start = time.perf_counter()
    n = 0
    for batch in loader:
        n += count(batch)
    return n / (time.perf_counter() - start)


def throughput(root: Path, name: str, workers: list[int], batch_size: int, repeats: int) -> list[dict[str, Any]]:
    t = time.perf_counter()
    index = read_annotations(root, cache="rebuild", on_error="skip")  # bccd has 2 empty boxes
    cold = time.perf_counter() - t
    t = time.perf_counter()
    index = read_annotations(root, on_error="skip")
    warm = time.perf_counter() - t
    print(f"\n{name}: {len(index)} images, index cold {cold:.2f} s, warm {warm * 1000:.1f} ms")
    ours = DetectionDataset(index, Resize((SIZE, SIZE)), seed=0)
    base = TutorialDataset(root, list(index.classes))
    rows = []
    print(f"{'workers':>7} {'detloader img/s':>16} {'baseline img/s':>15} {'ratio':>6}")
    for nw in workers:
        best_ours = best_base = 0.0
        for _ in range(repeats):
            extra = {"prefetch_factor": 2} if nw else {}
            fast = make_loader(ours, batch_size=batch_size, num_workers=nw, **extra)
            best_ours = max(best_ours, images_per_second(fast, len))
            del fast
            slow = DataLoader(base, batch_size=batch_size, num_workers=nw, collate_fn=tutorial_collate)
            best_base = max(best_base, images_per_second(slow, lambda b: len(b[0])))
            del slow
            gc.collect()
        ratio = best_ours / best_base
        rows.append({"dataset": name, "workers": nw, "detloader": best_ours, "baseline": best_base, "ratio": ratio})
        print(f"{nw:>7} {best_ours:>16.0f} {best_base:>15.0f} {ratio:>5.2f}x")
    return rows


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
    p.add_argument("--images", type=int, default=400, help="synthetic images for throughput (default 400)")
    p.add_argument("--workers", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--repeats", type=int, default=2, help="runs per setting, best kept")
    p.add_argument("--no-bccd", action="store_true", help="skip ../shared/datasets/bccd")
    p.add_argument("--memory", action="store_true", help="also run the worker-memory check")
    p.add_argument("--memory-images", type=int, default=200_000)
    p.add_argument("--json", type=Path, help="write the figures here")
    args = p.parse_args(argv)

    torch.set_num_threads(1)  # the main process of a 2-core box; workers set 1 themselves
    print(f"torch {torch.__version__}, {os.cpu_count()} CPUs, batch {args.batch_size}, resize {SIZE}x{SIZE}")
    results: dict[str, Any] = {"throughput": []}
    with tempfile.TemporaryDirectory() as tmp:
        # index caches go to the temporary folder: none left behind, none beside shared data
        os.environ["DETLOADER_CACHE_DIR"] = str(Path(tmp) / "cache")
        root = make_synthetic(Path(tmp) / "synth", args.images, seed=0)
        results["throughput"] += throughput(root, "synthetic 320x240", args.workers, args.batch_size, args.repeats)
        if BCCD.is_dir() and not args.no_bccd:
            results["throughput"] += throughput(BCCD, "bccd 640x480", args.workers, args.batch_size, args.repeats)
        else:
            print("\nbccd: skipped (../shared/datasets/bccd absent)")
        if args.memory:
            results["memory"] = memory(args.memory_images, args.batch_size)
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
