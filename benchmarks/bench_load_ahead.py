"""The load-ahead of make_loader's ``num_workers=0`` loader against a plain DataLoader with the
same dataset and options, with a training step between batches.

The step is a sleep of ``--step-ms`` per batch: the time a GPU step keeps the training loop
waiting with the GIL free. Each setting is timed over one epoch, round-robin, ``--repeats``
times (medians); the ratio is the headline. docs/benchmarks.md, "The load-ahead".

    python benchmarks/bench_load_ahead.py ../shared/datasets/bccd --step-ms 0 10 20 40
"""

from __future__ import annotations

import argparse
import statistics
import time
import warnings

import torch
from torch.utils.data import DataLoader

from detloader import DetectionDataset, make_loader, read_annotations
from detloader.transforms import Resize


def _epoch(loader: DataLoader, step_s: float) -> float:
    """Images per second of one epoch, the step slept after every batch."""
    start, n = time.perf_counter(), 0
    for batch in loader:
        n += len(batch)
        time.sleep(step_s)
    return n / (time.perf_counter() - start)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("root", help="an annotation folder detloader reads")
    p.add_argument("--step-ms", nargs="+", type=float, default=[0.0, 10.0, 20.0, 40.0])
    p.add_argument("--size", type=int, default=384)
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--decode-threads", type=int, default=2)
    p.add_argument("--repeats", type=int, default=3)
    args = p.parse_args()
    torch.set_num_threads(1)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        index = read_annotations(args.root, on_error="warn")
    dataset = DetectionDataset(index, Resize((args.size, args.size)), seed=0, decode_threads=args.decode_threads)
    ahead = make_loader(dataset, batch_size=args.batch_size)
    plain = DataLoader(dataset, batch_size=args.batch_size, collate_fn=ahead.collate_fn)
    workers = make_loader(DetectionDataset(index, Resize((args.size, args.size)), seed=0), batch_size=args.batch_size,
                          num_workers=2, persistent_workers=True)
    print(f"{len(index)} images, size {args.size}, batch {args.batch_size}, decode_threads {args.decode_threads}, "
          f"torch {torch.__version__}; img/s, median of {args.repeats} epochs")
    print("| step per batch | plain DataLoader | make_loader (load-ahead) | ratio | num_workers=2 |")
    print("|---|---|---|---|---|")
    for step in args.step_ms:
        runs: dict[str, list[float]] = {"plain": [], "ahead": [], "workers": []}
        for _ in range(args.repeats):
            for name, loader in (("plain", plain), ("ahead", ahead), ("workers", workers)):
                runs[name].append(_epoch(loader, step / 1000))
        m = {name: statistics.median(v) for name, v in runs.items()}
        print(f"| {step:g} ms | {m['plain']:.0f} | {m['ahead']:.0f} | **{m['ahead'] / m['plain']:.2f}x** "
              f"| {m['workers']:.0f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
