"""Annotation readers, one module per format; every one feeds the same
:class:`~detloader.annotations.builder.ChunkBuilder`.

A reader is a module with ``NAME``, ``sniff(path) -> bool``, ``discover(path, options) ->
Source``, ``parse(source, files, builder)`` and optionally ``splits(source, index)``,
``unannotated(source, index, options)`` (problems for images without annotations),
``PARALLEL = False`` (single-file formats), ``DEFAULT_LANDMARKS`` or
``default_landmarks(source, names)`` (the schema to use when the landmark names found, in
order of first appearance, fit it). A new format is a new module here plus one line in
:data:`READERS`.

The other modules serve the format modules: ``common`` (Source, file scans, value parsers),
``locate`` (finding images and their sizes), ``safe_xml`` (untrusted XML: parsing, streaming,
sniffing, one problem per unreadable file), and the parts of the larger formats:
``cvat_shapes``, ``voc_objects``, ``voc_landmarks``, ``yolo_config``, ``txt_faces``.
"""

from __future__ import annotations

from types import ModuleType

from detloader.annotations.readers import coco, cvat, imglab, txt, voc, yolo

#: Readers by name, in the order ``format="auto"`` tries them: a COCO folder has an
#: ``annotations/`` folder too, so COCO (JSON only) goes before VOC; an XML file is told by
#: its root element (``<annotation>`` VOC, ``<annotations>`` CVAT, ``<dataset>`` imglab).
READERS: dict[str, ModuleType] = {
    "coco": coco,
    "voc": voc,
    "cvat": cvat,
    "imglab": imglab,
    "yolo": yolo,
    "txt": txt,
}

__all__ = ["READERS"]
