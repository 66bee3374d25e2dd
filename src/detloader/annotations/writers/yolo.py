"""YOLO writer (Ultralytics layout): ``images/``, ``labels/*.txt``, ``data.yaml``, split lists."""

from __future__ import annotations

import os
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from detloader._files import write_file
from detloader.annotations.index import AnnotationIndex
from detloader.annotations.writers.common import ImagePlacer, prepare_out
from detloader.errors import DetloaderValueError, YoloExportWarning

#: Index split names that map to Ultralytics' data.yaml keys.
YOLO_SPLIT_KEYS = {
    "train": "train",
    "training": "train",
    "val": "val",
    "valid": "val",
    "validation": "val",
    "test": "test",
    "testing": "test",
}


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

    ``images="none"`` is refused: YOLO finds a label from its image's path. ``val_fraction`` holds
    out a seeded fraction of the training images as ``val.txt`` (refused with a val split); what is
    kept and why ``val`` may name the training images: docs/formats.md ("Writing").
    """
    if images == "none":
        raise DetloaderValueError("images='none' is not possible for YOLO (labels are found from image paths); "
                         "choose one of link, copy, symlink")
    if val_fraction is not None and not (isinstance(val_fraction, (int, float)) and 0 < val_fraction < 1):
        raise DetloaderValueError(f"val_fraction={val_fraction!r} must be a number between 0 and 1 (exclusive)")
    placer = ImagePlacer(index, images)
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
        write_file(label_file, "".join(rows))
    config: dict[str, Any] = {}
    train: np.ndarray | None = None
    for split, members in index.splits.items():
        _write_list(root, f"{split}.txt", targets, members)
        key = YOLO_SPLIT_KEYS.get(split.lower())
        if key is not None and key not in config and len(members):
            config[key] = f"{split}.txt"
            if key == "train":
                train = members
    if val_fraction is not None:
        if "val" in config:
            raise DetloaderValueError(
                f"val_fraction={val_fraction}: the index has a val split already ({config['val']}); "
                "pass val_fraction only for a dataset without one"
            )
        pool = np.arange(len(index)) if train is None else np.asarray(train, dtype=np.int64)
        parts = _hold_out(pool, float(val_fraction), seed)
        for key in ("train", "val"):
            config[key] = _write_list(root, f"{key}.txt", targets, parts[key])
    config.setdefault("train", "images")
    if "val" not in config:
        config["val"] = config["train"]
        warnings.warn(
            f"{root / 'data.yaml'}: the index has no val split, so val names the training images "
            f"({config['train']}; Ultralytics requires a val key); pass val_fraction= "
            "(convert --val-fraction) to hold some out",
            YoloExportWarning,
            stacklevel=2,
        )
    config["nc"] = len(index.classes)
    config["names"] = {c: name for c, name in enumerate(index.classes)}
    if k:
        flip = schema.flip_permutation()
        config["kpt_shape"] = [k, 3]
        config["flip_idx"] = [int(v) for v in flip]
        config["kpt_names"] = {c: list(schema.names) for c in range(len(index.classes))}
    path = root / "data.yaml"
    write_file(path, yaml.safe_dump(config, sort_keys=False, allow_unicode=True))
    return path


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
