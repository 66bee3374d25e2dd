"""Stage 1, annotations: files on disk -> a validated, cached :class:`AnnotationIndex`.

``read`` is the entry point; the modules and the path of one record through them:
docs/architecture.md.
"""

from detloader.annotations.index import MISSING, AnnotationIndex
from detloader.annotations.landmarks import FACE5, LandmarkSchema
from detloader.annotations.problems import AnnotationError, AnnotationWarning, Problem, ProblemReport
from detloader.annotations.read import available_formats, detect_format, read_annotations
from detloader.annotations.view import ImageView
from detloader.errors import ClassMapError

__all__ = [
    "FACE5", "MISSING", "AnnotationError", "AnnotationIndex", "AnnotationWarning", "ClassMapError",
    "ImageView", "LandmarkSchema", "Problem", "ProblemReport", "available_formats", "detect_format",
    "read_annotations",
]
