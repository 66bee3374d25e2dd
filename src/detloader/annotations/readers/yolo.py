"""YOLO txt labels (Darknet / Ultralytics), detection and pose, with ``data.yaml``.

One label file per image, one object per line, normalised to 0..1 by the image size, so every
image header is read for its size. Layouts, ``data.yaml`` keys and label lines: docs/formats.md
("Each reader's files and layouts").
"""

from __future__ import annotations

import os
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from detloader._system.files import read_capped
from detloader.annotations.builder import ChunkBuilder
from detloader.annotations.checks import ReadOptions
from detloader.annotations.index import AnnotationIndex
from detloader.annotations.landmarks import LandmarkSchema, preset_schema
from detloader.annotations.problems import Problem, problems_of
from detloader.annotations.readers.common import (
    Reader,
    Source,
    Stamp,
    check_options,
    find_child_dir,
    is_number,
    parse_floats,
    read_head,
    stat_entry,
)
from detloader.annotations.readers.locate import IMAGE_SUFFIXES, size_from_header
from detloader.annotations.readers.yolo_config import (
    class_names,
    find_names_file,
    find_yaml,
    images_under,
    kpt_config,
    load_yaml,
    split_images,
)
from detloader.annotations.splits import match_entries, split_role
from detloader.errors import NotRegularFileError, YoloConfigError

NAME = "yolo"
#: Format options this reader accepts (``read_annotations(path, **options)``).
OPTIONS: tuple[str, ...] = ()
SPLIT_KEYS = ("train", "val", "test")
_YAML_KEY = re.compile(rb"^(names|train|val|kpt_shape|nc)\s*:", re.MULTILINE)
#: Normalised coordinates this far outside 0..1 are rounding noise, snapped to the edge.
SNAP = 1e-6


def label_path(root: str, image_rel: str) -> str:
    """Label file of an image, relative to ``root``: the last ``/images/`` of the absolute
    image path replaced by ``/labels/``, the extension by ``.txt`` (Ultralytics' rule)."""
    full = os.path.join(root, image_rel)
    sa, sb = f"{os.sep}images{os.sep}", f"{os.sep}labels{os.sep}"
    if sa in full:
        head, tail = full.rsplit(sa, 1)
        full = head + sb + tail
    return os.path.relpath(os.path.splitext(full)[0] + ".txt", root)


@dataclass(kw_only=True)
class YoloSource(Source):
    """data.yaml (or the class-names file) relative to the root, what it declares, the split entries."""

    config: str | None
    names_file: str | None
    names: list[str]
    kpt: dict[str, Any] | None
    split_entries: dict[str, list[str]]
    #: links to folders outside the dataset are followed (``allow_outside_images``)
    follow_outside: bool = False


def _snap(value: float) -> float:
    if -SNAP <= value < 0.0:
        return 0.0
    if 1.0 < value <= 1.0 + SNAP:
        return 1.0
    return value


def _parse_image(
    root: str, rel: str, label: str, names: list[str], kpt: dict[str, Any] | None, b: ChunkBuilder
) -> None:
    size = size_from_header(b, root, rel, "image")
    if size is None:
        return
    width, height = size
    full = os.path.join(root, label)
    text = ""
    try:
        text = read_capped(full, b.options.max_file_bytes).decode("utf-8")
    except FileNotFoundError:
        pass  # a background image (named as unannotated_image by discover)
    except OSError as err:
        kind = "not_a_regular_file" if isinstance(err, NotRegularFileError) else "unreadable_file"
        b.problem(kind, "", f"{err.strerror or err}", "labels skipped")
    except UnicodeDecodeError as err:
        b.problem("unparseable", "", f"not UTF-8 text: {err.reason}", "labels skipped")
    except ValueError as err:
        b.problem("file_too_large", "", str(err), "labels skipped")
    if not b.add_image(rel, width, height):
        return
    segments: list[tuple[int, int]] = []  # (line, values after the class) of lines read as segments
    for n, line in enumerate(text.splitlines(), start=1):
        tokens = line.split()
        if tokens and _line(tokens, f"line {n}", names, kpt, width, height, b):
            segments.append((n, len(tokens) - 1))
    if segments:  # a pose line without kpt_shape looks the same: say so, once per file
        n, count = segments[0]
        lines = f"{len(segments)} line{'s' if len(segments) > 1 else ''} of this file"
        message = f"{count} values after the class and no kpt_shape: a segment of {count // 2} points ({lines})"
        action = "boxed by the extent of its points; keypoints need kpt_shape in data.yaml"
        b.problem("box_from_segment", f"line {n}", message, action, "repaired")


