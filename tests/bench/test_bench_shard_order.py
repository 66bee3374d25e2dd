"""benchmarks/bench_shard_order.py runs end to end on tiny sizes: one row per size and shard size."""

from __future__ import annotations

import numpy as np
from helpers import load_benchmark


def test_pack_layout_cuts_shards_at_the_size():
    shard_of, shard_bytes = load_benchmark("bench_shard_order").pack_layout(3000, 8 * 2**20)
    assert (np.diff(shard_of) >= 0).all() and len(shard_bytes) == shard_of[-1] + 1
    limit = 8 * 2**20
    assert (shard_bytes <= limit).all() and (shard_bytes[:-1] > limit - 2_000_000).all()  # full up to one image


def test_bench_prints_a_row_per_size(capsys):
    assert load_benchmark("bench_shard_order").main(["--images", "400", "2000", "--shard-mb", "4"]) == 0
    rows = [line.split() for line in capsys.readouterr().out.splitlines()[2:4]]
    assert [row[0] for row in rows] == ["400", "2,000"]
    for row in rows:
        random_ratio, local_ratio = float(row[5].rstrip("x")), float(row[6].rstrip("x"))
        assert local_ratio <= 1.5 < random_ratio
