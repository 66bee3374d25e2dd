"""Drawing one image and its annotations into a tile (Pillow ``ImageDraw``, no matplotlib).

What a tile shows, and how:

* a caption band at the top: the image's row in the index, its image class (and probability,
  for predictions) and any note (``flipped``, ``truth``, ``prediction``);
* the image below it, scaled to fit the rest of the ``tile x tile`` square (left-aligned; the
  rest is dark grey);
* **boxes** in their class's colour (:func:`class_color`), 2 px, with the class name (and the
  score, for predictions) on a label of the same colour above the box;
* **landmarks**: each left/right flip pair has one hue (:func:`landmark_colors`): the *first*
  point of the pair (``left_*`` in the usual schemas) is a filled disc, the second a ring of
  the same hue, so a flip that swaps the slots keeps each hue on its own feature and a flip that
  forgets the swap shows at once. Points outside any pair (nose, chin) have their own hues and
  are filled squares. Visibility 2 is drawn at full colour, 1 (labelled but hidden) dimmed,
  0 not at all.
"""

from __future__ import annotations

import colorsys
import functools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from PIL import Image, ImageDraw, ImageFont

from detloader.errors import DetloaderValueError

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
