"""From reader records to index arrays, with the checks every format shares.

A reader walks its files and calls :class:`ChunkBuilder` once per image and once per object;
the builder validates (boxes, landmarks, classes) and records problems, then ``finish()``
turns the chunk into a :class:`Partial` of numpy arrays with chunk-local vocabularies.
Chunks are built in worker processes and merged in file order by :func:`merge`, which fixes the
global vocabularies and finds images annotated twice.
"""

from __future__ import annotations

import math
from array import array
from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping, Sequence

import numpy as np

from detloader.annotations.index import MISSING, AnnotationIndex, Vocabulary, pack_strings

from detloader.annotations.landmarks import LandmarkSchema, infer_flip_pairs
from detloader.annotations.problems import Problem, ProblemReport, Severity

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
    extra: tuple[tuple[str, Any], ...] = ()

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
            "extra": [[k, repr(v)] for k, v in self.extra],
        }


def _fmt(v: float) -> str:
    return f"{v:g}"


@dataclass
class Partial:
    """One chunk of a dataset as arrays, with chunk-local vocabularies (see :func:`merge`)."""

    width: np.ndarray
    height: np.ndarray
    verified: np.ndarray
    image_paths: list[str]
    annotation_paths: list[str]
    image_labels: np.ndarray
    image_label_names: list[str]
    image_attributes: np.ndarray
    image_attribute_vocab: list[tuple[str, list[str]]]
    object_offsets: np.ndarray
    boxes: np.ndarray
    labels: np.ndarray
    label_names: list[str]
    difficult: np.ndarray
    truncated: np.ndarray
    occluded: np.ndarray
    object_attributes: np.ndarray
    object_attribute_vocab: list[tuple[str, list[str]]]
    landmarks: np.ndarray
    visibility: np.ndarray
    landmark_names: list[str]
    problems: list[Problem]
    stats: dict[str, int] = field(default_factory=dict)
    declared_classes: list[str] = field(default_factory=list)


class _Vocab:
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


class _AttrTable:
    """Rows of name -> value dicts, kept as (row, name id, value id) triples."""

    def __init__(self) -> None:
        self.names = _Vocab()
        self.values: list[_Vocab] = []
        self.cells: list[tuple[int, int, int]] = []

    def add(self, row: int, attrs: Mapping[str, str]) -> None:
        for name, value in attrs.items():
            a = self.names.id(name)
            if a == len(self.values):
                self.values.append(_Vocab())
            self.cells.append((row, a, self.values[a].id(value)))

    def finish(self, n_rows: int) -> tuple[np.ndarray, list[tuple[str, list[str]]]]:
        table = np.full((n_rows, len(self.names.names)), MISSING, dtype=np.int32)
        if self.cells:
            cells = np.asarray(self.cells, dtype=np.int64)
            table[cells[:, 0], cells[:, 1]] = cells[:, 2]
        return table, [(n, v.names) for n, v in zip(self.names.names, self.values)]


