"""Annotation readers, one module per format; each defines a :class:`Reader` (the protocol is in
:mod:`~detloader.annotations.readers.common`) that feeds the same
:class:`~detloader.annotations.builder.ChunkBuilder`. A new format is a new module here plus
one line in :data:`READERS`.

The other modules serve the format modules: ``common`` (Reader, Source, file scans, value
parsers), ``locate`` (finding images and their sizes), ``safe_xml`` (untrusted XML: parsing,
streaming, sniffing, one problem per unreadable file), and the parts of the larger formats:
``cvat_shapes``, ``voc_objects``, ``yolo_config``.
"""

from detloader.annotations.readers.coco import CocoReader
from detloader.annotations.readers.common import Reader
from detloader.annotations.readers.cvat import CvatReader
from detloader.annotations.readers.imglab import ImglabReader
from detloader.annotations.readers.txt import TxtReader
from detloader.annotations.readers.voc import VocReader
from detloader.annotations.readers.yolo import YoloReader

#: Readers by name, in the order ``format="auto"`` tries them: a COCO folder has an
#: ``annotations/`` folder too, so COCO (JSON only) goes before VOC; an XML file is told by
#: its root element (``<annotation>`` VOC, ``<annotations>`` CVAT, ``<dataset>`` imglab).
READERS: dict[str, Reader] = {
    r.name: r for r in (CocoReader(), VocReader(), CvatReader(), ImglabReader(), YoloReader(), TxtReader())
}

__all__ = ["READERS", "Reader"]
