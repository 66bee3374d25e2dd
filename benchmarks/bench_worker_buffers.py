"""Batches per second out of DataLoader workers when each batch's images take new shared
memory, against the workers' reused buffers (docs/loader.md, "collate_detection and Batch").

The dataset hands out ready samples (no decode), so the figure is the cost of the collate and
the crossing to the main process alone. Rounds alternate between the two (``median_of``), median of
``--runs``; each figure is ``_rate``'s images/s after the first batch, as in ``detloader bench``.

    python benchmarks/bench_worker_buffers.py --size 384 --batch-size 16 --runs 5
"""

from __future__ import annotations

import argparse
import functools

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset

from detloader.tune.bench.loader_speed import _rate, median_of
from detloader.loader.collate import Batch, _WorkerBuffers, collate_detection
from detloader.dataset import Sample


class Ready(Dataset):  # type: ignore[type-arg]
    """``length`` samples sharing one ``size x size`` image and ten boxes."""

    def __init__(self, size: int, length: int) -> None:
        self.image = torch.zeros(3, size, size, dtype=torch.uint8)
        self.length = length

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, i: int) -> Sample:
        n = 10
        return Sample(self.image, np.zeros((n, 4), np.float32), np.zeros(n, np.int64), np.zeros((n, 0, 2), np.float32),
                      np.zeros((n, 0), np.uint8), 0, i, (640, 480), (1.0, 1.0), (0.0, 0.0), np.arange(n))


def no_reuse(worker_id: int) -> None:
    _WorkerBuffers.SLOTS = 0  # every batch takes new shared memory, as before the buffers


def _loader(dataset: Ready, batch_size: int, reuse: bool) -> DataLoader:  # type: ignore[type-arg]
    return DataLoader(dataset, batch_size=batch_size, num_workers=2, collate_fn=collate_detection,
                      worker_init_fn=None if reuse else no_reuse)


def _read(batch: Batch) -> int:
    """The batch's size, after reading every page of its images (as a copy to the device does)."""
    batch.images.view(-1)[::4096].sum()
    return len(batch)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size", type=int, default=384)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--batches", type=int, default=150)
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    torch.set_num_threads(1)
    dataset = Ready(args.size, args.batch_size * (args.batches + 1))
    for count, what in ((len, "the loop only counts"), (_read, "the loop reads the pixels")):
        rates = median_of({name: functools.partial(_rate, functools.partial(_loader, dataset, args.batch_size, reuse),
                                                   count, args.batches)
                           for name, reuse in (("new", False), ("reused", True))}, args.runs)
        print(f"{what}: new memory {rates['new']:,.0f} img/s, reused buffers {rates['reused']:,.0f} img/s, "
              f"ratio {rates['reused'] / rates['new']:.2f}")


if __name__ == "__main__":
    main()
