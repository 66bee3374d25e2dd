"""AnnotationIndex: a whole detection dataset as a few flat numpy arrays.

Units, dtypes and ids (boxes float32 xyxy pixels, landmark visibility 0/1/2, :data:`MISSING`):
docs/index.md ("Conventions (once)"). Objects of image ``i`` are rows
``object_offsets[i]:object_offsets[i + 1]`` of every per-object array. Nothing per image is
kept as a Python object: paths are one UTF-8 byte blob with offsets, per-image class lists one
int32 array with offsets (:meth:`AnnotationIndex.class_list`), and
:meth:`AnnotationIndex.image` builds a small view on demand. Loaded from the cache, the arrays
are read-only memory maps, shared (not copied) by DataLoader worker processes.
"""

from __future__ import annotations

import hashlib
import os
import shlex
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from detloader.annotations.distinct import distinct_pairs_by_group
from detloader.annotations.fields import (
    CLASS_LISTS,
    FIELDS,
    MISSING,
    OFFSETS,
    Vocabulary,
    array_names,
    packed_names,
    unpack_string,
    unpack_strings,
)
from detloader.annotations.landmarks import ClassFlip, LandmarkSchema
from detloader.annotations.problems import ProblemReport
from detloader.annotations.stratify import check_fractions, class_groups, stratified_split
from detloader.annotations.view import ImageView
from detloader.errors import DetloaderIndexError, DetloaderKeyError, DetloaderValueError, SplitNotFoundError


