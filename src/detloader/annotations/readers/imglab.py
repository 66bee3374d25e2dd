"""dlib imglab XML: ``<dataset><images><image file width height><box top left width height>``.

One XML file holds the whole dataset; it is streamed
(:func:`~detloader.annotations.readers.safe_xml.iter_xml`). Boxes are
``(left, top, left + width, top + height)``. Layout and mapping: docs/formats.md ("Each
reader's files and layouts", "What each format maps to").
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from lxml import etree

from detloader.annotations.builder import ChunkBuilder
from detloader.annotations.checks import ReadOptions
from detloader.annotations.landmarks import LandmarkSchema, preset_schema
from detloader.annotations.readers.common import Reader, Source, candidate_dirs, check_options, file_source, flag_value
from detloader.annotations.readers.locate import ImageLocator, locate_image
from detloader.annotations.readers.safe_xml import annotation_xml, sniff_xml, stream_records

NAME = "imglab"
#: Format options this reader accepts (``read_annotations(path, **options)``).
OPTIONS: tuple[str, ...] = ("default_class",)
ROOT_TAG = "dataset"
#: Box attributes that are index flags, not object attributes.
_FLAGS = ("difficult", "truncated", "occluded", "ignore")
_BOX_FIELDS = ("top", "left", "width", "height")
#: dlib's OBJECT_PART_NOT_PRESENT coordinates.
_NOT_PRESENT = (2**31 - 1, -(2**31))


@dataclass(kw_only=True)
class ImglabSource(Source):
    default_class: str


def _image(image: etree._Element, element: str, locator: ImageLocator, default_class: str, b: ChunkBuilder) -> None:
    name = (image.get("file") or "").strip()
    if not name:
        b.problem("missing_field", element, "file= is missing", "image skipped")
        return
    found = locate_image(
        locator, b, name, element, f"file={name!r}", image.get("width"), image.get("height"),
        name_where=f"{element}/file",
    )
    if found is None:
        return
    rel, width, height = found
    if not b.add_image(rel, width, height, record=name):
        return
    for j, box in enumerate(image.iterfind("box"), start=1):
        _box(box, f"{element}/box[{j}]", default_class, b)


def _box(box: etree._Element, where: str, default_class: str, b: ChunkBuilder) -> None:
    rect: tuple[float, float, float, float] | None = None
    parts = None
    if all(box.get(field) is None for field in _BOX_FIELDS) and box.find("part") is not None:
        parts = _parts(box, where, b)  # parts alone: the builder makes the box (boxes_from_points)
    else:
        values = []
        for field in _BOX_FIELDS:
            v = b.number(box.get(field), where, field, "object skipped")
            if v is None:
                return
            values.append(v)
        top, left, width, height = values
        rect = (left, top, left + width, top + height)
    flags = {field: flag_value(b, box.get(field), where, field) for field in _FLAGS}
    own = (*_BOX_FIELDS, *_FLAGS)
    attrs = {key: value.strip() for key, value in box.attrib.items() if key not in own and value.strip()}
    if flags.pop("ignore"):  # an ignored box is kept as difficult, with the attribute ignore=1
        attrs["ignore"] = "1"
        flags["difficult"] = True
    name = (box.findtext("label") or "").strip() or default_class
    landmarks = _parts(box, where, b) if rect is not None else parts
    b.add_object(
        rect, name, element=where, box_field="", attributes=attrs, landmarks=landmarks, landmark_field="part", **flags
    )


def _parts(box: etree._Element, where: str, b: ChunkBuilder) -> list[tuple[str, float, float, int]] | None:
    parts = box.findall("part")
    if not parts:
        return None
    points: list[tuple[str, float, float, int]] = []
    seen: set[str] = set()
    for k, part in enumerate(parts, start=1):
        at = f"{where}/part[{k}]"
        name = (part.get("name") or "").strip()
        if not name:
            b.problem("missing_field", at, "name= is missing", "point skipped")
            continue
        if name in seen:
            b.problem("bad_value", at, f"part name={name!r} given twice in one box", "point skipped")
            continue
        seen.add(name)
        x = b.number(part.get("x"), at, f"{name}: x", "point skipped")
        y = b.number(part.get("y"), at, f"{name}: y", "point skipped")
        if x is None or y is None:
            continue
        points.append((name, 0.0, 0.0, 0) if x in _NOT_PRESENT or y in _NOT_PRESENT else (name, x, y, 2))
    return points


class ImglabReader(Reader):
    """dlib imglab XML (see the module docstring)."""

    name = NAME
    parallel = False

    def sniff(self, path: Path) -> bool:
        """An ``.xml`` file whose root element is ``<dataset>``, or a folder holding one."""
        return sniff_xml(path, ROOT_TAG)

    def discover(self, path: Path, options: ReadOptions) -> ImglabSource:
        """The imglab XML file at ``path`` and the folders its image paths are relative to."""
        check_options(options, NAME, OPTIONS)
        xml = annotation_xml(path.resolve(), ROOT_TAG, "imglab")
        root = xml.parent
        dirs = candidate_dirs(root, ("", "images"), options.image_dir)
        return file_source(ImglabSource, xml, root, dirs, default_class=str(options.option("default_class", "object")))

    def parse_file(self, source: ImglabSource, rel: str, b: ChunkBuilder) -> None:
        root = str(source.root)
        locator = ImageLocator(root, source.image_dirs, b.options.check_images)
        default_class = source.default_class
        numbers = itertools.count(1)

        def record(image: etree._Element) -> None:
            _image(image, f"image[{next(numbers)}]", locator, default_class, b)

        stream_records(os.path.join(root, rel), ("image",), ROOT_TAG, b, record)

    def default_landmarks(self, source: Source, names: Sequence[str]) -> LandmarkSchema | None:
        """:data:`IBUG68` when the parts are dlib's 68 points, else None (names and flip pairs
        as found)."""
        return preset_schema(names)
