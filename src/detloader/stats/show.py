"""Pictures of a dataset, drawn with Pillow (no matplotlib): a grid of tiles, each one image
with its annotations; samples of a dataset (as stored or after its transform), and
predictions beside the truth.

A tile (what the marks mean: README.md, "Looking at a dataset"): a caption band (index row, image class,
notes), the image scaled into the rest of the ``tile x tile`` square on :data:`BACKGROUND`, boxes in
:func:`class_color`, landmarks in :func:`landmark_colors` (a pair's first point a disc, the second a ring).

Layout: :func:`grid_size` (``GAP`` pixels around and between tiles); ``cols`` defaults to ``ceil(sqrt(n))``
(for prediction pairs: an even number, truth on the left).
"""

from __future__ import annotations

import colorsys
import functools
import math
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image, ImageDraw, ImageFont

from detloader.annotations.index import AnnotationIndex
from detloader.dataset import DetectionDataset, Sample
from detloader.errors import DetloaderTypeError, DetloaderValueError
from detloader.transforms.mix import group_size, mix_choice

#: Grey behind images that do not fill their tile, and between tiles.
BACKGROUND = (40, 40, 40)
#: Box outline width and landmark marker radius, pixels of the tile.
BOX_WIDTH = 2
POINT_RADIUS = 4
_RING = 2  # ring width of the second point of a pair

#: Box colours by class id (cycled): saturated, far from the landmark hues and from grey.
_CLASS_COLORS = (
    (255, 64, 64), (64, 160, 255), (255, 200, 0), (64, 220, 64), (255, 96, 255),
    (0, 230, 230), (255, 140, 0), (160, 96, 255), (190, 255, 80), (255, 128, 160),
)


def class_color(label: int) -> tuple[int, int, int]:
    """Box colour of class ``label`` (ids beyond the palette reuse it, cyclically)."""
    return _CLASS_COLORS[int(label) % len(_CLASS_COLORS)]


def landmark_colors(num_points: int, flip_pairs: Sequence[tuple[int, int]]) -> list[tuple[int, int, int]]:
    """One RGB colour per landmark slot: both points of a flip pair share a hue; points in no
    pair get hues of their own (spread over the colour wheel, pairs first)."""
    in_pair = {i: k for k, pair in enumerate(flip_pairs) for i in pair}
    singles = [i for i in range(num_points) if i not in in_pair]
    groups = max(len(flip_pairs) + len(singles), 1)
    colors: list[tuple[int, int, int]] = []
    for i in range(num_points):
        group = in_pair[i] if i in in_pair else len(flip_pairs) + singles.index(i)
        r, g, b = colorsys.hsv_to_rgb((0.08 + group / groups) % 1.0, 0.85, 1.0)
        colors.append((int(r * 255), int(g * 255), int(b * 255)))
    return colors


@dataclass(frozen=True)
class TilePlacement:
    """Where an image lands in its tile: tile pixel = ``origin + scale * image pixel``."""

    origin: tuple[int, int]
    scale: float
    size: tuple[int, int]  # the scaled image, pixels

    def map(self, x: float, y: float) -> tuple[float, float]:
        return self.origin[0] + self.scale * x, self.origin[1] + self.scale * y


@dataclass(frozen=True)
class TileAnnotations:
    """What to draw on one image, in that image's pixels.

    ``boxes`` float32 ``[N, 4]`` xyxy; ``labels`` int ``[N]``; ``landmarks`` ``[N, K, 2]``;
    ``visibility`` ``[N, K]`` (0, 1, 2); ``scores`` ``[N]`` or None (ground truth); ``caption``:
    the text of the top band.
    """

    boxes: np.ndarray
    labels: np.ndarray
    landmarks: np.ndarray
    visibility: np.ndarray
    caption: str = ""
    scores: np.ndarray | None = None


@functools.lru_cache(maxsize=4)
def _font(size: int) -> Any:
    try:
        return ImageFont.load_default(size=size)
    except TypeError:  # Pillow < 10.1: the bitmap font only
        return ImageFont.load_default()


def _label(draw: ImageDraw.ImageDraw, x: float, y: float, text: str, color: tuple[int, int, int],
           bounds: tuple[int, int, int, int], font: Any) -> None:
    left, top, right, bottom = draw.textbbox((0, 0), text, font=font)
    tw, th = right - left + 4, bottom - top + 2
    x0 = int(min(max(x, bounds[0]), bounds[2] - tw))
    y0 = int(y - th if y - th >= bounds[1] else y)  # above the box, else inside it
    draw.rectangle([x0, y0, x0 + tw - 1, y0 + th - 1], fill=color)
    ink = (0, 0, 0) if sum(color) > 380 else (255, 255, 255)
    draw.text((x0 + 2 - left, y0 + 1 - top), text, fill=ink, font=font)