class ChunkBuilder:
    """Collects images and objects of one chunk of files, validating as it goes.

    Readers call, per annotation file: :meth:`begin_file`; per image :meth:`add_image` (which
    returns False when the image is rejected, then its objects are skipped); per object
    :meth:`add_object`. Anything wrong goes through :meth:`problem`.
    """

    def __init__(self, options: ReadOptions) -> None:
        self.options = options
        self._class_map = dict(options.class_map)
        self._classes = set(options.classes) if options.classes is not None else None
        self._schema = options.landmark_schema
        self.file = ""
        self.problems: list[Problem] = []
        self.stats: dict[str, int] = {}
        # typed columns, not lists of tuples: a few bytes per object instead of ~2 KB
        self._width = array("i")
        self._height = array("i")
        self._verified = array("b")
        self._image_paths: list[str] = []
        self._annotation_paths: list[str] = []
        self._image_labels = array("i")
        self._image_label_vocab = _Vocab()
        self._image_attrs = _AttrTable()
        self._offsets = array("q", [0])
        self._boxes = array("f")  # 4 per object
        self._labels = array("i")
        self._declared: dict[str, None] = {}
        self._label_vocab = _Vocab()
        self._flags = array("b")  # difficult, truncated, occluded per object
        self._obj_attrs = _AttrTable()
        self._lm_vocab = _Vocab()
        if self._schema is not None:
            for name in self._schema.names:
                self._lm_vocab.id(name)
        self._lm_rows = array("i")
        self._lm_slots = array("i")
        self._lm_xy = array("f")  # x, y per point
        self._lm_vis = array("B")
        self._open = False

    # -- problems ---------------------------------------------------------------------------
    def begin_file(self, file: str) -> None:
        """Name the annotation file (relative to the root) that the next records come from."""
        self._close_image()
        self.file = file

    def problem(
        self,
        kind: str,
        element: str,
        message: str,
        action: str = "",
        severity: Severity = "error",
        file: str | None = None,
    ) -> None:
        self.problems.append(
            Problem(kind, self.file if file is None else file, element, message, action, severity)
        )

    def declare_classes(self, names: Sequence[str]) -> None:
        """Class names the file declares, in its id order (COCO categories, YOLO ``names``).

        They keep that order in the index and stay in the vocabulary without objects; names
        found but not declared follow, sorted. ``class_map`` applies to them too.
        """
        for name in names:
            name = name.strip()
            mapped = self._class_map.get(name, name)
            if mapped:
                self._declared.setdefault(mapped, None)

    def count(self, name: str, n: int = 1) -> None:
        self.stats[name] = self.stats.get(name, 0) + n

    def number(self, text: str | None, element: str, fieldname: str, action: str) -> float | None:
        """Parse a coordinate; report ``missing_field`` / ``bad_value`` and return None."""
        if text is None or not text.strip():
            self.problem("missing_field", element, f"{fieldname} is missing", action)
            return None
        try:
            return float(text)
        except ValueError:
            self.problem("bad_value", element, f"{fieldname}={text.strip()!r} is not a number", action)
            return None

    # -- images -----------------------------------------------------------------------------
    def _close_image(self) -> None:
        if self._open:
            self._offsets.append(len(self._labels))
            self._open = False

    def add_image(
        self,
        path: str,
        width: int,
        height: int,
        *,
        image_class: str | None = None,
        attributes: Mapping[str, str] | None = None,
        verified: bool = False,
        record: str | None = None,
    ) -> bool:
        """Start an image. ``path`` is relative to the dataset root; ``record`` names the image
        inside a multi-image file (used in messages), default the annotation file itself."""
        self._close_image()
        if not (width > 0 and height > 0):
            self.problem("bad_value", "size", f"width={width} height={height}", "image skipped")
            return False
        self._width.append(int(width))
        self._height.append(int(height))
        self._verified.append(bool(verified))
        self._image_paths.append(path)
        self._annotation_paths.append(self.file if record is None else f"{self.file}#{record}")
        self._image_labels.append(
            MISSING if image_class is None else self._image_label_vocab.id(image_class)
        )
        if attributes:
            self._image_attrs.add(len(self._width) - 1, attributes)
        self._open = True
        return True

    # -- objects ----------------------------------------------------------------------------
    def add_object(
        self,
        box: Sequence[float],
        name: str,
        *,
        element: str,
        box_field: str = "bndbox",
        difficult: bool = False,
        truncated: bool = False,
        occluded: bool = False,
        attributes: Mapping[str, str] | None = None,
        landmarks: Iterable[tuple[str, float, float, int]] | None = None,
        landmark_field: str = "keypoints",
    ) -> bool:
        """Add one object to the current image. ``box`` is xyxy as in the file; ``landmarks``
        are ``(name, x, y, visibility)`` with visibility 0/1/2; a point's problems are reported
        at ``{element}/{landmark_field}[k]``, k counting from 1; the box's at
        ``{element}/{box_field}`` (``element`` alone when ``box_field`` is empty). Returns False
        if skipped."""
        if not self._open:
            raise RuntimeError("add_object before add_image")
        name = name.strip()
        if name in self._class_map:
            mapped = self._class_map[name]
            if mapped is None:
                self.count("dropped_by_class_map")
                return False
            name = mapped
        if not name:
            self.problem("missing_field", f"{element}/name", "class name is empty", "object skipped")
            return False
        if self._classes is not None and name not in self._classes:
            self.problem(
                "unknown_class", f"{element}/name", f"name={name!r} is not in classes", "object skipped"
            )
            return False
        x1, y1, x2, y2 = (float(v) for v in box)
        if self.options.one_based:
            x1, y1 = x1 - 1.0, y1 - 1.0
        where = f"{element}/{box_field}" if box_field else element
        # check what will be stored: float32 (two close float64 values can round to one)
        x1, y1, x2, y2 = array("f", (x1, y1, x2, y2))
        if not all(math.isfinite(v) for v in (x1, y1, x2, y2)):
            self.problem(
                "non_finite",
                where,
                f"xmin={_fmt(x1)} ymin={_fmt(y1)} xmax={_fmt(x2)} ymax={_fmt(y2)}",
                "object skipped",
            )
            return False
        if x2 <= x1 or y2 <= y1:
            msg = (
                f"xmax={_fmt(x2)} <= xmin={_fmt(x1)}"
                if x2 <= x1
                else f"ymax={_fmt(y2)} <= ymin={_fmt(y1)}"
            )
            self.problem("empty_box", where, msg, "object skipped")
            return False
        w, h = self._width[-1], self._height[-1]
        if x1 < 0 or y1 < 0 or x2 > w or y2 > h:
            desc = (
                f"box ({_fmt(x1)}, {_fmt(y1)}, {_fmt(x2)}, {_fmt(y2)}) outside image "
                f"width={w} height={h}"
            )
            cx1, cy1, cx2, cy2 = max(x1, 0.0), max(y1, 0.0), min(x2, float(w)), min(y2, float(h))
            if cx2 <= cx1 or cy2 <= cy1:
                self.problem("box_outside_image", where, desc, "object skipped")
                return False
            if not self.options.clip_boxes:
                self.problem("box_outside_image", where, desc, "object skipped")
                return False
            self.problem("box_clipped", where, desc, "clipped to the image", "repaired")
            x1, y1, x2, y2 = cx1, cy1, cx2, cy2
        row = len(self._labels)
        self._boxes.extend((x1, y1, x2, y2))
        self._labels.append(self._label_vocab.id(name))
        self._flags.extend((bool(difficult), bool(truncated), bool(occluded)))
        if attributes:
            self._obj_attrs.add(row, attributes)
        if landmarks is not None:
            self._add_landmarks(row, landmarks, f"{element}/{landmark_field}", w, h)
        return True

    def positional_names(self, n: int, element: str, default: Sequence[str] | None = None) -> list[str] | None:
        """Names for ``n`` unnamed, ordered landmarks: the user's schema when given (and the
        count matches), else ``default`` (when its length is n), else ``p0 .. p{n-1}``."""
        if self._schema is not None:
            if len(self._schema.names) != n:
                self.problem(
                    "landmark_count",
                    element,
                    f"{n} points, landmark schema has {len(self._schema.names)}",
                    "landmarks skipped",
                )
                return None
            return list(self._schema.names)
        if default is not None and len(default) == n:
            return list(default)
        return [f"p{i}" for i in range(n)]

    def _add_landmarks(
        self, row: int, landmarks: Iterable[tuple[str, float, float, int]], where: str, w: int, h: int
    ) -> None:
        for k, (name, x, y, v) in enumerate(landmarks, start=1):
            if self._schema is not None and name not in self._lm_vocab.ids:
                self.problem(
                    "unknown_landmark",
                    f"{where}[{k}]",
                    f"name={name!r} is not in the landmark schema",
                    "point skipped",
                )
                continue
            slot = self._lm_vocab.id(name)
            v = int(v)
            if v not in (0, 1, 2):
                self.problem(
                    "bad_value", f"{where}[{k}]", f"visibility={v} is not 0, 1 or 2", "point skipped"
                )
                continue
            if v == 0:
                self._point(row, slot, 0.0, 0.0, 0)
                continue
            if not (math.isfinite(x) and math.isfinite(y)):
                self.problem(
                    "non_finite", f"{where}[{k}]", f"{name}: x={_fmt(x)} y={_fmt(y)}", "point skipped"
                )
                continue
            if self.options.one_based:
                x, y = x - 1.0, y - 1.0
            if not (0.0 <= x <= w and 0.0 <= y <= h):
                self.problem(
                    "landmark_outside_image",
                    f"{where}[{k}]",
                    f"{name}: x={_fmt(x)} y={_fmt(y)} outside image width={w} height={h}",
                    "point kept with visibility 0",
                )
                self._point(row, slot, 0.0, 0.0, 0)
                continue
            self._point(row, slot, float(x), float(y), v)

    def _point(self, row: int, slot: int, x: float, y: float, v: int) -> None:
        self._lm_rows.append(row)
        self._lm_slots.append(slot)
        self._lm_xy.extend((x, y))
        self._lm_vis.append(v)

    # -- result -----------------------------------------------------------------------------
    def finish(self) -> Partial:
        self._close_image()
        n, m = len(self._width), len(self._labels)
        k = len(self._lm_vocab.names)
        landmarks = np.zeros((m, k, 2), dtype=np.float32)
        visibility = np.zeros((m, k), dtype=np.uint8)
        if len(self._lm_rows):
            rows = np.frombuffer(self._lm_rows, dtype=np.int32)
            slots = np.frombuffer(self._lm_slots, dtype=np.int32)
            landmarks[rows, slots] = np.frombuffer(self._lm_xy, dtype=np.float32).reshape(-1, 2)
            visibility[rows, slots] = np.frombuffer(self._lm_vis, dtype=np.uint8)
        flags = np.frombuffer(self._flags, dtype=np.int8).astype(bool).reshape(m, 3)
        image_attrs, image_attr_vocab = self._image_attrs.finish(n)
        obj_attrs, obj_attr_vocab = self._obj_attrs.finish(m)
        return Partial(
            width=np.frombuffer(self._width, dtype=np.int32).copy(),
            height=np.frombuffer(self._height, dtype=np.int32).copy(),
            verified=np.frombuffer(self._verified, dtype=np.int8).astype(bool),
            image_paths=self._image_paths,
            annotation_paths=self._annotation_paths,
            image_labels=np.frombuffer(self._image_labels, dtype=np.int32).copy(),
            image_label_names=self._image_label_vocab.names,
            image_attributes=image_attrs,
            image_attribute_vocab=image_attr_vocab,
            object_offsets=np.frombuffer(self._offsets, dtype=np.int64).copy(),
            boxes=np.frombuffer(self._boxes, dtype=np.float32).reshape(m, 4).copy(),
            labels=np.frombuffer(self._labels, dtype=np.int32).copy(),
            label_names=self._label_vocab.names,
            difficult=np.ascontiguousarray(flags[:, 0]),
            truncated=np.ascontiguousarray(flags[:, 1]),
            occluded=np.ascontiguousarray(flags[:, 2]),
            object_attributes=obj_attrs,
            object_attribute_vocab=obj_attr_vocab,
            landmarks=landmarks,
            visibility=visibility,
            landmark_names=self._lm_vocab.names,
            problems=self.problems,
            stats=self.stats,
            declared_classes=list(self._declared),
        )


