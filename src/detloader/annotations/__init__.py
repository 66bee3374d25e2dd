"""Stage 1, annotations: files on disk -> a validated, cached :class:`AnnotationIndex`.

``readers/`` (one module per format) -> ``checks`` (the shared rules, pure) -> ``builder``
(per-file typed columns -> ``chunk.Partial``) -> ``parse`` (files in parallel) -> ``merge`` (in
file order, global vocabularies) -> ``index`` (flat arrays laid out by ``fields``, names in
``vocabulary``, per-image ``view``, ratio ``splits``) -> ``cache`` (one memory-mapped file); ``problems`` holds the
error policy and report; ``landmarks`` the landmark schemas; ``writers`` turns an index back
into VOC, COCO or YOLO.
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
