"""Tune the loader for the machine: how many workers, decode threads, pinned memory, prefetch, and why.

Read in this order: ``probe``, ``measure`` (one setting), ``search``, ``explain``, ``result``,
``saved`` (the saved results: all that ``make_loader(num_workers="auto")`` reads), ``tuner``;
``bench`` is ``detloader bench``. See docs/tuning.md.
"""

from detloader.errors import StaleTuneWarning, TuneWarning
from detloader.tune.measure import Trial
from detloader.tune.probe import DatasetProbe, MachineProbe, probe_dataset, probe_machine
from detloader.tune.result import TuneResult
from detloader.tune.saved import auto_loader_kwargs
from detloader.tune.tuner import tune_loader

__all__ = [
    "DatasetProbe", "MachineProbe", "StaleTuneWarning", "Trial", "TuneResult", "TuneWarning",
    "auto_loader_kwargs", "probe_dataset", "probe_machine", "tune_loader",
]
