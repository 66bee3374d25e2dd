"""Tune the loader for the machine: how many workers, decode threads, pinned memory, prefetch, and why.

Read in this order: ``probe`` (what the machine and the dataset can do), ``measure`` (one
setting, timed on a real loader), ``search`` (which settings to measure), ``explain`` (the
reasons in words, the plot), ``result`` (TuneResult, JSON), ``store`` (stored results per
machine x dataset x transform x batch size, the load re-check and the untuned default: all
that ``make_loader(num_workers="auto")`` reads), ``tuner`` (``tune_loader``: all of it).
"""

from detloader.errors import StaleTuneWarning, TuneWarning
from detloader.tune.measure import Trial
from detloader.tune.probe import DatasetProbe, MachineProbe, probe_dataset, probe_machine
from detloader.tune.result import TuneResult
from detloader.tune.store import auto_loader_kwargs
from detloader.tune.tuner import tune_loader

__all__ = [
    "DatasetProbe", "MachineProbe", "StaleTuneWarning", "Trial", "TuneResult", "TuneWarning",
    "auto_loader_kwargs", "probe_dataset", "probe_machine", "tune_loader",
]
