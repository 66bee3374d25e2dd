"""YOLO writer (Ultralytics layout): ``images/``, ``labels/*.txt``, ``data.yaml``, split lists."""

from __future__ import annotations

import os
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from detloader._system.files import write_file
from detloader.annotations.index import AnnotationIndex
from detloader.annotations.splits import split_role
from detloader.annotations.writers.common import ImagePlacer, prepare_out
from detloader.errors import DetloaderValueError, YoloExportWarning


def write_yolo(
    index: AnnotationIndex,
    out: str | os.PathLike[str],
    *,
    images: str = "link",
    overwrite: bool = False,
    val_fraction: float | None = None,
    seed: int = 0,
) -> Path:
    """Write ``out/images/<image>``, ``out/labels/<image>.txt``, ``<split>.txt`` lists and
    ``out/data.yaml``; return the YAML's path.

    data.yaml names the first non-empty split of each role (``train``, ``val``, ``test``:
    :func:`~detloader.annotations.splits.split_role`), or ``train: images`` when the index has
    no splits; it names no split the index does not have. Ultralytics needs ``train`` and
    ``val``: a key left out, and a split data.yaml cannot name (``trainval``), is said in a
    :class:`YoloExportWarning`. An image in none of the named splits would be lost (YOLO reads
    the images data.yaml names): refused. ``images="none"`` is refused: YOLO finds a label from
    its image's path. ``val_fraction`` holds out a seeded fraction of the train split (or, with
    none, of the images in no split) as ``val.txt`` (refused with a val split).
    docs/formats.md ("Writing").
    """
    if images == "none":
        raise DetloaderValueError("images='none' is not possible for YOLO (labels are found from image paths); "
                         "choose one of link, copy, symlink")
    if val_fraction is not None and not (isinstance(val_fraction, (int, float)) and 0 < val_fraction < 1):
        raise DetloaderValueError(f"val_fraction={val_fraction!r} must be a number between 0 and 1 (exclusive)")
    placer = ImagePlacer(index, images, names_as_text=bool(index.splits) or val_fraction is not None)  # lists
    named, cut = _named_splits(index, val_fraction, seed)
    whole = not index.splits and val_fraction is None  # train: images
    left = _unlisted(index, named, cut) if not whole else np.zeros(0, dtype=np.int64)
    if len(left):
        raise DetloaderValueError(
            f"write_yolo: {len(left)} of {len(index)} images are in none of the splits data.yaml can name "
            f"({', '.join(named.values()) or 'none'}), first {index.relative_image_path(int(left[0]))!r}; YOLO "
            "reads only the images data.yaml names, so they would be lost. Write one split (split=, convert "
            "--split NAME), or give every image a train/val/test split first (detloader split SRC --force)"
        )
    root = prepare_out(out, overwrite)
    img_dir, lbl_dir = root / "images", root / "labels"
    lbl_dir.mkdir(exist_ok=True)
    schema = index.landmark_schema
    k = len(schema)
    targets: list[Path] = []
    for i in range(len(index)):
        target = placer.place(i, img_dir)
        targets.append(target)
        label_file = lbl_dir / (os.path.splitext(placer.keys[i])[0] + ".txt")
        label_file.parent.mkdir(parents=True, exist_ok=True)
        write_file(label_file, _label_text(index, i))
    config: dict[str, Any] = {}
    for split, members in index.splits.items():
        _write_list(root, f"{split}.txt", targets, members)
    if whole:
        config["train"] = "images"
    for key in ("train", "val", "test"):
        if key in cut:
            config[key] = _write_list(root, f"{key}.txt", targets, cut[key])
        elif key in named:
            config[key] = f"{named[key]}.txt"
    path = root / "data.yaml"
    notes = _notes(index, named, config, path)
    config["nc"] = len(index.classes)
    config["names"] = {c: name for c, name in enumerate(index.classes)}
    if k:
        flip = schema.flip_permutation()
        config["kpt_shape"] = [k, 3]
        config["flip_idx"] = [int(v) for v in flip]
        config["kpt_names"] = {c: list(schema.names) for c in range(len(index.classes))}
    comments = "".join(f"# {note}\n" for note in notes)
    write_file(path, comments + yaml.safe_dump(config, sort_keys=False, allow_unicode=True))
    for note in notes:
        warnings.warn(f"{path}: {note}", YoloExportWarning, stacklevel=2)
    return path


