"""ImageView: one image of an :class:`~detloader.annotations.index.AnnotationIndex`, on demand.

Its arrays are views into the index's flat arrays (rows ``object_offsets[i]:object_offsets[i+1]``
of the per-object arrays); nothing is copied or kept per image.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from detloader.annotations.fields import MISSING


class _ObjectRows:
    """Descriptor of :class:`ImageView`: the image's rows of the index's per-object array of
    the same name (a view, no copy)."""

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    def __get__(self, view: ImageView, owner: type | None = None) -> np.ndarray:
        return getattr(view._index, self.name)[view._rows]


class ImageView:
    """One image of an index, built on demand; its arrays are views into the index."""

    __slots__ = ("_index", "id")

    def __init__(self, index: Any, i: int) -> None:  # an AnnotationIndex (which imports this module)
        self._index = index
        self.id = int(i)

    @property
    def _rows(self) -> slice:
        off = self._index.object_offsets
        return slice(int(off[self.id]), int(off[self.id + 1]))

    @property
    def path(self) -> Path:
        return self._index.image_path(self.id)

    @property
    def annotation_path(self) -> str:
        return self._index.annotation_path(self.id)

    @property
    def size(self) -> tuple[int, int]:
        """(width, height) in pixels."""
        return int(self._index.width[self.id]), int(self._index.height[self.id])

    #: per-object arrays of this image: boxes float32 [j, 4], labels int32 [j], landmarks
    #: float32 [j, K, 2], visibility uint8 [j, K], difficult / truncated / occluded / crowd bool [j]
    boxes = _ObjectRows()
    labels = _ObjectRows()
    landmarks = _ObjectRows()
    visibility = _ObjectRows()
    difficult = _ObjectRows()
    truncated = _ObjectRows()
    occluded = _ObjectRows()
    crowd = _ObjectRows()

    @property
    def width(self) -> int:
        return int(self._index.width[self.id])

    @property
    def height(self) -> int:
        return int(self._index.height[self.id])

    @property
    def class_names(self) -> list[str]:
        return [self._index.classes[c] for c in self.labels]

    @property
    def image_label(self) -> int:
        return int(self._index.image_labels[self.id])

    @property
    def image_class(self) -> str | None:
        label = self.image_label
        return None if label == MISSING else self._index.image_classes[label]

    @property
    def attributes(self) -> dict[str, str]:
        """Image attributes that are set, name -> value."""
        row = self._index.image_attributes[self.id]
        return {name: values[v] for (name, values), v in zip(self._index.vocab.image_attributes, row) if v != MISSING}

    @property
    def object_attributes(self) -> list[dict[str, str]]:
        """Per object, the attributes that are set, name -> value."""
        table = self._index.vocab.object_attributes
        return [
            {name: values[v] for (name, values), v in zip(table, row) if v != MISSING}
            for row in self._index.object_attributes[self._rows]
        ]

    def __repr__(self) -> str:
        return (
            f"ImageView(id={self.id}, path={str(self.path)!r}, size={self.size}, "
            f"objects={self._rows.stop - self._rows.start})"
        )
