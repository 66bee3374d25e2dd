"""Batches per second out of DataLoader workers when each batch's images take new shared
memory, against the workers' reused buffers, sent to the main process with every batch (as
before they were sent once) and once (docs/loader.md, "collate_detection and Batch").

The dataset hands out ready samples (no decode), so the figure is the cost of the collate and
the crossing to the main process alone. Rounds alternate between the three (``median_of``), median of
``--runs``; each figure is ``_rate``'s images/s after the first batch, as in ``detloader bench``.

    python benchmarks/bench_worker_buffers.py --size 384 --batch-size 16 --runs 5
"""

from __future__ import annotations

import argparse
import functools

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset

from detloader.dataset import Sample
from detloader.loader.collate import Batch, _WorkerBuffers, collate_detection
from detloader.tune.bench.loader_speed import _rate, median_of


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


def resend(worker_id: int) -> None:
    """Every batch sends its buffer and the flags, whether or not the main process has them."""
    once = _WorkerBuffers.sent

    def sent(self: _WorkerBuffers, i: int, shape: tuple[int, ...]) -> tuple[object, ...]:
        return (*once(self, i, shape)[:4], self.buffers[i], self.flags)

    _WorkerBuffers.sent = sent  # type: ignore[method-assign]


def _loader(dataset: Ready, batch_size: int, init: object) -> DataLoader:  # type: ignore[type-arg]
    return DataLoader(dataset, batch_size=batch_size, num_workers=2, collate_fn=collate_detection,
                      worker_init_fn=init)  # type: ignore[arg-type]


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
    ways = {"new memory": no_reuse, "reused, sent each batch": resend, "reused, sent once": None}
    for count, what in ((len, "the loop only counts"), (_read, "the loop reads the pixels")):
        rates = median_of({name: functools.partial(_rate, functools.partial(_loader, dataset, args.batch_size, init),
                                                   count, args.batches)
                           for name, init in ways.items()}, args.runs)
        each, once = rates["reused, sent each batch"], rates["reused, sent once"]
        figures = ", ".join(f"{name} {rate:,.0f} img/s" for name, rate in rates.items())
        print(f"{what}: {figures}; sent once / each batch {once / each:.2f}, "
              f"sent each batch / new memory {each / rates['new memory']:.2f}")


if __name__ == "__main__":
    main()
