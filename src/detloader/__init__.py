"""detloader: annotations to a tuned, class-balanced PyTorch DataLoader.

Pipeline: ``read_annotations`` (formats/, validate, index, cache) -> ``DetectionDataset`` ->
balanced sampler -> ``collate_detection`` -> ``make_loader``.
"""

from detloader.annotations import (
    FACE5,
    MISSING,
    AnnotationError,
    AnnotationIndex,
    AnnotationWarning,
    ImageView,
    LandmarkSchema,
    Problem,
    ProblemReport,
    available_formats,
    detect_format,
    read_annotations,
)

__version__ = "0.1.0"

# The torch-side stages load on first use, so that `import detloader` (and the CLI) stays
# quick for work that needs no torch: name -> module.
_LAZY = {
    "Batch": "detloader.collate",
    "DetectionDataset": "detloader.dataset",
    "Sample": "detloader.dataset",
    "collate_detection": "detloader.collate",
    "make_loader": "detloader.loader",
    "set_epoch": "detloader.loader",
    "TuneResult": "detloader.tune",
    "auto_loader_kwargs": "detloader.tune",
    "tune_loader": "detloader.tune",
    "sample_weights": "detloader.balance.weights",
    "WeightedSampler": "detloader.balance.weighted",
    "RepeatFactorSampler": "detloader.balance.repeat_factor",
    "ClassAwareSampler": "detloader.balance.class_aware",
    "BalancedBatchSampler": "detloader.balance.batch",
    "DistributedSamplerWrapper": "detloader.balance.wrapper",
    "make_balanced_sampler": "detloader.balance.factory",
    "ResumableLoader": "detloader.resume",
    "balance_report": "detloader.stats",
    "dataset_stats": "detloader.stats",
}


def __getattr__(name: str) -> object:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'detloader' has no attribute {name!r}")

__all__ = [
    "FACE5",
    "MISSING",
    "AnnotationError",
    "AnnotationIndex",
    "AnnotationWarning",
    "Batch",
    "DetectionDataset",
    "ImageView",
    "LandmarkSchema",
    "Problem",
    "ProblemReport",
    "Sample",
    "TuneResult",
    "auto_loader_kwargs",
    "available_formats",
    "collate_detection",
    "detect_format",
    "make_loader",
    "read_annotations",
    "set_epoch",
    "tune_loader",
    "sample_weights",
    "WeightedSampler",
    "RepeatFactorSampler",
    "ClassAwareSampler",
    "BalancedBatchSampler",
    "DistributedSamplerWrapper",
    "make_balanced_sampler",
    "ResumableLoader",
    "balance_report",
    "dataset_stats",
]
