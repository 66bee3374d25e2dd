"""detloader: annotations to a tuned, class-balanced PyTorch DataLoader.

Pipeline: ``read_annotations`` (formats/, validate, index, cache) -> ``DetectionDataset`` ->
balanced sampler -> ``collate_detection`` -> ``make_loader``.
"""

from detloader.formats import available_formats, detect_format, read_annotations
from detloader.index import FACE5, MISSING, AnnotationIndex, ImageView, LandmarkSchema
from detloader.validate import AnnotationError, AnnotationWarning, Problem, ProblemReport

__version__ = "0.1.0"

__all__ = [
    "FACE5",
    "MISSING",
    "AnnotationError",
    "AnnotationIndex",
    "AnnotationWarning",
    "ImageView",
    "LandmarkSchema",
    "Problem",
    "ProblemReport",
    "available_formats",
    "detect_format",
    "read_annotations",
]
