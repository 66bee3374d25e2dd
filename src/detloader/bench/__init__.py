"""``detloader bench``: one run, every figure a ratio against a baseline measured in that run.

Sections (one module each):

* **loader** (:mod:`~detloader.bench.loader`): the decode ceiling - one core's decode +
  resize rate of the same images times the usable CPUs -
  and the loader's images/s for ``num_workers`` 0..CPUs as a fraction of it; with
  ``decode_threads`` 0 and CPUs at ``num_workers`` 0 and the best; the tutorial and
  torchvision ``VOCDetection`` baselines (:mod:`~detloader.bench.baselines`); pickled bytes
  per batch.
* **index** (:mod:`~detloader.bench.index_speed`): cold build and warm reload against one
  ElementTree parse per file.
* **sampler** (:mod:`~detloader.bench.samplers`): ``WeightedSampler`` against torch's
  ``WeightedRandomSampler``.

:mod:`~detloader.bench.report` holds the result; :func:`run_bench` runs it all.
"""

from detloader.bench.report import BenchReport, Ratio
from detloader.bench.run import BenchSettings, machine_description, run_bench

__all__ = ["BenchReport", "BenchSettings", "Ratio", "machine_description", "run_bench"]
