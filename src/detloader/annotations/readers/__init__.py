"""Annotation readers, one module per format, each a :class:`Reader` (protocol in ``common``)
feeding the same :class:`~detloader.annotations.builder.ChunkBuilder`. A new format is a new
module here plus one line in :data:`READERS`; the other modules serve the format modules
(docs/architecture.md).
"""

from detloader.annotations.readers.coco import CocoReader, LvisReader
from detloader.annotations.readers.common import Reader
from detloader.annotations.readers.cvat import CvatReader
from detloader.annotations.readers.imglab import ImglabReader
from detloader.annotations.readers.openimages import OpenImagesReader
from detloader.annotations.readers.txt import TxtReader
from detloader.annotations.readers.voc import VocReader
from detloader.annotations.readers.yolo import YoloReader

#: Readers by name, in the order ``format="auto"`` tries them: LVIS is a kind of COCO, so it
#: goes first; a COCO folder has an ``annotations/`` folder too, so COCO (JSON only) goes before
#: VOC; an XML file is told by its root element (``<annotation>`` VOC, ``<annotations>`` CVAT,
#: ``<dataset>`` imglab); Open Images (CSV) goes before YOLO, which takes any ``labels/`` folder.
READERS: dict[str, Reader] = {
    r.name: r
    for r in (LvisReader(), CocoReader(), OpenImagesReader(), VocReader(), CvatReader(), ImglabReader(), YoloReader(),
              TxtReader())
}

__all__ = ["READERS", "Reader"]
