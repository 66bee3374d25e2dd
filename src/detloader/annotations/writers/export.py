"""``write_annotations``: one entry for the three writers (the ``detloader convert`` command)."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

from detloader.annotations.index import AnnotationIndex
from detloader.annotations.writers.coco import write_coco
from detloader.annotations.writers.common import IMAGE_MODES, check_choice
from detloader.annotations.writers.voc import write_voc
from detloader.annotations.writers.yolo import write_yolo
from detloader.errors import DetloaderValueError

EXPORT_FORMATS = ("voc", "coco", "yolo")

_WRITERS: dict[str, Callable[..., Path]] = {"voc": write_voc, "coco": write_coco, "yolo": write_yolo}


def write_annotations(
    index: AnnotationIndex,
    out: str | os.PathLike[str],
    format: str,
    *,
    images: str = "link",
    split: str | None = None,
    overwrite: bool = False,
    val_fraction: float | None = None,
    seed: int = 0,
) -> Path:
    """Write ``index`` (or its split ``split``) to the folder ``out`` in ``format`` (one of
    :data:`EXPORT_FORMATS`); return the path to read back (the folder for VOC, the JSON for
    COCO or the folder with one JSON per split, data.yaml for YOLO). The export's splits read
    back as ``index``'s (for YOLO those data.yaml can name). ``val_fraction`` and ``seed``: YOLO only, see
    :func:`~detloader.annotations.writers.yolo.write_yolo`."""
    check_choice("format", format, EXPORT_FORMATS)
    check_choice("images", images, IMAGE_MODES)
    if val_fraction is not None and format != "yolo":
        raise DetloaderValueError(f"val_fraction={val_fraction!r} is for format='yolo', not {format!r}")
    if split is not None:
        index = index.split(split)
    options = {"val_fraction": val_fraction, "seed": seed} if format == "yolo" else {}
    return _WRITERS[format](index, out, images=images, overwrite=overwrite, **options)