class AnnotationIndex:
    """One dataset: images, objects, landmarks and vocabularies as flat arrays.

    Build one with :func:`detloader.read_annotations`. The arrays are those of
    :data:`~detloader.annotations.fields.FIELDS` (per image ``[n, ...]``, per object
    ``[m, ...]``) plus ``object_offsets`` int64 ``[n + 1]``, the paths and the per-image class
    lists (each a data array with int64 offsets ``[n + 1]``); units and dtypes: docs/index.md
    ("Conventions (once)"). ``meta["frequency"]``, when the annotations give one: class name ->
    LVIS frequency group ``"r"`` / ``"c"`` / ``"f"`` (None: none given for that class).
    """

    # per-image and per-object arrays, set from the field table (see fields.FIELDS)
    width: np.ndarray
    height: np.ndarray
    image_labels: np.ndarray
    image_attributes: np.ndarray
    verified: np.ndarray
    image_ids: np.ndarray
    object_offsets: np.ndarray
    boxes: np.ndarray
    labels: np.ndarray
    difficult: np.ndarray
    truncated: np.ndarray
    occluded: np.ndarray
    crowd: np.ndarray
    area: np.ndarray
    object_attributes: np.ndarray
    landmarks: np.ndarray
    visibility: np.ndarray

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
        self.splits: dict[str, np.ndarray] = {k: np.asarray(v, dtype=np.int64) for k, v in (splits or {}).items()}
        self.problems = problems if problems is not None else ProblemReport()
        self.meta: dict[str, Any] = dict(meta or {})
        self._source_file = source_file  # the cache file the arrays are mapped from, if any
        # the "string" and "list" fields: (data, offsets [n + 1]) each
        self._packed: dict[str, tuple[np.ndarray, np.ndarray]] = {}
        a = dict(arrays)
        rows = {"image": len(a["width"]), "object": len(a["boxes"])}
        for f in FIELDS:
            data, offsets = packed_names(f)
            if f.level == "list" and data not in a and f.optional:  # arrays made by hand: empty lists
                self._packed[f.name] = (np.zeros(0, f.dtype), np.zeros(rows["image"] + 1, np.int64))
            elif f.level in ("string", "list"):
                self._packed[f.name] = (a[data], a[offsets])
            elif f.name not in a and f.optional:  # arrays made by hand: the field's fill
                setattr(self, f.name, np.full(f.shape(rows[f.level], vocab.sizes()), f.fill, dtype=f.dtype))
            else:
                setattr(self, f.name, a[f.name])
        self.object_offsets = a[OFFSETS]
        self._check_shapes()

    # -- construction helpers ---------------------------------------------------------------
    def _check_shapes(self) -> None:
        """The arrays agree with each other, with the field table's dtypes and with the
        vocabularies (ValueError if not: the arrays come from outside, e.g. a damaged cache
        file)."""
        n, m = len(self.width), len(self.boxes)
        rows = {"image": n, "object": m}
        sizes = self.vocab.sizes()
        expect: list[tuple[str, np.ndarray, Any, tuple[int, ...]]] = [
            (OFFSETS, self.object_offsets, np.int64, (n + 1,))
        ]
        for f in FIELDS:
            if f.level in ("string", "list"):
                (data_name, offsets_name), (data, offsets) = packed_names(f), self._packed[f.name]
                expect.append((data_name, data, f.dtype, data.shape[:1]))
                expect.append((offsets_name, offsets, np.int64, (n + 1,)))
            else:
                expect.append((f.name, getattr(self, f.name), f.dtype, f.shape(rows[f.level], sizes)))
        for name, arr, dtype, shape in expect:
            if arr.shape != shape:
                raise DetloaderValueError(f"AnnotationIndex: {name} has shape {arr.shape}, expected {shape}")
            if arr.dtype != np.dtype(dtype):
                raise DetloaderValueError(f"AnnotationIndex: {name} has dtype={arr.dtype}, expected {np.dtype(dtype)}")
        spans = [(OFFSETS, self.object_offsets, m)]
        spans += [(packed_names(f)[1], self._packed[f.name][1], len(self._packed[f.name][0])) for f in FIELDS
                  if f.level in ("string", "list")]
        for name, offsets, total in spans:
            if int(offsets[-1]) != total or int(offsets[0]) != 0:
                raise DetloaderValueError(
                    f"AnnotationIndex: {name} run {int(offsets[0])}..{int(offsets[-1])}, expected 0..{total}"
                )
        for name in CLASS_LISTS:
            values = self._packed[name][0]
            if len(values) and (int(values.min()) < 0 or int(values.max()) >= len(self.vocab.classes)):
                bad = int(values[(values < 0) | (values >= len(self.vocab.classes))][0])
                raise DetloaderValueError(
                    f"AnnotationIndex: {name}_classes holds class {bad}, "
                    f"not one of the {len(self.vocab.classes)} classes"
                )

    def arrays(self) -> dict[str, np.ndarray]:
        """All arrays by name, in the order of :func:`~detloader.annotations.fields.array_names`
        (what the cache stores)."""
        out: dict[str, np.ndarray] = {OFFSETS: self.object_offsets}
        for f in FIELDS:
            if f.level in ("string", "list"):
                out.update(zip(packed_names(f), self._packed[f.name]))
            else:
                out[f.name] = getattr(self, f.name)
        return {name: out[name] for name in array_names()}

    @property
    def source_file(self) -> str | None:
        """The cache file the arrays are mapped from, or None for an index in memory."""
        return self._source_file

    def paths_digest(self) -> str:
        """A short digest of the image paths, in order: two indexes (or subsets) of the same
        size that hold other images differ (the tuning store keys results by it)."""
        blob = self._packed["image_paths"][0]
        return hashlib.blake2b(memoryview(blob).cast("B"), digest_size=10).hexdigest()

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
    def category_ids(self) -> np.ndarray:
        """int64 ``[C]``: each class's own id in the annotations (COCO ``category_id``; 1..C
        for a format without ids), in class order."""
        return np.asarray(self.vocab.category_ids(), dtype=np.int64)

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
        return self.root / self.relative_image_path(i)

    def relative_image_path(self, i: int) -> str:
        """Path of image ``i`` relative to the root, as stored."""
        return unpack_string(*self._packed["image_paths"], i)

    def image_paths(self) -> list[str]:
        """Every image's path relative to the root, in row order (cheaper than calling
        :meth:`relative_image_path` per image)."""
        return unpack_strings(*self._packed["image_paths"])

    def annotation_path(self, i: int) -> str:
        """Annotation file (and record) of image ``i``, relative to the root."""
        return unpack_string(*self._packed["annotation_paths"], i)

    def annotation_paths(self) -> list[str]:
        """Every image's :meth:`annotation_path`, in row order."""
        return unpack_strings(*self._packed["annotation_paths"])

    def class_list(self, name: str, i: int) -> np.ndarray:
        """int32: the classes (indices into :attr:`classes`, sorted, distinct) on image ``i``'s
        list ``name``: ``"absent"`` (verified absent from the image: LVIS ``neg_category_ids``,
        Open Images labels of confidence 0), ``"present"`` (verified present: Open Images labels of
        confidence 1) or ``"not_exhaustive"`` (LVIS ``not_exhaustive_category_ids``); empty when
        the annotations give none."""
        values, offsets = self.class_lists(name)
        n = len(self)
        if not -n <= i < n:
            raise DetloaderIndexError(f"image index i={i} out of range for {n} images")
        i %= n
        return values[offsets[i] : offsets[i + 1]]

    def class_lists(self, name: str) -> tuple[np.ndarray, np.ndarray]:
        """Every image's :meth:`class_list` ``name`` at once: int32 classes and int64 offsets
        ``[n + 1]`` (image ``i``'s are ``classes[offsets[i]:offsets[i + 1]]``)."""
        if name not in CLASS_LISTS:
            raise DetloaderValueError(f"class list name={name!r} is not one of {', '.join(CLASS_LISTS)}")
        return self._packed[name]

    def has_class_lists(self) -> bool:
        """Whether any image has a class on any list (the annotations say which classes each
        image was checked for: LVIS, Open Images)."""
        return any(len(self._packed[name][0]) for name in CLASS_LISTS)

    def image(self, i: int) -> ImageView:
        """A view of image ``i`` (negative indices count from the end)."""
        n = len(self)
        if not -n <= i < n:
            raise DetloaderIndexError(f"image index i={i} out of range for {n} images")
        return ImageView(self, i % n if n else i)

    def __iter__(self) -> Iterator[ImageView]:
        for i in range(len(self)):
            yield ImageView(self, i)

    # -- subsets and splits -----------------------------------------------------------------
    def subset(self, ids: Sequence[int] | np.ndarray) -> AnnotationIndex:
        """A new index with images ``ids`` in that order (repeats allowed); same vocabularies.

        Splits keep the images of the subset that belonged to them, renumbered.
        """
        ids = np.asarray(ids, dtype=np.int64).reshape(-1)
        n = len(self)
        if ids.size and (ids.min() < -n or ids.max() >= n):
            bad = ids[(ids < -n) | (ids >= n)][0]
            raise DetloaderIndexError(f"subset: image id {int(bad)} out of range for {n} images")
        ids = ids % n if n else ids
        # a run of consecutive images (a refresh keeps 100,000 of them): slices, no index array
        run = slice(int(ids[0]), int(ids[-1]) + 1) if len(ids) and bool((np.diff(ids) == 1).all()) else None
        counts = self.objects_per_image[ids]
        offsets = np.zeros(len(ids) + 1, dtype=np.int64)
        np.cumsum(counts, out=offsets[1:])
        if run is None:
            obj: np.ndarray | slice = _ranges(self.object_offsets[ids], counts)
        else:
            obj = slice(int(self.object_offsets[run.start]), int(self.object_offsets[run.stop]))
        arrays: dict[str, np.ndarray] = {OFFSETS: offsets}
        for f in FIELDS:
            if f.level in ("string", "list"):
                data, offs = self._packed[f.name]
                data_name, offsets_name = packed_names(f)
                if run is not None:
                    arrays[data_name] = np.array(data[offs[run.start] : offs[run.stop]])
                    arrays[offsets_name] = offs[run.start : run.stop + 1] - offs[run.start]
                    continue
                lengths = (offs[1:] - offs[:-1])[ids]
                new_offs = np.zeros(len(ids) + 1, dtype=np.int64)
                np.cumsum(lengths, out=new_offs[1:])
                arrays[data_name] = np.ascontiguousarray(data[_ranges(offs[ids], lengths)])
                arrays[offsets_name] = new_offs
            else:
                rows = (ids if run is None else run) if f.level == "image" else obj
                value = getattr(self, f.name)[rows]  # a slice is a view (of a mapped file): copied
                arrays[f.name] = np.array(value) if isinstance(rows, slice) else np.ascontiguousarray(value)
        position = np.full(n, -1, dtype=np.int64)
        position[ids[::-1]] = np.arange(len(ids) - 1, -1, -1)  # first position of each id
        splits = {}
        for name, members in self.splits.items():
            pos = position[members]
            splits[name] = np.sort(pos[pos >= 0])
        meta = self.meta
        pack = meta.get("pack")
        if isinstance(pack, dict):  # each image keeps its row in the pack it is read from (dataset/shards.py)
            rows = pack.get("rows")
            rows = np.arange(n, dtype=np.int64) if rows is None else np.asarray(rows, dtype=np.int64)
            meta = {**meta, "pack": {**pack, "rows": rows[ids]}}
        return AnnotationIndex(
            root=self.root, arrays=arrays, vocab=self.vocab, splits=splits, problems=self.problems, meta=meta
        )

    def split(self, name: str) -> AnnotationIndex:
        """The images of split ``name`` (``meta["split_sources"]`` says where it was found);
        :class:`SplitNotFoundError` names the splits found, or how to make them."""
        if name not in self.splits and self.splits:
            raise SplitNotFoundError(f"split={name!r} not found; splits: {', '.join(sorted(self.splits))}")
        if name not in self.splits:
            raise SplitNotFoundError(
                f"split={name!r} not found: {self.root} has no splits (no split files, train/ val/ test/ "
                f"folders or splits.json); make them once with `detloader split {shlex.quote(str(self.root))} "
                "--val 0.2` or `detloader.make_splits(index, val=0.2)`"
            )
        return self.subset(self.splits[name])

    def random_split(
        self, fractions: Mapping[str, float], *, seed: int = 0, stratify: str | None = None
    ) -> dict[str, AnnotationIndex]:
        """Split by ratio, reproducibly: ``index.random_split({"train": .8, "val": .2}, seed=0)``.

        Fractions are normalised to sum to 1; ``stratify="image_class"`` groups images by image class,
        ``"class"`` by their rarest object class, as ``detloader split`` does
        (:func:`~detloader.annotations.stratify.stratified_split`).
        """
        check_fractions(fractions)
        if stratify is None:
            groups = np.zeros(len(self), dtype=np.int64)
        elif stratify == "image_class":
            groups = self.image_labels.astype(np.int64)
        elif stratify == "class":
            groups = class_groups(self.labels, self.object_image, self.image_labels, len(self.classes))
        else:
            raise DetloaderValueError(f"stratify={stratify!r} is not one of None, 'image_class', 'class'")
        parts = stratified_split(groups, fractions, np.random.default_rng(seed))
        return {k: self.subset(ids) for k, ids in parts.items()}

    # -- counts -----------------------------------------------------------------------------
    def class_counts(self, unit: str = "objects") -> dict[str, int]:
        """Class name -> number of objects (``unit="objects"``) or of images containing the
        class at least once (``unit="images"``)."""
        k = len(self.classes)
        if unit == "objects":
            counts = np.bincount(self.labels, minlength=k)
        elif unit == "images":
            classes, _, _ = distinct_pairs_by_group(self.object_image, self.labels, k)
            counts = np.bincount(classes, minlength=k)
        else:
            raise DetloaderValueError(f"unit={unit!r} is not one of 'objects', 'images'")
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
            raise DetloaderValueError(f"level={level!r} is not one of 'object', 'image'")
        names = [n for n, _ in table]
        if name not in names:
            raise DetloaderKeyError(f"{level} attribute {name!r} not found; attributes: {names}")
        return table, arr[:, names.index(name)]

    def summary(self) -> dict[str, Any]:
        """Plain-data summary: images, objects, classes (name -> objects), problems (kind ->
        count), image classes, landmark schema, classes a flip swaps or must not mirror (as inferred
        from the names), splits, empty images."""
        visible = np.bincount(self.visibility.reshape(-1), minlength=3)[:3].tolist()
        flips = ClassFlip.infer(self.classes)
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
            "class_flips": {
                "pairs": [list(p) for p in flips.named_pairs()],
                "one_sided": [self.classes[i] for i in flips.one_sided],
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


def _ranges(starts: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """Concatenation of ``arange(s, s + l)`` for each pair, vectorised."""
    lengths = np.asarray(lengths, dtype=np.int64)
    total = int(lengths.sum())
    if total == 0:
        return np.zeros(0, dtype=np.int64)
    ends = np.cumsum(lengths)
    shift = np.repeat(np.asarray(starts, dtype=np.int64) - (ends - lengths), lengths)
    return np.arange(total, dtype=np.int64) + shift