def natural_key(name: str) -> tuple[int, int, str]:
    """Sort key: numeric names by value ("2" before "10"), then the others by text."""
    return (0, int(name), "") if name.isdigit() else (1, 0, name)


def _lut(local: Sequence[str], global_ids: Mapping[str, int]) -> np.ndarray:
    """Lookup table local id -> global id, with a last slot so that MISSING maps to MISSING."""
    return np.asarray([global_ids[s] for s in local] + [MISSING], dtype=np.int32)


def _remap(values: np.ndarray, lut: np.ndarray) -> np.ndarray:
    return lut[values] if len(values) else values.astype(np.int32)


def _merge_attr_tables(
    parts: Sequence[tuple[np.ndarray, list[tuple[str, list[str]]]]], n_rows: int
) -> tuple[np.ndarray, tuple[tuple[str, tuple[str, ...]], ...]]:
    values: dict[str, set[str]] = {}
    for _, vocab in parts:
        for name, vals in vocab:
            values.setdefault(name, set()).update(vals)
    names = sorted(values)
    vocab = tuple((n, tuple(sorted(values[n]))) for n in names)
    col_of = {n: i for i, n in enumerate(names)}
    value_ids = {n: {v: i for i, v in enumerate(vals)} for n, vals in vocab}
    out = np.full((n_rows, len(names)), MISSING, dtype=np.int32)
    start = 0
    for table, local_vocab in parts:
        rows = len(table)
        for j, (name, vals) in enumerate(local_vocab):
            lut = _lut(vals, value_ids[name])
            out[start : start + rows, col_of[name]] = lut[table[:, j]]
        start += rows
    return out, vocab


