"""The one table of an index's array fields: name, dtype, level, trailing shape, fill value.

Everything that handles an index's arrays column by column (the index's constructor and checks,
``arrays()``, ``subset``, the cache, the builder's columns and ``merge``) walks :data:`FIELDS`
instead of naming the arrays again. Levels: ``"image"`` (``[n, ...]``), ``"object"``
(``[m, ...]``), ``"string"`` (one UTF-8 blob ``{name}_blob`` with int64 ``{name}_offsets``
``[n + 1]``) and ``"list"`` (a list of class indices per image: int32 ``{name}_classes``, each
image's sorted and distinct, with int64 ``{name}_offsets`` ``[n + 1]``). ``object_offsets``
relates the image and object levels and is not in the table. A trailing
dimension is a number or the vocabulary that sizes it; ``vocab`` names the vocabulary a field's
values refer to, which is how :func:`~detloader.annotations.parse.merge` remaps it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np

from detloader.annotations.landmarks import LandmarkSchema

#: Id used in categorical arrays for "no value" (no image class, attribute not set).
MISSING = -1

Level = Literal["image", "object", "string", "list"]

#: Name of the structural int64 ``[n + 1]`` array that maps images to object rows.
OFFSETS = "object_offsets"


@dataclass(frozen=True)
class Field:
    """One array field of an index (see the module docstring for ``level`` and ``trailing``)."""

    name: str
    dtype: Any
    level: Level
    trailing: tuple[int | str, ...] = ()
    fill: Any = 0
    vocab: str | None = None
    #: arrays built by hand (or by code older than the field) may leave it out: ``fill`` then
    optional: bool = False

    def shape(self, rows: int, sizes: dict[str, int]) -> tuple[int, ...]:
        """The full shape for ``rows`` rows, ``sizes`` giving the named trailing dimensions."""
        return (rows, *(d if isinstance(d, int) else sizes[d] for d in self.trailing))


FIELDS: tuple[Field, ...] = (
    Field("width", np.int32, "image"),
    Field("height", np.int32, "image"),
    Field("image_labels", np.int32, "image", fill=MISSING, vocab="image_classes"),
    Field("image_attributes", np.int32, "image", ("image_attributes",), MISSING, "image_attributes"),
    Field("verified", np.bool_, "image", fill=False),
    Field("image_ids", np.int64, "image", fill=MISSING, optional=True),
    Field("boxes", np.float32, "object", (4,)),
    Field("labels", np.int32, "object", fill=MISSING, vocab="classes"),
    Field("difficult", np.bool_, "object", fill=False),
    Field("truncated", np.bool_, "object", fill=False),
    Field("occluded", np.bool_, "object", fill=False),
    Field("crowd", np.bool_, "object", fill=False, optional=True),
    # the object's own area in px² as the file gives it (COCO / LVIS ``area``: the mask's), MISSING: none
    Field("area", np.float32, "object", fill=MISSING, optional=True),
    Field("object_attributes", np.int32, "object", ("object_attributes",), MISSING, "object_attributes"),
    Field("landmarks", np.float32, "object", ("landmarks", 2), vocab="landmarks"),
    Field("visibility", np.uint8, "object", ("landmarks",), vocab="landmarks"),
    Field("image_paths", np.uint8, "string"),
    Field("annotation_paths", np.uint8, "string"),
    # classes verified absent from the image (LVIS neg_category_ids, Open Images labels of
    # confidence 0), verified present (Open Images labels of confidence 1), and annotated but
    # not exhaustively (LVIS not_exhaustive_category_ids)
    Field("absent", np.int32, "list", vocab="classes", optional=True),
    Field("present", np.int32, "list", vocab="classes", optional=True),
    Field("not_exhaustive", np.int32, "list", vocab="classes", optional=True),
)

#: The per-image class lists (fields of level ``"list"``), by name.
CLASS_LISTS: tuple[str, ...] = tuple(f.name for f in FIELDS if f.level == "list")


def packed_names(f: Field) -> tuple[str, str]:
    """The two arrays a ``"string"`` or ``"list"`` field is stored as: (data, int64 offsets)."""
    return (f"{f.name}_blob" if f.level == "string" else f"{f.name}_classes"), f"{f.name}_offsets"


def fields_at(level: Level) -> tuple[Field, ...]:
    """The fields of one level, in table order."""
    return tuple(f for f in FIELDS if f.level == level)


def array_names() -> list[str]:
    """Every stored array's name, in table order (what ``AnnotationIndex.arrays()`` returns)."""
    names = [f.name for f in FIELDS if f.level in ("image", "object")]
    names.insert(len(fields_at("image")), OFFSETS)
    for f in FIELDS:
        if f.level in ("string", "list"):
            names += packed_names(f)
    return names


