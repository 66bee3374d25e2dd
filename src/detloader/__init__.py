"""detloader: annotations to a tuned, class-balanced PyTorch DataLoader.

The pipeline, one stage per folder, data flowing one way: ``annotations`` (read_annotations:
files -> a validated, cached :class:`AnnotationIndex`) -> ``images`` (decode) ->
``transforms`` -> ``dataset`` (:class:`DetectionDataset`) -> ``balance`` (weights, samplers)
-> ``loader`` (the collate's :class:`Batch`, :func:`make_loader`: a real DataLoader, resume);
``tune``, ``stats``, ``train``, ``adapters`` and the CLI only read the stages. See
docs/architecture.md.

The torch-side names load on first use, so that ``import detloader`` (and the CLI) stays
quick for work that needs no torch; they are listed in ``__all__`` and ``dir()`` all the same.
"""

import importlib.abc
import importlib.machinery
import sys
from types import ModuleType
from typing import TYPE_CHECKING

from detloader._system import VERSION
from detloader.annotations import (
    FACE5,
    MISSING,
    AnnotationError,
    AnnotationIndex,
    AnnotationWarning,
    ClassMapError,
    ImageView,
    LandmarkSchema,
    Problem,
    ProblemReport,
    available_formats,
    detect_format,
    read_annotations,
)
from detloader.annotations.splits import make_splits
from detloader.errors import (
    CacheError,
    CheckpointError,
    DetloaderError,
    DetloaderWarning,
    ImageDecodeError,
    LoaderWorkerError,
    PackError,
    StreamError,
    TuneWarning,
)

__version__ = VERSION

# name -> the module that defines it (torch: imported on first use, keeps the CLI fast)
_LAZY = {
    "DetectionDataset": "detloader.dataset",
    "Sample": "detloader.dataset",
    "Batch": "detloader.loader.collate",
    "collate_detection": "detloader.loader.collate",
    "make_loader": "detloader.loader",
    "set_epoch": "detloader.loader",
    "ResumableLoader": "detloader.loader.resume",
    "sample_weights": "detloader.balance.weights",
    "WeightedSampler": "detloader.balance.weighted",
    "RepeatFactorSampler": "detloader.balance.weighted",
    "ClassAwareSampler": "detloader.balance.class_aware",
    "BalancedBatchSampler": "detloader.balance.class_aware",
    "DistributedSamplerWrapper": "detloader.balance.wrappers",
    "make_balanced_sampler": "detloader.balance.weighted",
    "TuneResult": "detloader.tune.result",
    "tune_loader": "detloader.tune.tuner",
    "balance_report": "detloader.stats",
    "dataset_stats": "detloader.stats",
}

if TYPE_CHECKING:  # what IDEs and type checkers see; at run time __getattr__ loads these
    from detloader.balance.class_aware import BalancedBatchSampler, ClassAwareSampler
    from detloader.balance.weighted import RepeatFactorSampler, WeightedSampler, make_balanced_sampler
    from detloader.balance.weights import sample_weights
    from detloader.balance.wrappers import DistributedSamplerWrapper
    from detloader.dataset import DetectionDataset, Sample
    from detloader.loader import make_loader, set_epoch
    from detloader.loader.collate import Batch, collate_detection
    from detloader.loader.resume import ResumableLoader
    from detloader.stats import balance_report, dataset_stats
    from detloader.tune.result import TuneResult
    from detloader.tune.tuner import tune_loader


# Public module paths whose code lives inside a stage's package: ``import detloader.lightning``
# gives detloader.adapters.lightning itself (the same module object, so a patch or an isinstance
# check sees one module). A path's submodules follow it (detloader.bench.run).
_MODULE_PATHS = {
    "detloader.collate": "detloader.loader.collate",
    "detloader.resume": "detloader.loader.resume",
    "detloader.load_ahead": "detloader.loader.workers",
    "detloader.worker_failures": "detloader.loader.workers",
    "detloader.store": "detloader.dataset.store",
    "detloader.sample": "detloader.dataset.sample",
    "detloader.synth": "detloader.annotations.synth",
    "detloader.validate_images": "detloader.annotations.image_checks",
    "detloader.show": "detloader.stats.show",
    "detloader.bench": "detloader.tune.bench",
    "detloader.lightning": "detloader.adapters.lightning",
    "detloader.ultralytics": "detloader.adapters.ultralytics",
    "detloader.transformers": "detloader.adapters.transformers",
}


class _PublicPaths(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Finds the modules of :data:`_MODULE_PATHS`, before the path finder would load a second copy
    of a submodule through the package's ``__path__``."""

    @staticmethod
    def target(name: str) -> str | None:
        head, tail = name, ""
        while head not in _MODULE_PATHS:
            head, dot, last = head.rpartition(".")
            if not dot:
                return None
            tail = f".{last}{tail}"
        return _MODULE_PATHS[head] + tail

    def find_spec(self, name: str, path: object = None, target: object = None) -> importlib.machinery.ModuleSpec | None:
        if not name.startswith("detloader.") or self.target(name) is None:
            return None
        return importlib.machinery.ModuleSpec(name, self)

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        return importlib.import_module(self.target(spec.name) or spec.name)

    def exec_module(self, module: ModuleType) -> None:
        """The module ran when it was imported under its own name."""


if not any(isinstance(f, _PublicPaths) for f in sys.meta_path):
    sys.meta_path.insert(0, _PublicPaths())


def __getattr__(name: str) -> object:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'detloader' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # later look-ups skip __getattr__
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))


__all__ = [
    # annotations
    "read_annotations", "available_formats", "detect_format", "make_splits", "AnnotationIndex",
    "ImageView", "LandmarkSchema", "FACE5", "MISSING", "Problem", "ProblemReport",
    # dataset, balance, collate, loader
    "DetectionDataset", "Sample", "sample_weights", "WeightedSampler", "RepeatFactorSampler",
    "ClassAwareSampler", "BalancedBatchSampler", "DistributedSamplerWrapper",
    "make_balanced_sampler", "Batch", "collate_detection", "make_loader", "set_epoch",
    "ResumableLoader",
    # tune, stats
    "tune_loader", "TuneResult", "balance_report", "dataset_stats",
    # errors and warnings
    "DetloaderError", "DetloaderWarning", "AnnotationError", "ClassMapError", "CacheError",
    "ImageDecodeError", "LoaderWorkerError", "CheckpointError", "AnnotationWarning", "TuneWarning",
    "PackError", "StreamError",
]
