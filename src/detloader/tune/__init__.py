"""Tune the loader for the machine: how many workers, pinned memory, prefetch, and why.

Read in this order: ``probe`` (what the machine and the dataset can do), ``measure`` (one
setting, timed on a real loader), ``search`` (which settings to measure), ``explain`` (the
reasons in plain language), ``result`` (TuneResult, JSON), ``store`` (the per machine x
dataset x transform x batch size cache), ``heuristic`` (settings without measuring),
``freshness`` (is a cached result still about this load?), ``tuner`` (``tune_loader``: all of it),
``plot``; ``records`` holds their dict round trip.
The search's pieces (``choose``, ``worker_ladder``, ``search_settings``, ``measure_setting``...)
are imported from their modules.
"""

from detloader.tune.heuristic import StaleTuneWarning, TuneWarning, auto_loader_kwargs
from detloader.tune.measure import Trial
from detloader.tune.probe import DatasetProbe, MachineProbe, probe_dataset, probe_machine
from detloader.tune.result import TuneResult
from detloader.tune.tuner import tune_loader

__all__ = [
    "DatasetProbe", "MachineProbe", "StaleTuneWarning", "Trial", "TuneResult", "TuneWarning",
    "auto_loader_kwargs", "probe_dataset", "probe_machine", "tune_loader",
]