def _line(
    tokens: list[str], where: str, names: list[str], kpt: dict[str, Any] | None, w: int, h: int, b: ChunkBuilder
) -> bool:
    """Add the object of one label line (problems reported); whether it was read as a segment
    (x y pairs, boxed by their extent)."""
    raw_class = float(tokens[0]) if is_number(tokens[0]) else -1.0
    if not raw_class.is_integer() or raw_class < 0:
        b.problem("bad_value", where, f"class={tokens[0]!r} is not a class id", "object skipped")
        return False
    class_id = int(raw_class)
    if names and class_id >= len(names):
        b.problem("bad_value", where, f"class={class_id} is not in names (0..{len(names) - 1})", "object skipped")
        return False
    name = names[class_id] if names else str(class_id)
    values = parse_floats(tokens[1:], where, b, "object skipped")
    if values is None:
        return False
    points = None
    if kpt is not None and len(values) != 4:
        expected = 4 + kpt["k"] * kpt["dims"]
        if len(values) == expected:
            points = _keypoints(values[4:], kpt, where, w, h, b)
        else:
            message = f"{len(values)} values after the class; kpt_shape needs 4 or {expected}"
            b.problem("landmark_count", where, message, "landmarks skipped")
        box_values = values[:4]
    elif len(values) == 4:
        box_values = values
    elif len(values) >= 6 and len(values) % 2 == 0:
        xs, ys = values[0::2], values[1::2]
        x1, x2, y1, y2 = min(xs), max(xs), min(ys), max(ys)
        box_values = [(x1 + x2) / 2, (y1 + y2) / 2, x2 - x1, y2 - y1]
        b.count("boxes_from_segments")
    else:
        message = f"{len(values)} values after the class: not cx cy w h"
        if len(values) > 4:  # a pose line whose kpt_shape is missing, most likely
            message += " nor a segment's x y pairs (keypoints need kpt_shape in data.yaml)"
        b.problem("bad_value", where, message, "object skipped")
        return False
    cx, cy, bw, bh = box_values
    x1, x2 = _snap(cx - bw / 2), _snap(cx + bw / 2)
    y1, y2 = _snap(cy - bh / 2), _snap(cy + bh / 2)
    b.add_object((x1 * w, y1 * h, x2 * w, y2 * h), name, element=where, box_field="", landmarks=points)
    return len(values) > 4 and kpt is None


def _keypoints(
    values: list[float], kpt: dict[str, Any], where: str, w: int, h: int, b: ChunkBuilder
) -> list[tuple[str, float, float, int]] | None:
    k, d = kpt["k"], kpt["dims"]
    names = b.positional_names(k, f"{where}/keypoints", kpt["names"])
    if names is None:
        return None
    out: list[tuple[str, float, float, int]] = []
    for i, name in enumerate(names):
        x, y = values[i * d], values[i * d + 1]
        if d == 3:
            v = values[i * d + 2]
            if v not in (0.0, 1.0, 2.0):
                message = f"{name}: v={v:g} is not 0, 1 or 2"
                b.problem("bad_value", f"{where}/keypoints[{i + 1}]", message, "point skipped")
                continue
            vis = int(v)
        else:
            vis = 0 if x == 0.0 and y == 0.0 else 2
        out.append((name, 0.0, 0.0, 0) if vis == 0 else (name, _snap(x) * w, _snap(y) * h, vis))
    return out


def _has_labels(folder: Path) -> bool:
    """Whether ``folder`` has a ``labels/`` folder with a ``.txt`` file in it (at any depth)."""
    labels = find_child_dir(folder, ("labels",))
    return labels is not None and next(labels.rglob("*.txt"), None) is not None


def _split_labels(path: Path) -> bool:
    """Whether a split folder one or two levels below ``path`` (``train/``, ``train_zip/train/``,
    :func:`~detloader.annotations.splits.split_role`) has a ``labels/`` folder with labels."""
    def folders(parent: Path) -> list[Path]:  # by the entries' types: no stat per file of a 100,000-file folder
        with os.scandir(parent) as entries:
            return sorted(Path(e.path) for e in entries if not e.name.startswith(".") and e.is_dir())

    try:
        for child in folders(path):
            below = [child] if split_role(child.name) else folders(child)
            if any(split_role(p.name) and _has_labels(p) for p in below):
                return True
    except OSError:
        return False
    return False


