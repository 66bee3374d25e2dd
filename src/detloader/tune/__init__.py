"""Tune the loader for the machine: how many workers, pinned memory, prefetch, and why.

Read in this order: ``probe`` (what the machine and the dataset can do), ``measure`` (one
setting, timed on a real loader), ``search`` (which settings to measure), ``explain`` (the
reasons in plain language), ``result`` (TuneResult, JSON), ``store`` (the per machine x
dataset x transform x batch size cache), ``heuristic`` (settings without measuring),
``tuner`` (``tune_loader``: all of it), ``plot``.
"""

from detloader.tune.heuristic import TuneWarning, auto_loader_kwargs, heuristic_loader_kwargs
from detloader.tune.measure import Trial, loader_kwargs, measure_setting
from detloader.tune.probe import DatasetProbe, MachineProbe, probe_dataset, probe_machine
from detloader.tune.result import TuneResult
from detloader.tune.search import SearchOutcome, choose, search_settings, worker_ladder
from detloader.tune.tuner import grid_candidates, tune_loader

__all__ = [
    "DatasetProbe",
    "MachineProbe",
    "SearchOutcome",
    "Trial",
    "TuneResult",
    "TuneWarning",
    "auto_loader_kwargs",
    "choose",
    "grid_candidates",
    "heuristic_loader_kwargs",
    "loader_kwargs",
    "measure_setting",
    "probe_dataset",
    "probe_machine",
    "search_settings",
    "tune_loader",
    "worker_ladder",
]
