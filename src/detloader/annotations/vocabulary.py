"""Vocabulary: the names behind the integer ids of an index (classes, image classes, attribute
values) and its landmark schema; the sizes of the index's named trailing dimensions."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from detloader.annotations.landmarks import LandmarkSchema


@dataclass(frozen=True)
class Vocabulary:
    """Names behind the integer ids of an index."""

    classes: tuple[str, ...] = ()
    image_classes: tuple[str, ...] = ()
    object_attributes: tuple[tuple[str, tuple[str, ...]], ...] = ()
    image_attributes: tuple[tuple[str, tuple[str, ...]], ...] = ()
    landmarks: LandmarkSchema = field(default_factory=LandmarkSchema)

    def to_dict(self) -> dict[str, Any]:
        return {
            "classes": list(self.classes),
            "image_classes": list(self.image_classes),
            "object_attributes": [[n, list(v)] for n, v in self.object_attributes],
            "image_attributes": [[n, list(v)] for n, v in self.image_attributes],
            "landmarks": self.landmarks.to_dict(),
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Vocabulary:
        return cls(
            classes=tuple(data["classes"]),
            image_classes=tuple(data["image_classes"]),
            object_attributes=tuple((n, tuple(v)) for n, v in data["object_attributes"]),
            image_attributes=tuple((n, tuple(v)) for n, v in data["image_attributes"]),
            landmarks=LandmarkSchema.from_dict(data["landmarks"]),
        )

    def sizes(self) -> dict[str, int]:
        """Size of each named trailing dimension of :data:`~detloader.annotations.fields.FIELDS`:
        K landmarks, one column per image / object attribute."""
        return {
            "landmarks": len(self.landmarks),
            "image_attributes": len(self.image_attributes),
            "object_attributes": len(self.object_attributes),
        }
