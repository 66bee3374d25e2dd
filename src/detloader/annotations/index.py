"""AnnotationIndex: a whole detection dataset as a few flat numpy arrays.

Conventions (said once, here):

* **Boxes** are float32 ``xyxy`` in pixel units of the original image, as written in the
  annotation file (``read_annotations(..., one_based=True)`` converts VOC's 1-based pixel
  indices by subtracting 1 from ``xmin`` and ``ymin``). ``xmin < xmax`` and ``ymin < ymax``
  always hold in an index; boxes lie inside ``[0, width] x [0, height]``.
* **Landmarks** are float32 ``[n_objects, K, 2]`` (x, y in pixels) with uint8 visibility
  ``[n_objects, K]``: 0 absent, 1 labelled but hidden, 2 visible (as COCO). A dataset has one
  :class:`~detloader.annotations.landmarks.LandmarkSchema` (ordered names, left/right flip pairs); a point that an object lacks
  keeps its slot with visibility 0 and coordinates 0.
* **Categorical values** (object class, image class, attribute values) are int32 ids into the
  vocabularies held by the index; :data:`MISSING` (-1) marks "no value".
* Images and their objects: objects of image ``i`` are rows
  ``object_offsets[i]:object_offsets[i + 1]`` of every per-object array.

Nothing per image is kept as a Python object: paths are one UTF-8 byte blob with offsets, and
:meth:`AnnotationIndex.image` builds a small view on demand. Loaded from the cache, the arrays
are read-only memory maps, shared (not copied) by DataLoader worker processes.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator, Mapping, Sequence

import numpy as np

from detloader.annotations.landmarks import LandmarkSchema
from detloader.annotations.problems import ProblemReport

#: Id used in categorical arrays for "no value" (no image class, attribute not set).
MISSING = -1

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
    def from_dict(cls, data: Mapping[str, Any]) -> "Vocabulary":
        return cls(
            classes=tuple(data["classes"]),
            image_classes=tuple(data["image_classes"]),
            object_attributes=tuple((n, tuple(v)) for n, v in data["object_attributes"]),
            image_attributes=tuple((n, tuple(v)) for n, v in data["image_attributes"]),
            landmarks=LandmarkSchema.from_dict(data["landmarks"]),
        )


def pack_strings(strings: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
    """UTF-8 blob (uint8) and int64 offsets ``[n + 1]`` for a list of strings."""
    encoded = [s.encode("utf-8") for s in strings]
    offsets = np.zeros(len(encoded) + 1, dtype=np.int64)
    if encoded:
        np.cumsum([len(e) for e in encoded], out=offsets[1:])
    blob = np.frombuffer(b"".join(encoded), dtype=np.uint8).copy()
    return blob, offsets


def _unpack_string(blob: np.ndarray, offsets: np.ndarray, i: int) -> str:
    return blob[offsets[i] : offsets[i + 1]].tobytes().decode("utf-8")


#: Array fields of an index: name -> (dtype, per-image or per-object, trailing shape rank).
IMAGE_ARRAYS = ("width", "height", "image_labels", "image_attributes", "verified")
OBJECT_ARRAYS = (
    "boxes",
    "labels",
    "difficult",
    "truncated",
    "occluded",
    "object_attributes",
    "landmarks",
    "visibility",
)
STRING_ARRAYS = ("image_paths", "annotation_paths")


class AnnotationIndex:
    """One dataset: images, objects, landmarks and vocabularies as flat arrays.

    Build one with :func:`detloader.read_annotations`. Per image (``n = len(index)``):

    ========================  ===================  =========================================
    ``width``, ``height``     int32 ``[n]``        image size in pixels
    ``image_labels``          int32 ``[n]``        image-level class id or MISSING
    ``image_attributes``      int32 ``[n, A]``     value ids, one column per image attribute
    ``verified``              bool ``[n]``         labelImg's ``verified="yes"``
    ``object_offsets``        int64 ``[n + 1]``    objects of image i: ``[off[i], off[i+1])``
    ========================  ===================  =========================================

    Per object (``m = index.num_objects``): ``boxes`` float32 ``[m, 4]`` xyxy, ``labels``
    int32 ``[m]``, ``difficult``/``truncated``/``occluded`` bool ``[m]``,
    ``object_attributes`` int32 ``[m, B]``, ``landmarks`` float32 ``[m, K, 2]``,
    ``visibility`` uint8 ``[m, K]``.
    """

    def __init__(
        self,
        *,
        root: str | os.PathLike[str],
        arrays: Mapping[str, np.ndarray],
        vocab: Vocabulary,
        splits: Mapping[str, np.ndarray] | None = None,
        problems: ProblemReport | None = None,
        meta: Mapping[str, Any] | None = None,
        source_file: str | None = None,
    ) -> None:
        self.root = Path(root)
        self.vocab = vocab
        self.splits: dict[str, np.ndarray] = {
            k: np.asarray(v, dtype=np.int64) for k, v in (splits or {}).items()
        }
        self.problems = problems if problems is not None else ProblemReport()
        self.meta: dict[str, Any] = dict(meta or {})
        self._source_file = source_file  # the cache file the arrays are mapped from, if any
        a = dict(arrays)
        self.width: np.ndarray = a["width"]
        self.height: np.ndarray = a["height"]
        self.image_labels: np.ndarray = a["image_labels"]
        self.image_attributes: np.ndarray = a["image_attributes"]
        self.verified: np.ndarray = a["verified"]
        self.object_offsets: np.ndarray = a["object_offsets"]
        self.boxes: np.ndarray = a["boxes"]
        self.labels: np.ndarray = a["labels"]
        self.difficult: np.ndarray = a["difficult"]
        self.truncated: np.ndarray = a["truncated"]
        self.occluded: np.ndarray = a["occluded"]
        self.object_attributes: np.ndarray = a["object_attributes"]
        self.landmarks: np.ndarray = a["landmarks"]
        self.visibility: np.ndarray = a["visibility"]
        self._image_path_blob: np.ndarray = a["image_paths_blob"]
        self._image_path_offsets: np.ndarray = a["image_paths_offsets"]
        self._ann_path_blob: np.ndarray = a["annotation_paths_blob"]
        self._ann_path_offsets: np.ndarray = a["annotation_paths_offsets"]
        self._check_shapes()

    # -- construction helpers ---------------------------------------------------------------
    def _check_shapes(self) -> None:
        """The arrays agree with each other and with the vocabularies (ValueError if not: the
        arrays come from outside, e.g. a damaged cache file)."""
        n, m = len(self.width), len(self.boxes)
        k = len(self.vocab.landmarks)
        expect = {
            "height": (n,),
            "image_labels": (n,),
            "verified": (n,),
            "object_offsets": (n + 1,),
            "boxes": (m, 4),
            "labels": (m,),
            "difficult": (m,),
            "truncated": (m,),
            "occluded": (m,),
            "landmarks": (m, k, 2),
            "visibility": (m, k),
            "image_attributes": (n, len(self.vocab.image_attributes)),
            "object_attributes": (m, len(self.vocab.object_attributes)),
        }
        for name, shape in expect.items():
            got = getattr(self, name).shape
            if got != shape:
                raise ValueError(f"AnnotationIndex: {name} has shape {got}, expected {shape}")
        if int(self.object_offsets[-1]) != m or (n and int(self.object_offsets[0]) != 0):
            raise ValueError(
                f"AnnotationIndex: object_offsets run {int(self.object_offsets[0])}.."
                f"{int(self.object_offsets[-1])}, expected 0..{m}"
            )

    def arrays(self) -> dict[str, np.ndarray]:
        """All arrays by name (what the cache stores)."""
        return {
            "width": self.width,
            "height": self.height,
            "image_labels": self.image_labels,
            "image_attributes": self.image_attributes,
            "verified": self.verified,
            "object_offsets": self.object_offsets,
            "boxes": self.boxes,
            "labels": self.labels,
            "difficult": self.difficult,
            "truncated": self.truncated,
            "occluded": self.occluded,
            "object_attributes": self.object_attributes,
            "landmarks": self.landmarks,
            "visibility": self.visibility,
            "image_paths_blob": self._image_path_blob,
            "image_paths_offsets": self._image_path_offsets,
            "annotation_paths_blob": self._ann_path_blob,
            "annotation_paths_offsets": self._ann_path_offsets,
        }

    def __reduce__(self) -> tuple[Any, ...]:
        # A cache-backed index travels to worker processes as its file name, not its arrays.
        if self._source_file is not None and os.path.exists(self._source_file):
            from detloader.annotations.cache import load_index_file

            return (load_index_file, (self._source_file, str(self.root), self.meta.get("cache_key")))
        return (_rebuild, (self.__dict__.copy(),))

    # -- sizes ------------------------------------------------------------------------------
    def __len__(self) -> int:
        return len(self.width)

    @property
    def num_objects(self) -> int:
        return len(self.boxes)

    @property
    def classes(self) -> tuple[str, ...]:
        return self.vocab.classes

    @property
    def image_classes(self) -> tuple[str, ...]:
        return self.vocab.image_classes

    @property
    def landmark_schema(self) -> LandmarkSchema:
        return self.vocab.landmarks

    @property
    def objects_per_image(self) -> np.ndarray:
        """int64 ``[n]``: number of objects in each image."""
        return np.diff(self.object_offsets)

    @property
    def object_image(self) -> np.ndarray:
        """int64 ``[m]``: the image each object belongs to."""
        return np.repeat(np.arange(len(self), dtype=np.int64), self.objects_per_image)

    def nbytes(self) -> dict[str, int]:
        """Bytes held per array (mapped bytes for a cache-backed index)."""
        return {name: int(arr.nbytes) for name, arr in self.arrays().items()}

    def __repr__(self) -> str:
        return (
            f"AnnotationIndex(images={len(self)}, objects={self.num_objects}, "
            f"classes={list(self.classes)}, landmarks={len(self.landmark_schema)}, "
            f"root={str(self.root)!r})"
        )

    # -- one image --------------------------------------------------------------------------
    def image_path(self, i: int) -> Path:
        """Absolute path of image ``i``."""
        return self.root / _unpack_string(self._image_path_blob, self._image_path_offsets, i)

    def relative_image_path(self, i: int) -> str:
        return _unpack_string(self._image_path_blob, self._image_path_offsets, i)

    def annotation_path(self, i: int) -> str:
        """Annotation file (and record) of image ``i``, relative to the root."""
        return _unpack_string(self._ann_path_blob, self._ann_path_offsets, i)

    def image(self, i: int) -> "ImageView":
        """A view of image ``i`` (negative indices count from the end)."""
        n = len(self)
        if not -n <= i < n:
            raise IndexError(f"image index i={i} out of range for {n} images")
        return ImageView(self, i % n if n else i)

    def __iter__(self) -> Iterator["ImageView"]:
        for i in range(len(self)):
            yield ImageView(self, i)

    # -- subsets and splits -----------------------------------------------------------------
    def subset(self, ids: Sequence[int] | np.ndarray) -> "AnnotationIndex":
        """A new index with images ``ids`` in that order (repeats allowed); same vocabularies.

        Splits keep the images of the subset that belonged to them, renumbered.
        """
        ids = np.asarray(ids, dtype=np.int64).reshape(-1)
        n = len(self)
        if ids.size and (ids.min() < -n or ids.max() >= n):
            bad = ids[(ids < -n) | (ids >= n)][0]
            raise IndexError(f"subset: image id {int(bad)} out of range for {n} images")
        ids = ids % n if n else ids
        counts = self.objects_per_image[ids]
        offsets = np.zeros(len(ids) + 1, dtype=np.int64)
        np.cumsum(counts, out=offsets[1:])
        obj = _ranges(self.object_offsets[ids], counts)
        arrays: dict[str, np.ndarray] = {"object_offsets": offsets}
        for name in IMAGE_ARRAYS:
            arrays[name] = np.ascontiguousarray(getattr(self, name)[ids])
        for name in OBJECT_ARRAYS:
            arrays[name] = np.ascontiguousarray(getattr(self, name)[obj])
        for name, blob, offs in (
            ("image_paths", self._image_path_blob, self._image_path_offsets),
            ("annotation_paths", self._ann_path_blob, self._ann_path_offsets),
        ):
            lengths = (offs[1:] - offs[:-1])[ids]
            new_offs = np.zeros(len(ids) + 1, dtype=np.int64)
            np.cumsum(lengths, out=new_offs[1:])
            arrays[f"{name}_blob"] = np.ascontiguousarray(blob[_ranges(offs[ids], lengths)])
            arrays[f"{name}_offsets"] = new_offs
        position = np.full(n, -1, dtype=np.int64)
        position[ids[::-1]] = np.arange(len(ids) - 1, -1, -1)  # first position of each id
        splits = {}
        for name, members in self.splits.items():
            pos = position[members]
            splits[name] = np.sort(pos[pos >= 0])
        return AnnotationIndex(
            root=self.root,
            arrays=arrays,
            vocab=self.vocab,
            splits=splits,
            problems=self.problems,
            meta=self.meta,
        )

    def split(self, name: str) -> "AnnotationIndex":
        """The images of split ``name`` (from ImageSets/Main/NAME.txt or a split file)."""
        if name not in self.splits:
            choices = ", ".join(sorted(self.splits)) or "none found"
            raise KeyError(f"split={name!r} not found; splits: {choices}")
        return self.subset(self.splits[name])

    def random_split(
        self,
        fractions: Mapping[str, float],
        *,
        seed: int = 0,
        stratify: str | None = None,
    ) -> dict[str, "AnnotationIndex"]:
        """Split by ratio, reproducibly: ``index.random_split({"train": .8, "val": .2}, seed=0)``.

        Fractions are normalised to sum to 1. ``stratify="image_class"`` keeps the image-class
        proportions in every part; ``stratify="class"`` uses each image's rarest object class.
        Each part gets ``round``-ed sizes with the remainder going to the first parts.
        """
        if not fractions:
            raise ValueError("random_split: fractions={} is empty")
        if any(f < 0 or not math.isfinite(f) for f in fractions.values()) or sum(
            fractions.values()
        ) <= 0:
            raise ValueError(f"random_split: fractions={dict(fractions)} must be >= 0, sum > 0")
        rng = np.random.default_rng(seed)
        if stratify is None:
            groups = np.zeros(len(self), dtype=np.int64)
        elif stratify == "image_class":
            groups = self.image_labels.astype(np.int64)
        elif stratify == "class":
            groups = self._rarest_class_per_image()
        else:
            raise ValueError(f"stratify={stratify!r} is not one of None, 'image_class', 'class'")
        names = list(fractions)
        weights = np.array([fractions[k] for k in names], dtype=np.float64)
        weights /= weights.sum()
        parts: dict[str, list[np.ndarray]] = {k: [] for k in names}
        for g in np.unique(groups):
            members = np.flatnonzero(groups == g)
            members = members[rng.permutation(len(members))]
            sizes = np.floor(weights * len(members)).astype(np.int64)
            remainder = len(members) - int(sizes.sum())
            order = np.argsort(-(weights * len(members) - sizes), kind="stable")
            sizes[order[:remainder]] += 1
            start = 0
            for k, size in zip(names, sizes):
                parts[k].append(members[start : start + size])
                start += size
        return {k: self.subset(np.sort(np.concatenate(v))) for k, v in parts.items()}

    def _rarest_class_per_image(self) -> np.ndarray:
        counts = np.bincount(self.labels, minlength=len(self.classes)) if len(self.labels) else []
        out = np.full(len(self), MISSING, dtype=np.int64)
        if len(self.labels) == 0:
            return out
        freq = np.asarray(counts)[self.labels]
        img = self.object_image
        # for each image, the label with the smallest global frequency
        order = np.lexsort((freq, img))
        first = np.ones(len(order), dtype=bool)
        first[1:] = img[order][1:] != img[order][:-1]
        out[img[order][first]] = self.labels[order][first]
        return out

    # -- counts -----------------------------------------------------------------------------
    def class_counts(self, unit: str = "objects") -> dict[str, int]:
        """Class name -> number of objects (``unit="objects"``) or of images containing the
        class at least once (``unit="images"``)."""
        k = len(self.classes)
        if unit == "objects":
            counts = np.bincount(self.labels, minlength=k)
        elif unit == "images":
            pairs = np.unique(self.object_image * max(k, 1) + self.labels)
            counts = np.bincount(pairs % max(k, 1), minlength=k) if len(pairs) else np.zeros(k)
        else:
            raise ValueError(f"unit={unit!r} is not one of 'objects', 'images'")
        return {name: int(c) for name, c in zip(self.classes, counts)}

    def image_class_counts(self) -> dict[str, int]:
        """Image class name -> number of images (images without a class are not counted)."""
        labels = self.image_labels[self.image_labels != MISSING]
        counts = np.bincount(labels, minlength=len(self.image_classes))
        return {name: int(c) for name, c in zip(self.image_classes, counts)}

    def attribute_counts(self, name: str, level: str = "object") -> dict[str, int]:
        """Value -> count for attribute ``name`` of objects (``level="object"``) or images."""
        table, column = self._attribute_column(name, level)
        values = dict(table)[name]
        col = column[column != MISSING]
        counts = np.bincount(col, minlength=len(values))
        return {v: int(c) for v, c in zip(values, counts)}

    def _attribute_column(self, name: str, level: str) -> tuple[Any, np.ndarray]:
        if level == "object":
            table, arr = self.vocab.object_attributes, self.object_attributes
        elif level == "image":
            table, arr = self.vocab.image_attributes, self.image_attributes
        else:
            raise ValueError(f"level={level!r} is not one of 'object', 'image'")
        names = [n for n, _ in table]
        if name not in names:
            raise KeyError(f"{level} attribute {name!r} not found; attributes: {names}")
        return table, arr[:, names.index(name)]

    def summary(self) -> dict[str, Any]:
        """Plain-data summary: images, objects, classes (name -> objects), problems (kind ->
        count), image classes, landmark schema, splits, empty images."""
        visible = (
            np.bincount(self.visibility.reshape(-1), minlength=3)[:3].tolist()
            if self.visibility.size
            else [0, 0, 0]
        )
        return {
            "root": str(self.root),
            "format": self.meta.get("format", ""),
            "images": len(self),
            "objects": self.num_objects,
            "classes": self.class_counts(),
            "images_per_class": self.class_counts("images"),
            "image_classes": self.image_class_counts(),
            "empty_images": int((self.objects_per_image == 0).sum()),
            "landmarks": {
                "names": list(self.landmark_schema.names),
                "flip_pairs": [list(p) for p in self.landmark_schema.flip_pairs],
                "absent": visible[0],
                "hidden": visible[1],
                "visible": visible[2],
            },
            "object_attributes": {
                n: self.attribute_counts(n, "object") for n, _ in self.vocab.object_attributes
            },
            "image_attributes": {
                n: self.attribute_counts(n, "image") for n, _ in self.vocab.image_attributes
            },
            "splits": {k: int(len(v)) for k, v in self.splits.items()},
            "problems": self.problems.counts(),
        }


def _rebuild(state: dict[str, Any]) -> AnnotationIndex:
    obj = AnnotationIndex.__new__(AnnotationIndex)
    obj.__dict__.update(state)
    return obj


def _ranges(starts: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """Concatenation of ``arange(s, s + l)`` for each pair, vectorised."""
    lengths = np.asarray(lengths, dtype=np.int64)
    total = int(lengths.sum())
    if total == 0:
        return np.zeros(0, dtype=np.int64)
    ends = np.cumsum(lengths)
    shift = np.repeat(np.asarray(starts, dtype=np.int64) - (ends - lengths), lengths)
    return np.arange(total, dtype=np.int64) + shift


class ImageView:
    """One image of an index, built on demand; its arrays are views into the index."""

    __slots__ = ("_index", "id")

    def __init__(self, index: AnnotationIndex, i: int) -> None:
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

    @property
    def width(self) -> int:
        return int(self._index.width[self.id])

    @property
    def height(self) -> int:
        return int(self._index.height[self.id])

    @property
    def boxes(self) -> np.ndarray:
        return self._index.boxes[self._rows]

    @property
    def labels(self) -> np.ndarray:
        return self._index.labels[self._rows]

    @property
    def class_names(self) -> list[str]:
        return [self._index.classes[c] for c in self.labels]

    @property
    def landmarks(self) -> np.ndarray:
        return self._index.landmarks[self._rows]

    @property
    def visibility(self) -> np.ndarray:
        return self._index.visibility[self._rows]

    @property
    def difficult(self) -> np.ndarray:
        return self._index.difficult[self._rows]

    @property
    def truncated(self) -> np.ndarray:
        return self._index.truncated[self._rows]

    @property
    def occluded(self) -> np.ndarray:
        return self._index.occluded[self._rows]

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
        return {
            name: values[v]
            for (name, values), v in zip(self._index.vocab.image_attributes, row)
            if v != MISSING
        }

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
