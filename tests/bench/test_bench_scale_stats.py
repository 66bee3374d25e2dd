"""benchmarks/bench_scale_stats.py runs end to end on a tiny size and prints one row per measure."""

from __future__ import annotations

import numpy as np
from helpers import load_benchmark


def _load():
    return load_benchmark("bench_scale_stats")


def test_lvis_like_is_a_long_tail():
    index = _load().lvis_like(2000, num_classes=200)
    counts = np.bincount(index.labels, minlength=200)
    assert len(index) == 2000 and counts[0] > 100 * np.median(counts) and (counts < 10).sum() > 20


def test_bench_prints_every_measure_as_a_ratio(capsys):
    assert _load().main(["--images", "500", "--runs", "1"]) == 0
    rows = [line.split(" | ") for line in capsys.readouterr().out.splitlines()[2:]]
    assert [row[2] for row in rows] == ["dataset_stats", "balance_report sqrt", "build weighted sqrt",
                                        "build weighted inverse", "build repeat_factor", "build class_aware"]
    assert all(float(row[6]) > 0 for row in rows)


def test_loader_at_scale_prints_a_row_per_size(small_synth_root, capsys):
    """The loader over an index whose images cycle over a folder's JPEGs (a class-aware 2-worker loader)."""
    module = _load()
    index = module.lvis_like(300, num_classes=20, files=sorted((small_synth_root / "JPEGImages").glob("*.jpg")))
    assert index.image_path(25).name == index.image_path(1).name and int(index.width[0]) > 0
    assert module.main(["--images", "200", "--runs", "1", "--loader", str(small_synth_root / "JPEGImages")]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("24 JPEGs of ") and out[1].startswith("| images | first batch s |")
    first, rate, ratio = (float(x.replace(",", "")) for x in out[3].strip("| ").split(" | ")[1:])
    assert out[3].startswith("| 200 |") and first > 0 and rate > 0 and ratio > 0
