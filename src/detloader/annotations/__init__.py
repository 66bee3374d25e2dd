"""Stage 1, annotations: files on disk -> a validated, cached :class:`AnnotationIndex`.

``readers/`` (one ``Reader`` per format) -> ``checks`` (the shared rules, pure; ``ReadOptions``)
-> ``builder`` (per-file typed columns -> ``Partial``) -> ``parse`` (files in parallel, merged in
file order with global vocabularies) -> ``index`` (flat arrays laid out by ``fields``, per-image
``view``, ``splits``) -> ``cache`` (one memory-mapped file, built once per node); ``read`` is the
entry point; ``problems`` holds the error policy and report; ``landmarks`` the landmark schemas;
``writers`` turns an index back into VOC, COCO or YOLO.
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
