"""How annotations are read: :class:`ReadOptions`, the options of
:func:`~detloader.annotations.read.read_annotations` that the readers and the builder see.
Every field takes part in the cache key (:meth:`ReadOptions.to_json`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from detloader.annotations.checks import BOXES_FROM_POINTS
from detloader.annotations.landmarks import LandmarkSchema
from detloader.annotations.problems import check_choice

#: Size cap of one annotation file (``max_file_bytes``), against files made to exhaust memory.
MAX_FILE_BYTES = 16 * 1024 * 1024


@dataclass(frozen=True)
class ReadOptions:
    """How annotations are read. Every field takes part in the cache key.

    Attributes:
        classes: the class list, in id order; objects of other classes are ``unknown_class``
            errors. ``None``: every class found, sorted by name.
        class_map: rename / merge / drop classes before anything else, as pairs
            ``(name_in_file, new_name)``; ``new_name=None`` drops the objects.
        landmark_schema: landmark names (ordered) and flip pairs; ``None``: names found in the
            data, in order of first appearance, flip pairs inferred from left/right spelling.
        one_based: subtract 1 from xmin and ymin (VOC's 1-based pixel indices).
        clip_boxes: clip boxes that are partly outside the image (reported as ``box_clipped``);
            when False such boxes are ``box_outside_image`` errors.
        check_images: check that each image file exists (``missing_image`` otherwise).
        image_class_attribute: name of the image attribute that holds the image-level class.
        max_file_bytes: size cap of one annotation file.
        image_dir: image folder, overriding the one found from the layout.
        allow_outside_images: follow image names that leave the dataset (absolute, ``../``),
            as ``convert --images none`` writes them; otherwise they are ``outside_dataset``
            problems and only their base name is looked for inside.
        boxes_from_points: what an object with landmarks but no box becomes: ``"enclose"``
            (its labelled points' enclosing box), ``"image"`` (the whole image) or ``"skip"``;
            reported once per file (``box_from_points``, repaired), see
            :func:`~detloader.annotations.checks.box_from_points`.
    """

    classes: tuple[str, ...] | None = None
    class_map: tuple[tuple[str, str | None], ...] = ()
    landmark_schema: LandmarkSchema | None = None
    one_based: bool = False
    clip_boxes: bool = True
    check_images: bool = True
    image_class_attribute: str = "class"
    max_file_bytes: int = MAX_FILE_BYTES
    image_dir: str | None = None
    allow_outside_images: bool = False
    boxes_from_points: str = "enclose"
    extra: tuple[tuple[str, Any], ...] = ()

    def __post_init__(self) -> None:
        check_choice("boxes_from_points", self.boxes_from_points, BOXES_FROM_POINTS)

    def option(self, name: str, default: Any = None) -> Any:
        """A format-specific option passed through ``read_annotations(..., **format_options)``."""
        return dict(self.extra).get(name, default)

    def to_json(self) -> dict[str, Any]:
        return {
            "classes": list(self.classes) if self.classes is not None else None,
            "class_map": [list(p) for p in self.class_map],
            "landmark_schema": self.landmark_schema.to_dict() if self.landmark_schema else None,
            "one_based": self.one_based,
            "clip_boxes": self.clip_boxes,
            "check_images": self.check_images,
            "image_class_attribute": self.image_class_attribute,
            "max_file_bytes": self.max_file_bytes,
            "image_dir": self.image_dir,
            "allow_outside_images": self.allow_outside_images,
            "boxes_from_points": self.boxes_from_points,
            "extra": [[k, repr(v)] for k, v in self.extra],
        }