def draw_tile(
    canvas: Image.Image,
    image: np.ndarray,
    ann: TileAnnotations,
    *,
    tile: int,
    origin: tuple[int, int],
    class_names: Sequence[str],
    point_colors: Sequence[tuple[int, int, int]],
    flip_pairs: Sequence[tuple[int, int]],
) -> TilePlacement:
    """Paste ``image`` (uint8 ``[H, W, 3]``) into ``canvas`` at ``origin`` scaled to fit
    ``tile`` and draw ``ann`` over it; returns the placement (to map points onto the tile)."""
    h, w = image.shape[:2]
    if w < 1 or h < 1:
        raise DetloaderValueError(f"image_size={(w, h)}: width and height must be >= 1")
    ox, oy = origin
    font_size = max(9, tile // 22)
    band = font_size + 6  # the caption band at the top
    scale = min(tile / w, (tile - band) / h)  # the largest that fits below the band, left-aligned
    place = TilePlacement((ox, oy + band), scale, (max(1, round(w * scale)), max(1, round(h * scale))))
    picture = Image.fromarray(np.ascontiguousarray(image[..., :3]), "RGB")
    if place.size != (w, h):
        picture = picture.resize(place.size, Image.BILINEAR)
    canvas.paste(picture, place.origin)
    draw = ImageDraw.Draw(canvas)
    bounds = (ox, oy + band, ox + place.size[0] - 1, oy + band + place.size[1] - 1)
    font = _font(font_size)
    second = {b for _, b in flip_pairs}
    paired = {i for pair in flip_pairs for i in pair}
    r = POINT_RADIUS
    for n in range(len(ann.boxes)):
        label = int(ann.labels[n])
        color = class_color(label)
        x1, y1 = place.map(float(ann.boxes[n, 0]), float(ann.boxes[n, 1]))
        x2, y2 = place.map(float(ann.boxes[n, 2]), float(ann.boxes[n, 3]))
        draw.rectangle([round(x1), round(y1), round(x2), round(y2)], outline=color, width=BOX_WIDTH)
        name = class_names[label] if 0 <= label < len(class_names) else str(label)
        if ann.scores is not None:
            name += f" {float(ann.scores[n]):.2f}"
        _label(draw, x1, y1, name, color, bounds, font)
    for n in range(len(ann.landmarks)):
        for k in range(ann.landmarks.shape[1] if ann.landmarks.ndim == 3 else 0):
            v = int(ann.visibility[n, k])
            if v == 0:
                continue
            color = point_colors[k] if k < len(point_colors) else (255, 255, 255)
            if v == 1:  # hidden: halfway to grey
                color = tuple(int(c * 0.5 + 64) for c in color)  # type: ignore[assignment]
            px, py = place.map(float(ann.landmarks[n, k, 0]), float(ann.landmarks[n, k, 1]))
            px, py = round(px), round(py)
            disc = [px - r, py - r, px + r, py + r]
            if k in second:
                draw.ellipse(disc, outline=color, width=_RING)
            elif k in paired:
                draw.ellipse(disc, fill=color, outline=(0, 0, 0))
            else:
                draw.rectangle([px - r + 1, py - r + 1, px + r - 1, py + r - 1], fill=color, outline=(0, 0, 0))
    if ann.caption:
        left, top, _, _ = draw.textbbox((0, 0), ann.caption, font=font)
        draw.rectangle([ox, oy, ox + tile - 1, oy + band - 1], fill=(0, 0, 0))
        draw.text((ox + 3 - left, oy + 3 - top), ann.caption, fill=(255, 255, 255), font=font)
    return place


#: Pixels around and between tiles.
GAP = 4


@dataclass
class Grid:
    """A drawn grid: the picture, where it was saved (None: not saved), and for each tile the
    index row it shows and its :class:`TilePlacement` (image pixel -> grid
    pixel)."""

    image: Image.Image
    path: Path | None
    image_ids: list[int]
    placements: list[TilePlacement]


def grid_size(n: int, tile: int, cols: int) -> tuple[int, int]:
    """(width, height) in pixels of a grid of ``n`` tiles (see the module docstring)."""
    rows = max(1, math.ceil(n / cols))
    return cols * tile + (cols + 1) * GAP, rows * tile + (rows + 1) * GAP


def pick_images(index: AnnotationIndex, n: int, *, class_name: str | None = None, seed: int = 0) -> np.ndarray:
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
    from detloader._system.files import atomic_write

    with atomic_write(path, no_follow=True) as fh:  # whole or not at all, never through a link
        image.save(fh, format=Image.registered_extensions().get(path.suffix.lower(), "PNG"))
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
