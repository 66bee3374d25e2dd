"""YOLO writer (Ultralytics layout): ``images/``, ``labels/*.txt``, ``data.yaml``, split lists."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import yaml

from detloader.annotations.index import AnnotationIndex
from detloader.annotations.writers.common import ImagePlacer, prepare_out

__all__ = ["YOLO_SPLIT_KEYS", "write_yolo"]

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
) -> Path:
    """Write ``out/images/<image>``, ``out/labels/<image>.txt`` and ``out/data.yaml``; return
    the YAML's path.

    Labels: ``class cx cy w h`` normalised by the image size, plus ``K x (px py v)`` when the
    index has landmarks (YOLO-pose; objects without points get zeros, v = 0). data.yaml:
    ``names``, ``nc``, and with landmarks ``kpt_shape: [K, 3]``, ``flip_idx`` (from the flip
    pairs) and ``kpt_names``. Splits named train / val / test (or training, valid,
    validation, testing) become ``.txt`` image lists under those keys; without them
    ``train`` and ``val`` both name ``images``. YOLO holds no flags, attributes or image
    classes. ``images="none"`` is refused: YOLO finds a label from its image's path.
    """
    if images == "none":
        raise ValueError("images='none' is not possible for YOLO (labels are found from image paths); "
                         "choose one of link, copy, symlink")
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
        label_file.write_text("".join(rows), encoding="utf-8")
    config: dict[str, Any] = {}
    written: set[str] = set()
    for split, members in index.splits.items():
        list_file = root / f"{split}.txt"
        lines = "".join(f"./{targets[int(m)].relative_to(root).as_posix()}\n" for m in members)
        list_file.write_text(lines, encoding="utf-8")
        key = YOLO_SPLIT_KEYS.get(split.lower())
        if key is not None and key not in written:
            config[key] = list_file.name
            written.add(key)
    if "train" not in config:
        config["train"] = "images"
    if "val" not in config:
        config["val"] = "images"
    config["nc"] = len(index.classes)
    config["names"] = {c: name for c, name in enumerate(index.classes)}
    if k:
        flip = schema.flip_permutation()
        config["kpt_shape"] = [k, 3]
        config["flip_idx"] = [int(v) for v in flip]
        config["kpt_names"] = {c: list(schema.names) for c in range(len(index.classes))}
    path = root / "data.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False, allow_unicode=True), encoding="utf-8")
    return path
