"""What an epoch downloads from packed shards: the shard-local order against a random order of
the same draw, as a multiple of the pack's bytes.

For each size (default 1k, 10k and 100k images) an LVIS-shaped index built from arrays (no
images; ``bench_scale_stats.lvis_like``), images of log-normal sizes (median 150 KB), packed in
row order into shards of at most ``--shard-mb`` (a new shard starts where the next image would
take it over, as a streaming writer's size limit does). One epoch of ``balance="sqrt"`` (the
sampler ``make_balanced_sampler`` builds, seed 0) is read through an LRU cache of a quarter of
the pack (:func:`detloader.balance.shard_order.downloaded_bytes`):

* ``random``       the sampler's own order (what a map-style loader reads);
* ``shard-local``  :class:`~detloader.balance.shard_order.ShardLocalSampler` over it;
* ``4 nodes``      the same with ``world_size=4``, each rank on a node with its own cache of a
                   quarter of the pack: the sum of the four nodes' downloads;
* ``order s``      seconds to compute the shard-local order of the epoch (one rank).

    python benchmarks/bench_shard_order.py
    python benchmarks/bench_shard_order.py --images 1000 10000 100000 --shard-mb 8 64
"""

from __future__ import annotations

import argparse
import sys
import time
import warnings
from pathlib import Path

import numpy as np

from detloader.balance import make_balanced_sampler
from detloader.balance.shard_order import ShardLocalSampler, _windows, downloaded_bytes
from detloader.errors import DetloaderWarning

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the index of bench_scale_stats, also when loaded by path
from bench_scale_stats import lvis_like  # noqa: E402


def pack_layout(num_images: int, shard_bytes: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """``(shard_of, bytes per shard)`` of ``num_images`` images of log-normal sizes (median
    150 KB, 20 KB - 2 MB) written in row order into shards of at most ``shard_bytes``."""
    sizes = np.random.default_rng(seed).lognormal(np.log(150_000), 0.6, num_images).clip(20_000, 2_000_000)
    sizes = sizes.astype(np.int64)
    shard_of = _windows(sizes, shard_bytes)  # the same greedy cut as the sampler's windows
    return shard_of, np.bincount(shard_of, weights=sizes).astype(np.int64)


def run(num_images: int, shard_mb: float) -> tuple[object, ...]:
    index = lvis_like(num_images)
    shard_of, shard_bytes = pack_layout(num_images, int(shard_mb * 2**20))
    pack = int(shard_bytes.sum())
    cache = pack // 4
    inner = make_balanced_sampler(index, "sqrt", seed=0, rank=0, world_size=1)
    inner.set_epoch(0)
    random_order = inner.indices()
    local = ShardLocalSampler(inner, shard_of, shard_bytes, cache, seed=0)
    start = time.perf_counter()
    local.set_epoch(0)
    order = local.indices()
    seconds = time.perf_counter() - start
    assert sorted(order.tolist()) == sorted(random_order.tolist())
    nodes = 0
    for r in range(4):
        rank = ShardLocalSampler(inner, shard_of, shard_bytes, cache, seed=0, rank=r, world_size=4)
        rank.set_epoch(0)
        nodes += downloaded_bytes(shard_of[rank.indices()], shard_bytes, cache)
    ours = downloaded_bytes(shard_of[order], shard_bytes, cache)
    theirs = downloaded_bytes(shard_of[random_order], shard_bytes, cache)
    big = "*" if int(shard_bytes.max()) > cache else ""
    return (num_images, shard_mb, len(shard_bytes), pack / 2**20, cache / 2**20, theirs / pack, ours / pack,
            nodes / pack, seconds, big)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--images", type=float, nargs="+", default=[1e3, 1e4, 1e5])
    parser.add_argument("--shard-mb", type=float, nargs="+", default=[8.0, 64.0])
    args = parser.parse_args(argv)
    print("balance sqrt, one epoch, LRU cache = 1/4 of the pack; downloads / pack bytes")
    print(f"{'images':>8} {'shard MB':>8} {'shards':>6} {'pack MB':>8} {'cache MB':>8} "
          f"{'random':>7} {'shard-local':>11} {'4 nodes':>7} {'order s':>7}")
    big = False
    for n in args.images:
        for mb in args.shard_mb:
            with warnings.catch_warnings():  # shards over the cache: the row is marked instead
                warnings.simplefilter("ignore", DetloaderWarning)
                row = run(int(n), mb)
            big = big or bool(row[-1])
            print("{:>8,} {:>8g} {:>6} {:>8.0f} {:>8.0f} {:>6.2f}x {:>10.2f}x {:>6.2f}x {:>7.3f} {}".format(*row))
    if big:
        print("* some shards are larger than the cache: each is downloaded whenever it is read")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