class YoloReader(Reader):
    """YOLO txt labels with data.yaml (see the module docstring)."""

    name = NAME

    def sniff(self, path: Path) -> bool:
        """A YAML file with YOLO keys; a folder with ``data.yaml``, a ``labels/`` folder (also in
        split folders one or two levels down: ``train/labels/``, ``train_zip/train/labels/``), or
        a class-names file and images with ``.txt`` labels beside them."""
        if path.is_file():
            return path.suffix.lower() in (".yaml", ".yml") and bool(_YAML_KEY.search(read_head(path, 16384)))
        if not path.is_dir():
            return False
        if find_yaml(path) is not None:
            return True
        if _has_labels(path) or _split_labels(path):
            return True
        if find_names_file(path) is not None:
            stems = {p.stem for p in path.iterdir() if p.suffix.lower() == ".txt"}
            return any(p.stem in stems for p in path.iterdir() if p.suffix.lower() in IMAGE_SUFFIXES)
        return False

    def discover(self, path: Path, options: ReadOptions) -> YoloSource:
        """The YOLO dataset at ``path``: data.yaml (or the folder layout), images and their labels."""
        check_options(options, NAME, OPTIONS)
        path = path.resolve()
        config = path if path.is_file() else find_yaml(path)
        stamp: list[Stamp] = []
        problems: list[Problem] = []
        split_specs: dict[str, list[str]] = {}
        kpt = None
        follow = options.allow_outside_images
        if config is not None:
            data = load_yaml(config)
            where = config.name
            root = config.parent
            declared = data.get("path")
            if isinstance(declared, str) and declared.strip():
                candidate = Path(declared) if os.path.isabs(declared) else config.parent / declared
                if candidate.is_dir():
                    root = candidate.resolve()
            names = class_names(data.get("names"), where)
            kpt = kpt_config(data, where)
            images: dict[str, Stamp] = {}
            for key in SPLIT_KEYS:
                value = data.get(key)
                if value is None or value == "":
                    continue
                entries = [str(v) for v in value] if isinstance(value, list) else [str(value)]
                split_specs[key] = entries
                for entry in entries:
                    for item in split_images(entry, root, f"{where}: {key}", problems, follow):
                        images.setdefault(item[0], item)
                    list_file = Path(entry) if os.path.isabs(entry) else root / entry
                    if list_file.is_file():
                        stamp.append(stat_entry(list_file, root))
            if not split_specs:
                raise YoloConfigError(f"{where}: none of {', '.join(SPLIT_KEYS)} names any images")
            stamp.append(stat_entry(config, root))
            names_file = None
            image_list = sorted(images.values())
        else:
            root = path
            image_top = Path(options.image_dir) if options.image_dir else (find_child_dir(root, ("images",)) or root)
            image_list = images_under(image_top, root, problems, follow)
            names_file = find_names_file(root, find_child_dir(root, ("labels",)))
            names = []
            if names_file is not None:
                names = [line.strip() for line in names_file.read_text(encoding="utf-8").splitlines() if line.strip()]
                stamp.append(stat_entry(names_file, root))
        files = [item[0] for item in image_list]
        stamp.extend(image_list)
        labels, alone = 0, []
        for rel in files:
            label = label_path(str(root), rel)
            try:
                stamp.append(stat_entry(os.path.join(root, label), root))
                labels += 1
            except OSError:
                alone.append((label, "", f"no label file for {rel}"))
        if labels:  # a folder of images only is refused by format='yolo', or not YOLO at all
            problems += problems_of("unannotated_image", alone, "kept as a background image (no objects)")
        return YoloSource(
            root=root,
            files=files,
            stamp=stamp,
            labelled=labels > 0,
            problems=problems,
            config=os.path.relpath(config, root) if config is not None else None,
            names_file=os.path.relpath(names_file, root) if names_file is not None else None,
            names=names,
            kpt=kpt,
            split_entries=split_specs,
            follow_outside=follow,
        )

    def parse_file(self, source: YoloSource, rel: str, builder: ChunkBuilder) -> None:
        root = str(source.root)
        builder.declare_classes(source.names)  # ids index names: keep that order, and unused classes
        label = label_path(root, rel)
        builder.begin_file(label)
        _parse_image(root, rel, label, source.names, source.kpt, builder)

    def splits(self, source: YoloSource, index: AnnotationIndex) -> dict[str, np.ndarray]:
        """``train`` / ``val`` / ``test`` of data.yaml -> image positions; images not in the index
        (``split_mismatch``) and listed twice (``split_duplicate``) are named."""
        if not source.split_entries:
            return {}
        position = {p: i for i, p in reversed(list(enumerate(index.image_paths())))}
        where = source.config or "data.yaml"
        out: dict[str, np.ndarray] = {}
        for key, entries in source.split_entries.items():
            listed = (
                (f"{key}: {entry}", os.path.normpath(rel))
                for entry in entries
                for rel, *_ in split_images(entry, source.root, f"{where}: {key}", None, source.follow_outside)
            )
            out[key] = match_entries(index, where, listed, position)
            index.meta.setdefault("split_sources", {})[key] = f"{where}: {key}"
        return out

    def default_landmarks(self, source: YoloSource, names: Sequence[str]) -> LandmarkSchema | None:
        """``kpt_names`` (or p0..) with the pairs of ``flip_idx``; without kpt_shape a preset."""
        kpt = source.kpt
        if kpt is None:
            return preset_schema(names)
        pairs = tuple(tuple(p) for p in kpt["flip_pairs"])
        return LandmarkSchema(tuple(kpt["names"]), pairs, symmetric=kpt["symmetric"])  # type: ignore[arg-type]
