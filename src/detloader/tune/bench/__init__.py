"""``detloader bench``: one run, every figure a ratio against a baseline measured in that run.

One module per section: :mod:`~detloader.bench.loader_speed` (against the decode ceiling and the
baselines of :mod:`~detloader.bench.baselines`), :mod:`~detloader.bench.index_speed` and
:mod:`~detloader.bench.samplers`; :mod:`~detloader.bench.report` holds the result and
:func:`run_bench` runs it all. See docs/benchmarks.md, "What each section measures".
"""

from detloader.tune.bench.report import BenchReport, Ratio
from detloader.tune.bench.run import BenchSettings, machine_description, run_bench

__all__ = ["BenchReport", "BenchSettings", "Ratio", "machine_description", "run_bench"]
