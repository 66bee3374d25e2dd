"""From reader records to a chunk of typed columns (:class:`ChunkBuilder`, :class:`Partial`),
applying the shared rules as it goes.

A reader walks its files and calls :class:`ChunkBuilder` once per image and once per object;
the builder applies the rules of :mod:`detloader.annotations.checks` (boxes, landmarks, sizes)
and the class options, records problems, keeps per-image class lists
(:meth:`ChunkBuilder.add_class_list`), then ``finish()`` turns the chunk into a
:class:`Partial` of numpy arrays (one per field of :data:`~detloader.annotations.fields.FIELDS`)
with chunk-local vocabularies. Chunks are built in worker processes and travel by pickle to
:func:`detloader.annotations.parse.merge`, which merges them in file order.
"""

from __future__ import annotations

from array import array
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from detloader.annotations.checks import (
    Finding,
    ReadOptions,
    box_from_points,
    check_box,
    check_point,
    check_size,
    parse_number,
)
from detloader.annotations.distinct import unique_sorted
from detloader.annotations.fields import (
    CLASS_LISTS,
    FIELDS,
    MISSING,
    OFFSETS,
    AttributeCells,
    Field,
    LocalVocab,
    pack_strings,
    packed_names,
)
from detloader.annotations.problems import Problem, Severity
from detloader.errors import DetloaderError

#: Names of missing images a chunk keeps for the image-folder search (``image_search``).
MISSING_NAMES_KEPT = 256

#: ``array`` type codes of the fields the builder keeps as plain typed columns (bool as 'b').
_TYPECODES = {np.dtype(np.int32): "i", np.dtype(np.int64): "q", np.dtype(np.float32): "f", np.dtype(np.bool_): "b"}
#: Fields held as (row, name, value) cells and as sparse points, not as plain columns.
_ATTRIBUTE_VOCABS = ("image_attributes", "object_attributes")


def _is_column(f: Field) -> bool:
    return f.level in ("image", "object") and f.vocab not in (*_ATTRIBUTE_VOCABS, "landmarks")


def _column_array(col: array, f: Field, rows: int) -> np.ndarray:
    """A typed column as the field's numpy array (a copy, owning its memory)."""
    dtype = np.dtype(f.dtype)
    raw = np.frombuffer(col, dtype=np.int8 if dtype == np.bool_ else dtype)
    return raw.astype(dtype).reshape(f.shape(rows, {}))


