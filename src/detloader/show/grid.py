"""Grids of tiles: samples of a dataset (raw or after its transform), and predictions beside
the truth. See :mod:`detloader.show.draw` for what one tile shows.

Layout: ``cols`` tiles of ``tile x tile`` pixels per row with ``GAP`` pixels around and between
them, so a grid of ``n`` tiles is ``cols * tile + (cols + 1) * GAP`` wide and ``rows * tile +
(rows + 1) * GAP`` high, ``rows = ceil(n / cols)``; ``cols`` defaults to ``ceil(sqrt(n))``
(for prediction pairs: an even number, truth on the left).
"""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image

from detloader.annotations.index import AnnotationIndex
from detloader.dataset import DetectionDataset, Sample
from detloader.errors import DetloaderTypeError, DetloaderValueError
from detloader.show.draw import BACKGROUND, TileAnnotations, TilePlacement, draw_tile, landmark_colors
from detloader.transforms.mix import group_size, mix_choice

#: Pixels around and between tiles.
GAP = 4


@dataclass
class Grid:
    """A drawn grid: the picture, where it was saved (None: not saved), and for each tile the
    index row it shows and its :class:`~detloader.show.draw.TilePlacement` (image pixel -> grid
    pixel)."""

    image: Image.Image
    path: Path | None
    image_ids: list[int]
    placements: list[TilePlacement]


def grid_size(n: int, tile: int, cols: int) -> tuple[int, int]:
    """(width, height) in pixels of a grid of ``n`` tiles (see the module docstring)."""
    rows = max(1, math.ceil(n / cols))
    return cols * tile + (cols + 1) * GAP, rows * tile + (rows + 1) * GAP


def pick_images(
    index: AnnotationIndex, n: int, *, class_name: str | None = None, seed: int = 0
) -> np.ndarray:
    """Up to ``n`` rows of ``index`` (sorted), drawn without replacement with ``seed``;
    ``class_name``: only images holding an object of that class, or of that image class."""
    if n < 1:
        raise DetloaderValueError(f"n={n} must be >= 1")
    ids = np.arange(len(index))
    if class_name is not None:
        if class_name in index.classes:
            c = index.classes.index(class_name)
            ids = np.unique(index.object_image[np.asarray(index.labels) == c])
        elif class_name in index.image_classes:
            ids = np.flatnonzero(np.asarray(index.image_labels) == index.image_classes.index(class_name))
        else:
            raise DetloaderValueError(
                f"class={class_name!r} is neither an object class {list(index.classes)} "
                f"nor an image class {list(index.image_classes)}"
            )
    if len(ids) == 0:
        raise DetloaderValueError(f"no images to show (class={class_name!r}, {len(index)} images)")
    if len(ids) > n:
        ids = np.sort(np.random.default_rng(seed).choice(ids, size=n, replace=False))
    return ids.astype(np.int64)


def _sample_tile(index: AnnotationIndex, sample: Sample, note: str = "") -> tuple[np.ndarray, TileAnnotations]:
    label = int(sample.image_label)
    parts = [f"#{int(sample.image_id)}", index.image_classes[label] if 0 <= label < len(index.image_classes) else ""]
    if sample.scale[0] < 0:  # any transform that mirrors records a negative x scale
        parts.append("flipped")
    if note:
        parts.append(note)
    image = sample.image.permute(1, 2, 0).numpy()
    return image, TileAnnotations(
        boxes=np.asarray(sample.boxes), labels=np.asarray(sample.labels),
        landmarks=np.asarray(sample.landmarks), visibility=np.asarray(sample.visibility),
        caption=" | ".join(p for p in parts if p),
    )


def render_tiles(
    tiles: Sequence[tuple[np.ndarray, TileAnnotations]],
    index: AnnotationIndex,
    *,
    tile: int = 256,
    cols: int | None = None,
) -> tuple[Image.Image, list[TilePlacement]]:
    """Draw ``(image, annotations)`` pairs into one grid image (class names, landmark schema
    and colours from ``index``)."""
    if not tiles:
        raise DetloaderValueError("render_tiles: no tiles to draw")
    if tile < 32:
        raise DetloaderValueError(f"tile={tile} must be >= 32 pixels")
    cols = cols or math.ceil(math.sqrt(len(tiles)))
    canvas = Image.new("RGB", grid_size(len(tiles), tile, cols), BACKGROUND)
    schema = index.landmark_schema
    colors = landmark_colors(len(schema.names), schema.flip_pairs)
    places = []
    for k, (image, ann) in enumerate(tiles):
        r, c = divmod(k, cols)
        origin = (GAP + c * (tile + GAP), GAP + r * (tile + GAP))
        places.append(draw_tile(canvas, image, ann, tile=tile, origin=origin, class_names=index.classes,
                                point_colors=colors, flip_pairs=schema.flip_pairs))
    return canvas, places


