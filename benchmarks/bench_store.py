"""The image store's build, read and verify times (issue 31: checksums must keep its speed).

``python benchmarks/bench_store.py DATASET [--rounds 7]`` builds a ``cache="disk"`` store of
DATASET at 384x384 in a fresh cache folder, then reads every stored image through
``dataset[i]`` ``--rounds`` times (median, min and max images/s) and times
``ImageStore.verify`` (every image's CRC-32). Run it with ``PYTHONPATH`` set to each tree's
``src`` in turn, interleaved, to compare two versions (docs/benchmarks.md).
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
import warnings


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("dataset")
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()
    warnings.simplefilter("ignore")
    os.environ["DETLOADER_CACHE_DIR"] = tempfile.mkdtemp(prefix="bench-store-")
    from detloader import read_annotations
    from detloader.dataset import DetectionDataset
    from detloader.transforms import Resize

    index = read_annotations(args.dataset, on_error="skip")
    start = time.perf_counter()
    dataset = DetectionDataset(index, Resize((384, 384)), cache="disk")
    build = time.perf_counter() - start
    rates = []
    for _ in range(args.rounds):
        start = time.perf_counter()
        for i in range(len(dataset)):
            dataset[i]
        rates.append(len(dataset) / (time.perf_counter() - start))
    rates.sort()
    median = rates[len(rates) // 2]
    line = f"build {build:.2f} s; read median {median:.0f} img/s (min {rates[0]:.0f}, max {rates[-1]:.0f})"
    store = dataset.store
    if hasattr(store, "verify"):
        start = time.perf_counter()
        bad = store.verify()
        line += f"; verify {time.perf_counter() - start:.2f} s ({len(bad)} damaged)"
    print(line)


if __name__ == "__main__":
    main()