class ChunkBuilder:
    """Collects images and objects of one chunk of files, validating as it goes: per file
    :meth:`begin_file`, per image :meth:`add_image` (False: rejected, skip its objects), per object
    :meth:`add_object`; anything wrong goes through :meth:`problem`.
    """

    def __init__(self, options: ReadOptions) -> None:
        self.options = options
        self._class_map = dict(options.class_map)
        self._classes = set(options.classes) if options.classes is not None else None
        self._schema = options.landmark_schema
        self.file = ""
        self.problems: list[Problem] = []
        self.stats: dict[str, int] = {}
        self.missing_names: list[str] = []
        # typed columns, not lists of tuples: a few bytes per object instead of ~2 KB
        self._cols = {f.name: array(_TYPECODES[np.dtype(f.dtype)]) for f in FIELDS if _is_column(f)}
        self._strings: dict[str, list[str]] = {f.name: [] for f in FIELDS if f.level == "string"}
        self._attrs = {name: AttributeCells() for name in _ATTRIBUTE_VOCABS}
        self._names = {"classes": LocalVocab(), "image_classes": LocalVocab(), "landmarks": LocalVocab()}
        self._offsets = array("q", [0])
        self._declared: dict[str, None] = {}
        self._declared_ids: dict[str, int] = {}
        self._frequency: list[tuple[str, str | None, str]] = []
        # per class list: (image row, chunk-local class id) pairs
        self._lists = {name: (array("i"), array("i")) for name in CLASS_LISTS}
        if self._schema is not None:
            for name in self._schema.names:
                self._names["landmarks"].id(name)
        self._lm_rows = array("i")
        self._lm_slots = array("i")
        self._lm_xy = array("f")  # x, y per point
        self._lm_vis = array("B")
        self._open = False
        # objects of the current file boxed from their points (or skipped): count, first element
        self._from_points: tuple[int, str] = (0, "")
        # names in the files before class_map, kept only when there is a class_map to check
        self._file_classes: set[str] = set()

    # -- problems ---------------------------------------------------------------------------
    def begin_file(self, file: str) -> None:
        """Name the annotation file (relative to the root) that the next records come from."""
        self._close_image()
        self._report_from_points()
        self.file = file

    def _report_from_points(self) -> None:
        """One ``box_from_points`` problem for the objects of the current file without a box."""
        n, first = self._from_points
        if not n:
            return
        mode = self.options.boxes_from_points
        what = {
            "enclose": "boxed by the extent of their points", "image": "boxed by the whole image", "skip": "skipped"
        }[mode]
        message = f"{n} objects with landmarks and no box (first: {first})"
        self.problem("box_from_points", "", message, f"{what}, boxes_from_points={mode!r}", "repaired")
        self._from_points = (0, "")

    def problem(
        self, kind: str, element: str, message: str, action: str = "",
        severity: Severity = "error", file: str | None = None,
    ) -> None:
        self.problems.append(Problem(kind, self.file if file is None else file, element, message, action, severity))

    def report(self, finding: Finding, element: str) -> None:
        """Record what a rule of :mod:`~detloader.annotations.checks` found at ``element``."""
        self.problem(finding.kind, element, finding.message, finding.action, finding.severity)

    def declare_classes(
        self, names: Sequence[str], ids: Sequence[int | None] | None = None,
        frequency: Sequence[str | None] | None = None,
    ) -> None:
        """Class names the file declares, in its id order (COCO categories, YOLO ``names``): they keep
        that order and stay without objects; names found but not declared follow, sorted. ``ids``:
        the file's own id of each name (COCO ``category_id``; None: none), kept for evaluation;
        a class named twice (``class_map``) keeps its first id. ``frequency``: each name's LVIS
        frequency group (``"r"`` / ``"c"`` / ``"f"``, checked by the reader; None: none), kept
        in ``index.meta["frequency"]`` (two that disagree for one class: a ``bad_value`` problem).
        """
        for k, name in enumerate(names):
            name = name.strip()
            if self._class_map:
                self._file_classes.add(name)
            mapped = self._class_map.get(name, name)
            if mapped:
                self._declared.setdefault(mapped, None)
                if ids is not None and ids[k] is not None:
                    self._declared_ids.setdefault(mapped, int(ids[k]))  # type: ignore[arg-type]
                if frequency is not None:
                    self._frequency.append((mapped, frequency[k], self.file))

    def add_class_list(self, name: str, classes: Iterable[str]) -> None:
        """Put ``classes`` (names as in the file) on the current image's list ``name``, one of
        :data:`~detloader.annotations.fields.CLASS_LISTS` (``"absent"``, ``"present"``,
        ``"not_exhaustive"``: :meth:`AnnotationIndex.class_list`); repeats are kept once.
        ``class_map`` applies (a class mapped to None is left out and counted in
        ``dropped_by_class_map``); with ``classes=``, a class outside them is left out and counted
        in ``class_list_outside_classes``. Call it after :meth:`add_image` returned True."""
        if not self._open:
            raise DetloaderError("add_class_list before add_image")
        if name not in self._lists:
            raise DetloaderError(f"class list name={name!r} is not one of {', '.join(CLASS_LISTS)}")
        rows, values = self._lists[name]
        row = self.image_count - 1
        for cls in classes:
            cls = cls.strip()
            if self._class_map:
                self._file_classes.add(cls)
            cls = self._class_map.get(cls, cls)
            if cls is None:
                self.count("dropped_by_class_map")
            elif self._classes is not None and cls not in self._classes:
                self.count("class_list_outside_classes")
            elif cls:
                rows.append(row)
                values.append(self._names["classes"].id(cls))

    def missing_image(self, element: str, message: str, name: str) -> None:
        """A ``missing_image`` problem (image skipped); ``name``, the image as the annotation
        names it, is kept (the first :data:`MISSING_NAMES_KEPT`) to look for its folder."""
        if len(self.missing_names) < MISSING_NAMES_KEPT:
            self.missing_names.append(name)
        self.problem("missing_image", element, message, "image skipped")

    def count(self, name: str, n: int = 1) -> None:
        self.stats[name] = self.stats.get(name, 0) + n

    def number(self, text: Any, element: str, fieldname: str, action: str, *, json: bool = False) -> float | None:
        """A coordinate (text, or with ``json`` a JSON value: :func:`~detloader.annotations.checks.parse_number`);
        None, with a ``missing_field`` / ``bad_value`` problem, when it is not one.
        """
        value = parse_number(text, fieldname, action, text=not json)
        if isinstance(value, Finding):
            self.report(value, element)
            return None
        return value

    # -- images -----------------------------------------------------------------------------
    def _close_image(self) -> None:
        if self._open:
            self._offsets.append(len(self._cols["labels"]))
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
        image_id: int | None = None,
    ) -> bool:
        """Start an image. ``path`` is relative to the dataset root; ``record`` names the image
        inside a multi-image file (used in messages), default the annotation file itself;
        ``image_id``: the image's own integer id in the annotations (COCO ``id``), None when the
        format has none (the index then numbers it by its 1-based row)."""
        self._close_image()
        bad = check_size(width, height)
        if bad is not None:
            self.report(bad, "size")
            return False
        cols = self._cols
        cols["width"].append(int(width))
        cols["height"].append(int(height))
        cols["verified"].append(bool(verified))
        cols["image_ids"].append(MISSING if image_id is None else int(image_id))
        self._strings["image_paths"].append(path)
        self._strings["annotation_paths"].append(self.file if record is None else f"{self.file}#{record}")
        cols["image_labels"].append(MISSING if image_class is None else self._names["image_classes"].id(image_class))
        if attributes:
            self._attrs["image_attributes"].add(len(cols["width"]) - 1, attributes)
        self._open = True
        return True

    # -- objects ----------------------------------------------------------------------------
    def add_object(
        self,
        box: Sequence[float] | None,
        name: str,
        *,
        element: str,
        box_field: str = "bndbox",
        difficult: bool = False,
        truncated: bool = False,
        occluded: bool = False,
        crowd: bool = False,
        area: float | None = None,
        attributes: Mapping[str, str] | None = None,
        landmarks: Iterable[tuple[str, float, float, int]] | None = None,
        landmark_field: str = "keypoints",
    ) -> bool:
        """Add one object to the current image. ``box`` is xyxy as in the file, or None for an
        object that has only landmarks (its box made as ``options.boxes_from_points`` says, for
        every format alike); ``landmarks`` are ``(name, x, y, visibility)`` with visibility
        0/1/2; a point's problems are reported at ``{element}/{landmark_field}[k]``, k counting
        from 1; the box's at ``{element}/{box_field}`` (``element`` alone when ``box_field`` is
        empty); ``crowd``: a COCO ``iscrowd`` region (evaluation ignores it as pycocotools does);
        ``area``: the object's own area in px² (COCO ``area``, checked by the reader; None: none).
        Returns False if skipped."""
        if not self._open:
            raise DetloaderError("add_object before add_image")
        name = name.strip()
        if self._class_map:
            self._file_classes.add(name)
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
            self.problem("unknown_class", f"{element}/name", f"name={name!r} is not in classes", "object skipped")
            return False
        cols = self._cols
        w, h = cols["width"][-1], cols["height"][-1]
        points: list[tuple[int, float, float, int]] | None = None
        if box is None:
            box, points = self._box_from_points(landmarks or (), element, f"{element}/{landmark_field}", w, h)
            if box is None:
                return False
        # a box made from points is 0-based already (one_based applies to the points)
        stored, finding = check_box(
            box, w, h, one_based=self.options.one_based and points is None, clip=self.options.clip_boxes
        )
        if finding is not None:
            self.report(finding, f"{element}/{box_field}" if box_field else element)
        if stored is None:
            return False
        row = len(cols["labels"])
        cols["boxes"].extend(stored)
        cols["labels"].append(self._names["classes"].id(name))
        cols["difficult"].append(bool(difficult))
        cols["truncated"].append(bool(truncated))
        cols["occluded"].append(bool(occluded))
        cols["crowd"].append(bool(crowd))
        cols["area"].append(MISSING if area is None else float(area))
        if attributes:
            self._attrs["object_attributes"].add(row, attributes)
        if points is None and landmarks is not None:
            points = self._check_points(landmarks, f"{element}/{landmark_field}", w, h)
        if points:
            self._store_points(row, points)
        return True

    @property
    def image_count(self) -> int:
        """Images added to this chunk so far."""
        return len(self._cols["width"])

    def add_objects(
        self, first_image: int, image_rows: np.ndarray, boxes: np.ndarray, labels: np.ndarray,
        names: Sequence[str], crowd: np.ndarray, area: np.ndarray,
    ) -> None:
        """Objects of the images added since chunk row ``first_image`` (which have none yet), all at
        once: their non-decreasing ``image_rows``, checked xyxy ``boxes``, ``labels`` indexing
        ``names`` (class options not applied: the caller makes sure there are none), ``crowd`` and
        ``area`` (:data:`MISSING`: none)."""
        self._close_image()
        offsets, start = np.frombuffer(self._offsets, dtype=np.int64), len(self._cols["labels"])
        unfit = len(offsets) != self.image_count + 1 or bool((offsets[first_image:] != start).any())
        del offsets  # a view would keep the array from being resized
        if unfit:
            raise DetloaderError("add_objects after objects of those images were added")
        counts = np.bincount(np.asarray(image_rows, np.int64) - first_image, minlength=self.image_count - first_image)
        del self._offsets[first_image + 1 :]
        self._offsets.frombytes((start + np.cumsum(counts)).astype(np.int64).tobytes())
        lut = np.zeros(len(names) + 1, dtype=np.int32)
        for k in np.unique(labels).tolist():  # only the classes used, as add_object does
            lut[k] = self._names["classes"].id(names[k].strip())
        cols, m = self._cols, len(labels)
        cols["boxes"].frombytes(np.ascontiguousarray(boxes, dtype=np.float32).tobytes())
        cols["labels"].frombytes(lut[np.asarray(labels, np.int64)].tobytes())
        for flag in ("difficult", "truncated", "occluded"):
            cols[flag].frombytes(bytes(m))
        cols["crowd"].frombytes(np.asarray(crowd, dtype=np.int8).tobytes())
        cols["area"].frombytes(np.asarray(area, dtype=np.float32).tobytes())

    def _box_from_points(
        self, landmarks: Iterable[tuple[str, float, float, int]], element: str, where: str, w: int, h: int
    ) -> tuple[tuple[float, float, float, float] | None, list[tuple[int, float, float, int]]]:
        """The box of an object without one (``options.boxes_from_points``; None when it is
        skipped) and its checked points; counted for the file's ``box_from_points`` report."""
        mode = self.options.boxes_from_points
        n, first = self._from_points
        if mode == "skip":
            self._from_points = (n + 1, first or element)
            self.count("points_without_box_skipped")
            return None, []
        points = self._check_points(landmarks, where, w, h)
        box = box_from_points([(x, y) for _, x, y, v in points if v], w, h, mode)
        if box is None:
            self.problem("box_from_points", element, "no box and no labelled point to make one from", "object skipped")
            return None, points
        self._from_points = (n + 1, first or element)
        self.count("boxes_from_points")
        return box, points

    def positional_names(self, n: int, element: str, default: Sequence[str] | None = None) -> list[str] | None:
        """Names for ``n`` unnamed, ordered landmarks: the user's schema when given (and the
        count matches), else ``default`` (when its length is n), else ``p0 .. p{n-1}``."""
        if self._schema is not None:
            if len(self._schema.names) != n:
                message = f"{n} points, landmark schema has {len(self._schema.names)}"
                self.problem("landmark_count", element, message, "landmarks skipped")
                return None
            return list(self._schema.names)
        if default is not None and len(default) == n:
            return list(default)
        return [f"p{i}" for i in range(n)]

    def _check_points(
        self, landmarks: Iterable[tuple[str, float, float, int]], where: str, w: int, h: int
    ) -> list[tuple[int, float, float, int]]:
        """The landmarks as checked ``(slot, x, y, visibility)``; problems reported at
        ``{where}[k]``."""
        vocab = self._names["landmarks"]
        out: list[tuple[int, float, float, int]] = []
        for k, (name, x, y, v) in enumerate(landmarks, start=1):
            if self._schema is not None and name not in vocab.ids:
                self.problem(
                    "unknown_landmark", f"{where}[{k}]", f"name={name!r} is not in the landmark schema", "point skipped"
                )
                continue
            slot = vocab.id(name)
            point, finding = check_point(name, x, y, v, w, h, one_based=self.options.one_based)
            if finding is not None:
                self.report(finding, f"{where}[{k}]")
            if point is not None:
                out.append((slot, *point))
        return out

    def _store_points(self, row: int, points: Sequence[tuple[int, float, float, int]]) -> None:
        for slot, x, y, v in points:
            self._lm_rows.append(row)
            self._lm_slots.append(slot)
            self._lm_xy.extend((x, y))
            self._lm_vis.append(v)

    # -- result -----------------------------------------------------------------------------
    def _class_list_arrays(self, n: int) -> dict[str, np.ndarray]:
        """Each class list as its two arrays (:func:`~detloader.annotations.fields.packed_names`):
        chunk-local class ids, each image's sorted and distinct, and int64 offsets ``[n + 1]``."""
        out: dict[str, np.ndarray] = {}
        for name, (rows, values) in self._lists.items():
            # (row, class) pairs as one int64 key each (both >= 0), distinct and sorted by row, then class
            row_ids, class_ids = np.frombuffer(rows, np.int32), np.frombuffer(values, np.int32)
            keys = unique_sorted((row_ids.astype(np.int64) << 32) | class_ids)
            offsets = np.zeros(n + 1, dtype=np.int64)
            np.cumsum(np.bincount(keys >> 32, minlength=n), out=offsets[1:])
            data_name, offsets_name = packed_names(next(f for f in FIELDS if f.name == name))
            out[data_name], out[offsets_name] = (keys & 0xFFFFFFFF).astype(np.int32), offsets
        return out

    def _landmark_arrays(self, m: int) -> dict[str, np.ndarray]:
        k = len(self._names["landmarks"].names)
        landmarks = np.zeros((m, k, 2), dtype=np.float32)
        visibility = np.zeros((m, k), dtype=np.uint8)
        if len(self._lm_rows):
            rows = np.frombuffer(self._lm_rows, dtype=np.int32)
            slots = np.frombuffer(self._lm_slots, dtype=np.int32)
            landmarks[rows, slots] = np.frombuffer(self._lm_xy, dtype=np.float32).reshape(-1, 2)
            visibility[rows, slots] = np.frombuffer(self._lm_vis, dtype=np.uint8)
        return {"landmarks": landmarks, "visibility": visibility}

    def finish(self) -> Partial:
        """The chunk as a :class:`Partial` (call once, after the last record)."""
        self._close_image()
        self._report_from_points()
        rows = {"image": len(self._cols["width"]), "object": len(self._cols["labels"])}
        arrays = {OFFSETS: np.frombuffer(self._offsets, dtype=np.int64).copy()}
        vocabs: dict[str, Any] = {name: v.names for name, v in self._names.items()}
        points = self._landmark_arrays(rows["object"])
        arrays.update(self._class_list_arrays(rows["image"]))
        for f in FIELDS:
            if f.level == "string":
                data_name, offsets_name = packed_names(f)
                arrays[data_name], arrays[offsets_name] = pack_strings(self._strings[f.name])
            elif f.name in self._cols:
                arrays[f.name] = _column_array(self._cols[f.name], f, rows[f.level])
            elif f.vocab in self._attrs:
                arrays[f.name], vocabs[f.vocab] = self._attrs[f.vocab].finish(rows[f.level])
            elif f.name in points:
                arrays[f.name] = points[f.name]
        return Partial(
            arrays=arrays,
            vocabs=vocabs,
            problems=self.problems,
            stats=self.stats,
            declared_classes=list(self._declared),
            declared_class_ids=dict(self._declared_ids),
            class_frequency=self._frequency,
            missing_names=self.missing_names,
            file_classes=sorted(self._file_classes),
        )


