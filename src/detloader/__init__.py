"""detloader: annotations to a tuned, class-balanced PyTorch DataLoader.

The pipeline, one stage per folder, data flowing one way: ``annotations`` (read_annotations:
files -> a validated, cached :class:`AnnotationIndex`) -> ``images`` (decode) ->
``transforms`` -> ``dataset`` (:class:`DetectionDataset`) -> ``balance`` (weights, samplers)
-> ``collate`` (:class:`Batch`) -> ``loader`` (:func:`make_loader`, a real DataLoader);
``tune``, ``stats``, ``train`` and the CLI only read the stages. See docs/architecture.md.

The torch-side names load on first use, so that ``import detloader`` (and the CLI) stays
quick for work that needs no torch; they are listed in ``__all__`` and ``dir()`` all the same.
"""

from typing import TYPE_CHECKING

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
    TuneWarning,
)

__version__ = "0.1.0"

# name -> the module that defines it (torch: imported on first use, keeps the CLI fast)
_LAZY = {
    "DetectionDataset": "detloader.dataset",
    "Sample": "detloader.dataset",
    "Batch": "detloader.collate",
    "collate_detection": "detloader.collate",
    "make_loader": "detloader.loader",
    "set_epoch": "detloader.loader",
    "ResumableLoader": "detloader.resume",
    "sample_weights": "detloader.balance.weights",
    "WeightedSampler": "detloader.balance.weighted",
    "RepeatFactorSampler": "detloader.balance.weighted",
    "ClassAwareSampler": "detloader.balance.class_aware",
    "BalancedBatchSampler": "detloader.balance.class_aware",
    "DistributedSamplerWrapper": "detloader.balance.wrapper",
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
    from detloader.balance.wrapper import DistributedSamplerWrapper
    from detloader.collate import Batch, collate_detection
    from detloader.dataset import DetectionDataset, Sample
    from detloader.loader import make_loader, set_epoch
    from detloader.resume import ResumableLoader
    from detloader.stats import balance_report, dataset_stats
    from detloader.tune.result import TuneResult
    from detloader.tune.tuner import tune_loader


def __getattr__(name: str) -> object:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'detloader' has no attribute {name!r}")
    import importlib

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
]
