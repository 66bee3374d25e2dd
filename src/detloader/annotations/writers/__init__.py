"""Write an :class:`~detloader.annotations.index.AnnotationIndex` as Pascal VOC, COCO JSON or YOLO.

``write_annotations(index, out, "voc" | "coco" | "yolo")`` (the ``detloader convert``
command) writes a new dataset folder ``out``; reading it back gives the same index (boxes,
classes, landmarks, and whatever else the target format can hold; see each writer). Images
are placed under ``out`` as hard links (``images="link"``, a copy where a link is refused),
copies (``"copy"``) or symbolic links (``"symlink"``), or left where they are and named by a
path relative to the annotation (``"none"``; VOC and COCO only). Their layout below the image
folder mirrors the source images below their common folder, so equal base names in
different folders stay apart.

Numbers are written exactly: a float32 coordinate is written with the fewest digits that read
back to the same float32 (VOC), or as the float64 that holds it (COCO), and YOLO's normalised
values carry full float64 precision.
"""

from detloader.annotations.writers.coco import write_coco
from detloader.annotations.writers.common import IMAGE_MODES
from detloader.annotations.writers.export import EXPORT_FORMATS, write_annotations
from detloader.annotations.writers.voc import write_voc
from detloader.annotations.writers.yolo import YoloExportWarning, write_yolo

__all__ = [
    "EXPORT_FORMATS", "IMAGE_MODES", "YoloExportWarning", "write_annotations", "write_coco",
    "write_voc", "write_yolo",
]