@dataclass
class Partial:
    """One chunk of a dataset as arrays, with chunk-local vocabularies (see ``merge``).

    ``arrays``: every field of ``FIELDS`` (the class lists and the strings as their two arrays)
    plus ``object_offsets``, with chunk-local ids;
    ``vocabs``: for each vocabulary a field refers to, the local names in id order (attribute
    tables: ``(attribute, values)`` pairs); ``missing_names``: the first images not found.
    """

    arrays: dict[str, np.ndarray]
    vocabs: dict[str, Any]
    problems: list[Problem]
    stats: dict[str, int] = field(default_factory=dict)
    declared_classes: list[str] = field(default_factory=list)
    #: the id the files give each declared class (COCO category id), when they give one
    declared_class_ids: dict[str, int] = field(default_factory=dict)
    #: (class, LVIS frequency group or None, file) as the files declare them, in file order
    class_frequency: list[tuple[str, str | None, str]] = field(default_factory=list)
    missing_names: list[str] = field(default_factory=list)
    #: class names in the files before ``class_map`` (only collected when there is one)
    file_classes: list[str] = field(default_factory=list)

    @property
    def landmark_names(self) -> list[str]:
        """Landmark names found in the chunk, in local slot order."""
        names: list[str] = self.vocabs["landmarks"]
        return names