def _named_splits(
    index: AnnotationIndex, val_fraction: float | None, seed: int
) -> tuple[dict[str, str], dict[str, np.ndarray]]:
    """The split data.yaml names for each key (``train``, ``val``, ``test``: the first
    non-empty split of that role), and with ``val_fraction`` the ``train`` / ``val`` parts held
    out of the train split (or of the images in no split); refused when a val split exists."""
    named: dict[str, str] = {}  # data.yaml key -> split
    for split, members in index.splits.items():
        key = split_role(split)
        if key is not None and key not in named and len(members):
            named[key] = split
    cut: dict[str, np.ndarray] = {}
    if val_fraction is not None:
        if "val" in named:
            raise DetloaderValueError(
                f"val_fraction={val_fraction}: the index has a val split already ({named['val']}); "
                "pass val_fraction only for a dataset without one"
            )
        pool = index.splits[named["train"]] if "train" in named else _unlisted(index, named)
        cut = _hold_out(np.asarray(pool, dtype=np.int64), float(val_fraction), seed)
    return named, cut


def _label_text(index: AnnotationIndex, i: int) -> str:
    """Image ``i``'s label file: a line per object, ``class cx cy w h`` normalised by the
    image's size, then ``x y visibility`` per landmark (``0 0 0`` when absent)."""
    w, h = float(index.width[i]), float(index.height[i])
    rows = []
    for j in range(int(index.object_offsets[i]), int(index.object_offsets[i + 1])):
        x1, y1, x2, y2 = (float(v) for v in index.boxes[j])
        fields = [
            str(int(index.labels[j])),
            repr((x1 + x2) / 2 / w),
            repr((y1 + y2) / 2 / h),
            repr((x2 - x1) / w),
            repr((y2 - y1) / h),
        ]
        for (x, y), v in zip(index.landmarks[j], index.visibility[j]):
            fields += [repr(float(x) / w), repr(float(y) / h), str(int(v))] if v else ["0", "0", "0"]
        rows.append(" ".join(fields) + "\n")
    return "".join(rows)


def _unlisted(index: AnnotationIndex, named: dict[str, str], cut: dict[str, np.ndarray] | None = None) -> np.ndarray:
    """Image ids in none of the ``named`` splits (and none of ``cut``'s parts), sorted."""
    listed = np.zeros(len(index), dtype=bool)
    for split in named.values():
        listed[index.splits[split]] = True
    for ids in (cut or {}).values():
        listed[ids] = True
    return np.flatnonzero(~listed)


def _notes(index: AnnotationIndex, named: dict[str, str], config: dict[str, Any], path: Path) -> list[str]:
    """What data.yaml leaves out, one sentence each (the YAML's comments and the warnings)."""
    notes = []
    missing = [key for key in ("train", "val") if key not in config]
    if missing:
        notes.append(
            f"no {' or '.join(missing)} split, so data.yaml has no {' or '.join(missing)} key; Ultralytics needs "
            "train and val"
            + ("; pass val_fraction= (convert --val-fraction 0.2) to hold out part of train as val, or give the "
               "source a val split (detloader split SRC --val 0.2) and write again" if "val" in missing else "")
        )
    dropped = [split for split in index.splits if split not in named.values() and len(index.splits[split])]
    for split in dropped:
        notes.append(f"{split} is written as {split}.txt but {path.name} names one train, val and test split "
                     "only: it is not read back as a split")
    return notes


def _write_list(root: Path, name: str, targets: list[Path], members: Any) -> str:
    """Write the image list ``root/name`` (``./images/...`` lines) and return ``name``."""
    lines = "".join(f"./{targets[int(m)].relative_to(root).as_posix()}\n" for m in members)
    write_file(root / name, lines)
    return name


def _hold_out(pool: np.ndarray, fraction: float, seed: int) -> dict[str, np.ndarray]:
    """``pool`` (image ids) cut at random (seeded) into train and val: ``round(fraction * n)``
    images to val, at least one and never all when there are two or more."""
    n = len(pool)
    n_val = min(max(1, round(fraction * n)), n - 1) if n > 1 else 0
    shuffled = pool[np.random.default_rng(seed).permutation(n)]
    return {"train": np.sort(shuffled[n_val:]), "val": np.sort(shuffled[:n_val])}
