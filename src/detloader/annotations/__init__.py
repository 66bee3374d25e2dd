"""Stage 1, annotations: files on disk -> a validated, cached :class:`AnnotationIndex`.

``readers/`` (one module per format) -> ``builder`` (per-file rules, typed columns) ->
``parse`` (files in parallel, merged in order) -> ``index`` (flat arrays) -> ``cache`` (one
memory-mapped file); ``problems`` holds the error policy and report; ``writers`` turns an index
back into VOC, COCO or YOLO.
"""

from detloader.annotations.index import MISSING, AnnotationIndex, ImageView
from detloader.annotations.landmarks import FACE5, LandmarkSchema
from detloader.annotations.problems import AnnotationError, AnnotationWarning, Problem, ProblemReport
from detloader.annotations.read import available_formats, detect_format, read_annotations

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
