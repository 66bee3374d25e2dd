"""The untuned ``num_workers="auto"`` default against the best of a small grid, in one run.

    python benchmarks/bench_auto_default.py ../shared/datasets/bccd --size 384 --batch-size 16
    python benchmarks/bench_auto_default.py ../shared/datasets/bccd --torch-threads 1

Settings: ``num_workers`` 0..2 x ``decode_threads`` 0/2, and the default
``make_loader(num_workers="auto")`` picks with no tuning result (its reason is printed). Each
round times one epoch of every setting (batches after the first; worker start-up is not
counted), in turn; ``--rounds`` rounds, a setting's figure is its best epoch (other processes
can only slow an epoch down). Prints images/s per setting, the ratio default / best, and the
machine's load before and after. ``--torch-threads N``: torch's intra-op threads in this (the
training) process, which loads the batches with ``num_workers=0`` (default: torch's own).
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
import warnings

from detloader import read_annotations
from detloader.dataset import DetectionDataset
from detloader.loader import make_loader
from detloader.transforms import Resize
from detloader.tune import auto_loader_kwargs


def epoch_rate(dataset: DetectionDataset, batch_size: int, **settings: int) -> float:
    loader = iter(make_loader(dataset, batch_size=batch_size, shuffle=True, seed=0, **settings))
    next(loader)  # start-up
    t0, images = time.perf_counter(), 0
    for batch in loader:
        images += len(batch)
    return images / (time.perf_counter() - t0)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("root")
    p.add_argument("--size", type=int, default=384)
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--torch-threads", type=int)
    args = p.parse_args()
    if args.torch_threads:
        import torch

        torch.set_num_threads(args.torch_threads)
    os.environ["DETLOADER_CACHE_DIR"] = tempfile.mkdtemp()  # no stored tuning result
    index = read_annotations(args.root, on_error="skip")
    dataset = DetectionDataset(index, Resize(args.size, mode="letterbox"), seed=0)
    import torch

    print(f"load before: {os.getloadavg()}; torch threads in this process: {torch.get_num_threads()}")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        auto, reason = auto_loader_kwargs(dataset, args.batch_size, decode_threads=True)
    print(f"default: {reason}")
    grid = {(w, t): {"num_workers": w, "decode_threads": t} for w in (0, 1, 2) for t in (0, 2)}
    default = (auto["num_workers"], auto["decode_threads"])
    grid.setdefault(default, {"num_workers": default[0], "decode_threads": default[1]})
    best: dict[tuple[int, int], float] = {}
    for _ in range(args.rounds):
        for key, settings in grid.items():
            best[key] = max(best.get(key, 0.0), epoch_rate(dataset, args.batch_size, **settings))
    for (w, t), rate in sorted(best.items()):
        mark = "  <- default" if (w, t) == default else ""
        print(f"num_workers={w} decode_threads={t}: {rate:.0f} img/s{mark}")
    top = max(best.values())
    print(f"default / best: {best[default] / top:.2f} ({best[default]:.0f} / {top:.0f} img/s)")
    print(f"load after: {os.getloadavg()}")


if __name__ == "__main__":
    main()
