"""Write an :class:`~detloader.annotations.index.AnnotationIndex` as Pascal VOC, COCO JSON or YOLO.

``write_annotations(index, out, "voc" | "coco" | "yolo")`` (``detloader convert``) writes a new
dataset folder that reads back as the same index, as far as the target holds it. Layouts, image
placement and number precision: docs/formats.md ("Writing").
"""

from detloader.annotations.writers.coco import write_coco
from detloader.annotations.writers.common import IMAGE_MODES
from detloader.annotations.writers.export import EXPORT_FORMATS, write_annotations
from detloader.annotations.writers.voc import write_voc
from detloader.annotations.writers.yolo import YoloExportWarning, write_yolo

__all__ = [
    "EXPORT_FORMATS", "IMAGE_MODES", "YoloExportWarning", "write_annotations", "write_coco", "write_voc", "write_yolo"
]