def pack_strings(strings: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
    """UTF-8 blob (uint8) and int64 offsets ``[n + 1]`` for a list of strings. A file name that is
    not UTF-8 reaches Python with surrogate escapes (``os.fsdecode``); it is stored as its own
    bytes (``surrogateescape``) and read back as the same string, the exact name on disk. The
    strings are encoded as one text joined by NULs (no path holds one), the NULs then cut out by
    numpy: 100,000 paths in a few ms, not one ``encode`` each."""
    n = len(strings)
    offsets = np.zeros(n + 1, dtype=np.int64)
    joined = np.frombuffer("\0".join(strings).encode("utf-8", "surrogateescape"), dtype=np.uint8)
    cuts = np.flatnonzero(joined == 0)
    if len(cuts) == max(n - 1, 0):  # no string holds a NUL of its own
        offsets[1:n] = cuts - np.arange(n - 1)
        offsets[n] = len(joined) - max(n - 1, 0)
        return joined[joined != 0], offsets
    encoded = [s.encode("utf-8", "surrogateescape") for s in strings]
    np.cumsum([len(e) for e in encoded], out=offsets[1:])
    return np.frombuffer(b"".join(encoded), dtype=np.uint8).copy(), offsets


def unpack_string(blob: np.ndarray, offsets: np.ndarray, i: int) -> str:
    """String ``i`` of a blob made by :func:`pack_strings`."""
    return blob[offsets[i] : offsets[i + 1]].tobytes().decode("utf-8", "surrogateescape")


def unpack_strings(blob: np.ndarray, offsets: np.ndarray) -> list[str]:
    """Every string of a blob made by :func:`pack_strings`, in order: NULs put between them by
    numpy, one decode and one ``split`` (a decode per string cost 0.2 s per million)."""
    n = len(offsets) - 1
    if n <= 0:
        return []
    blob = np.asarray(blob, dtype=np.uint8)
    if not len(blob):  # every string empty (the digests under verify="stat")
        return [""] * n
    if not (blob == 0).any():  # no string holds a NUL (no path does): they can separate them
        return np.insert(blob, offsets[1:-1], 0).tobytes().decode("utf-8", "surrogateescape").split("\0")
    data = blob.tobytes()  # a NUL inside a string: one decode each
    return [data[a:b].decode("utf-8", "surrogateescape") for a, b in zip(offsets[:-1].tolist(), offsets[1:].tolist())]


@dataclass(frozen=True)
class Vocabulary:
    """Names behind the integer ids of an index."""

    classes: tuple[str, ...] = ()
    image_classes: tuple[str, ...] = ()
    object_attributes: tuple[tuple[str, tuple[str, ...]], ...] = ()
    image_attributes: tuple[tuple[str, tuple[str, ...]], ...] = ()
    landmarks: LandmarkSchema = field(default_factory=LandmarkSchema)
    #: each class's own id in the annotations (COCO category id), in class order; empty when
    #: the format has none (then the ids are 1..C: :meth:`category_ids`)
    class_ids: tuple[int, ...] = ()

    def category_ids(self) -> tuple[int, ...]:
        """Each class's id as the dataset numbers it: ``class_ids`` when there is one per class,
        else 1..C (class index + 1)."""
        if len(self.class_ids) == len(self.classes):
            return self.class_ids
        return tuple(range(1, len(self.classes) + 1))

    def to_dict(self) -> dict[str, Any]:
        return {
            "classes": list(self.classes),
            "image_classes": list(self.image_classes),
            "object_attributes": [[n, list(v)] for n, v in self.object_attributes],
            "image_attributes": [[n, list(v)] for n, v in self.image_attributes],
            "landmarks": self.landmarks.to_dict(),
            "class_ids": list(self.class_ids),
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Vocabulary:
        return cls(
            classes=tuple(data["classes"]),
            image_classes=tuple(data["image_classes"]),
            object_attributes=tuple((n, tuple(v)) for n, v in data["object_attributes"]),
            image_attributes=tuple((n, tuple(v)) for n, v in data["image_attributes"]),
            landmarks=LandmarkSchema.from_dict(data["landmarks"]),
            class_ids=tuple(int(i) for i in data.get("class_ids", ())),
        )

    def sizes(self) -> dict[str, int]:
        """Size of each named trailing dimension of :data:`~detloader.annotations.fields.FIELDS`:
        K landmarks, one column per image / object attribute."""
        return {
            "landmarks": len(self.landmarks),
            "image_attributes": len(self.image_attributes),
            "object_attributes": len(self.object_attributes),
        }


class LocalVocab:
    """Strings to local ids in order of first appearance."""

    __slots__ = ("ids", "names")

    def __init__(self) -> None:
        self.ids: dict[str, int] = {}
        self.names: list[str] = []

    def id(self, name: str) -> int:
        i = self.ids.get(name)
        if i is None:
            i = self.ids[name] = len(self.names)
            self.names.append(name)
        return i


class AttributeCells:
    """Rows of name -> value dicts, kept as (row, name id, value id) triples."""

    def __init__(self) -> None:
        self.names = LocalVocab()
        self.values: list[LocalVocab] = []
        self.cells: list[tuple[int, int, int]] = []

    def add(self, row: int, attrs: Mapping[str, str]) -> None:
        for name, value in attrs.items():
            a = self.names.id(name)
            if a == len(self.values):
                self.values.append(LocalVocab())
            self.cells.append((row, a, self.values[a].id(value)))

    def finish(self, n_rows: int) -> tuple[np.ndarray, list[tuple[str, list[str]]]]:
        table = np.full((n_rows, len(self.names.names)), MISSING, dtype=np.int32)
        if self.cells:
            cells = np.asarray(self.cells, dtype=np.int64)
            table[cells[:, 0], cells[:, 1]] = cells[:, 2]
        return table, [(n, v.names) for n, v in zip(self.names.names, self.values)]
