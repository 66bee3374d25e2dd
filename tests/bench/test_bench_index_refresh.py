"""benchmarks/bench_index_refresh.py runs end to end on a tiny dataset: every refresh parses only the
file that changed (none for a removal), the warm read none."""

from __future__ import annotations

from helpers import load_benchmark


def _load():
    return load_benchmark("bench_index_refresh")


def test_bench_prints_each_step_as_a_ratio_and_refreshes_one_file(capsys):
    assert _load().main(["--files", "40", "--rounds", "1"]) == 0
    rows = [line.split() for line in capsys.readouterr().out.splitlines()[1:]]
    assert [row[0] for row in rows] == ["full", "edit", "add", "remove", "warm"]
    assert rows[0][3] == "1.000x" and all(float(row[3].rstrip("x")) > 0 for row in rows)
    assert [row[-1] for row in rows[1:4]] == ["[1]", "[1]", "[0]"]