def _save(image: Image.Image, out: str | os.PathLike[str] | None) -> Path | None:
    if out is None:
        return None
    path = Path(out)
    path.parent.mkdir(parents=True, exist_ok=True)
    image.save(path)
    return path


def show_dataset(
    data: AnnotationIndex | DetectionDataset,
    out: str | os.PathLike[str] | None = None,
    *,
    n: int = 16,
    class_name: str | None = None,
    after_transform: bool = False,
    seed: int = 0,
    tile: int = 256,
    cols: int | None = None,
) -> Grid:
    """A grid of ``n`` images of ``data`` with their annotations drawn, saved to ``out`` (PNG,
    or any format Pillow writes by the suffix) when given.

    ``data``: an index (images as stored) or a :class:`DetectionDataset`; with
    ``after_transform``, the dataset's samples as its transform makes them (augmentation
    included: check that a flip, an affine or a letterbox kept the annotations on their
    features; mirrored tiles say ``flipped``), else the images as stored. A dataset with
    mosaic or mixup (``dataset.with_mix(...)``) shows the group of each shown image and the
    next ones (the caption says ``mosaic`` / ``mixup`` where the sample's draw made one).
    ``class_name``: only images with that object or image class.
    """
    if isinstance(data, DetectionDataset):
        index, dataset = data.index, data
    elif isinstance(data, AnnotationIndex):
        index, dataset = data, None
    else:
        raise DetloaderTypeError(f"data={type(data).__name__}: expected an AnnotationIndex or a DetectionDataset")
    mixing = dataset is not None and (dataset.mosaic is not None or dataset.mixup is not None)
    if after_transform and (dataset is None or (dataset.transform is None and not mixing)):
        raise DetloaderValueError("after_transform=True needs a DetectionDataset with a transform, mosaic or mixup")
    if not after_transform:
        dataset, mixing = DetectionDataset(index, None, seed=seed), False
    assert dataset is not None
    ids = pick_images(index, n, class_name=class_name, seed=seed)
    tiles = []
    for k, i in enumerate(ids.tolist()):
        if not mixing:
            tiles.append(_sample_tile(index, dataset[i]))
            continue
        size = group_size(dataset.mosaic, dataset.mixup)
        group = [int(ids[(k + j) % len(ids)]) for j in range(size)]
        made = mix_choice(dataset.mosaic, dataset.mixup, dataset.seed, dataset.epoch, i)[:2]
        note = "+".join(name for name, on in zip(("mosaic", "mixup"), made) if on)
        tiles.append(_sample_tile(index, dataset[group], note))
    image, places = render_tiles(tiles, index, tile=tile, cols=cols)
    return Grid(image, _save(image, out), [int(i) for i in ids], places)


def _prediction_tile(
    index: AnnotationIndex, pred: Any, image: np.ndarray, score_threshold: float
) -> tuple[np.ndarray, TileAnnotations]:
    keep = np.asarray(pred.scores) >= score_threshold
    landmarks = np.asarray(pred.landmarks)[keep]
    caption = [f"#{int(pred.image_id)}", "prediction"]
    probs = np.asarray(pred.image_probs)
    if probs.size and len(index.image_classes):
        best = int(probs.argmax())
        if best < len(index.image_classes):
            caption.append(f"{index.image_classes[best]} {float(probs[best]):.2f}")
    return image, TileAnnotations(
        boxes=np.asarray(pred.boxes)[keep], labels=np.asarray(pred.labels)[keep],
        landmarks=landmarks, visibility=np.full(landmarks.shape[:2], 2, dtype=np.uint8),
        caption=" | ".join(caption), scores=np.asarray(pred.scores)[keep],
    )


def show_predictions(
    index: AnnotationIndex,
    predictions: Sequence[Any],
    out: str | os.PathLike[str] | None = None,
    *,
    n: int = 8,
    score_threshold: float = 0.3,
    tile: int = 256,
    pairs_per_row: int | None = None,
) -> Grid:
    """Each of ``n`` images twice, side by side: the truth (left) and the predictions with a
    score of at least ``score_threshold`` (right, with scores and the most probable image
    class). ``predictions``: :class:`~detloader.train.ImagePredictions` (annotation
    coordinates, ``image_id`` = row of ``index``), as :func:`detloader.train.predict` gives."""
    if not predictions:
        raise DetloaderValueError("show_predictions: no predictions")
    chosen = list(predictions)[: max(1, n)]
    raw = DetectionDataset(index, None, seed=0)
    tiles = []
    for pred in chosen:
        sample = raw[int(pred.image_id)]
        image, truth = _sample_tile(index, sample, note="truth")
        tiles += [(image, truth), _prediction_tile(index, pred, image, score_threshold)]
    per_row = pairs_per_row or max(1, math.ceil(math.sqrt(len(chosen) / 2)))
    image, places = render_tiles(tiles, index, tile=tile, cols=2 * per_row)
    ids = [int(p.image_id) for p in chosen for _ in range(2)]
    return Grid(image, _save(image, out), ids, places)