def merge(
    partials: Sequence[Partial],
    options: ReadOptions,
    *,
    root: str,
    meta: Mapping[str, Any],
    default_landmarks: LandmarkSchema | None = None,
) -> AnnotationIndex:
    """Concatenate chunks (in file order) into one index with global vocabularies.

    Classes: ``options.classes`` when given; else the classes the files declare, in their
    order, then the other names found, sorted (numbers by value). Landmarks: ``options.landmark_schema``; else
    ``default_landmarks`` when every name found belongs to it (readers pass a declared or
    preset schema); else the names in order of first appearance, flip pairs by spelling.
    Images annotated more than once keep their first annotation; the others are reported as
    ``duplicate_image`` errors and dropped.
    """
    problems = [p for part in partials for p in part.problems]
    stats: dict[str, int] = {}
    for part in partials:
        for key, value in part.stats.items():
            stats[key] = stats.get(key, 0) + value

    # vocabularies
    if options.classes is not None:
        classes = tuple(options.classes)
    else:
        declared: dict[str, None] = {}
        for part in partials:
            for name in part.declared_classes:
                declared.setdefault(name, None)
        found = {c for part in partials for c in part.label_names}
        classes = tuple(declared) + tuple(sorted(found - set(declared), key=natural_key))
    class_ids = {c: i for i, c in enumerate(classes)}
    image_classes = tuple(
        sorted({c for part in partials for c in part.image_label_names}, key=natural_key)
    )
    image_class_ids = {c: i for i, c in enumerate(image_classes)}
    if options.landmark_schema is not None:
        schema = options.landmark_schema
    else:
        seen: dict[str, None] = {}
        for part in partials:
            for name in part.landmark_names:
                seen.setdefault(name, None)
        names = tuple(seen)
        if default_landmarks is not None and set(names) <= set(default_landmarks.names) and names:
            schema = default_landmarks
        else:
            schema = LandmarkSchema(names, infer_flip_pairs(names))
    lm_ids = {name: i for i, name in enumerate(schema.names)}
    k = len(schema.names)

    n = sum(len(p.width) for p in partials)
    m = sum(len(p.boxes) for p in partials)
    arrays: dict[str, np.ndarray] = {}
    cat = lambda name, dtype: (  # noqa: E731
        np.concatenate([getattr(p, name) for p in partials]).astype(dtype, copy=False)
        if partials
        else np.zeros(0, dtype=dtype)
    )
    arrays["width"] = cat("width", np.int32)
    arrays["height"] = cat("height", np.int32)
    arrays["verified"] = cat("verified", bool)
    arrays["image_labels"] = (
        np.concatenate([_remap(p.image_labels, _lut(p.image_label_names, image_class_ids)) for p in partials])
        if partials
        else np.zeros(0, np.int32)
    )
    arrays["labels"] = (
        np.concatenate([_remap(p.labels, _lut(p.label_names, class_ids)) for p in partials])
        if partials
        else np.zeros(0, np.int32)
    )
    offsets = np.zeros(n + 1, dtype=np.int64)
    img_start, obj_start = 0, 0
    for p in partials:
        offsets[img_start + 1 : img_start + len(p.width) + 1] = p.object_offsets[1:] + obj_start
        img_start += len(p.width)
        obj_start += len(p.boxes)
    arrays["object_offsets"] = offsets
    arrays["boxes"] = (
        np.concatenate([p.boxes for p in partials]) if partials else np.zeros((0, 4), np.float32)
    )
    for name in ("difficult", "truncated", "occluded"):
        arrays[name] = cat(name, bool)
    landmarks = np.zeros((m, k, 2), dtype=np.float32)
    visibility = np.zeros((m, k), dtype=np.uint8)
    start = 0
    for p in partials:
        rows = len(p.boxes)
        if p.landmark_names:
            cols = np.asarray([lm_ids[name] for name in p.landmark_names], dtype=np.int64)
            landmarks[start : start + rows][:, cols] = p.landmarks
            visibility[start : start + rows][:, cols] = p.visibility
        start += rows
    arrays["landmarks"] = landmarks
    arrays["visibility"] = visibility
    arrays["image_attributes"], image_attr_vocab = _merge_attr_tables(
        [(p.image_attributes, p.image_attribute_vocab) for p in partials], n
    )
    arrays["object_attributes"], obj_attr_vocab = _merge_attr_tables(
        [(p.object_attributes, p.object_attribute_vocab) for p in partials], m
    )
    image_paths = [s for p in partials for s in p.image_paths]
    annotation_paths = [s for p in partials for s in p.annotation_paths]
    arrays["image_paths_blob"], arrays["image_paths_offsets"] = pack_strings(image_paths)
    arrays["annotation_paths_blob"], arrays["annotation_paths_offsets"] = pack_strings(
        annotation_paths
    )
    vocab = Vocabulary(
        classes=classes,
        image_classes=image_classes,
        object_attributes=obj_attr_vocab,
        image_attributes=image_attr_vocab,
        landmarks=schema,
    )
    index = AnnotationIndex(
        root=root,
        arrays=arrays,
        vocab=vocab,
        problems=ProblemReport(problems),
        meta={**meta, "stats": stats},
    )

    first_seen: dict[str, int] = {}
    duplicates: list[Problem] = []
    keep: list[int] = []
    for i, path in enumerate(image_paths):
        j = first_seen.setdefault(path, i)
        if j == i:
            keep.append(i)
        else:
            duplicates.append(
                Problem(
                    "duplicate_image",
                    annotation_paths[i],
                    "filename",
                    f"image {path!r} is already annotated by {annotation_paths[j]}",
                    "annotation skipped",
                )
            )
    if duplicates:
        index = index.subset(keep)
        index.problems = ProblemReport(problems + duplicates)
    return index
