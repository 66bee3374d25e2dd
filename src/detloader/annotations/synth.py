"""A deterministic synthetic face dataset in Pascal VOC layout: the embedded default.

``make_synthetic(out, images=200, seed=0)`` writes::

    out/Annotations/synth_000000.xml     VOC XML with <keypoints> and <attributes>
    out/JPEGImages/synth_000000.jpg      the drawn image
    out/ImageSets/Main/{train,val}.txt   an 80/20 split

Each image holds 0 to ``max_objects`` face-like objects: a skin-coloured ellipse with two
eyes, a nose and a mouth, and 5 landmarks (:data:`detloader.annotations.landmarks.FACE5`: left eye, right
eye, nose, left and right mouth corner; flip pairs eyes and mouth corners). Object classes
are imbalanced (default ``face`` 90 %, ``masked`` 8 %, ``sunglasses`` 2 %): a mask hides the
mouth corners (visibility 1), sunglasses hide the eyes (visibility 1); a fourth class and on
wears a hat of its own colour (long-tail sets with many classes). Faces cut by the image
border are ``truncated`` and their outside landmarks have visibility 0. Each object has the
attribute ``age`` (adult/child, 80/20); each image an image-level class (attribute ``class``:
``indoor`` 70 %, ``outdoor`` 25 %, ``night`` 5 %). About 5 % of images hold no object.

Same seed, same arguments -> byte-identical files.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from xml.sax.saxutils import escape

import numpy as np

from detloader.annotations.landmarks import FACE5
from detloader.errors import DetloaderValueError

DEFAULT_CLASSES = ("face", "masked", "sunglasses")
DEFAULT_CLASS_FREQUENCIES = (0.90, 0.08, 0.02)
IMAGE_CLASSES = ("indoor", "outdoor", "night")
IMAGE_CLASS_FREQUENCIES = (0.70, 0.25, 0.05)
_BACKGROUNDS = {"indoor": (200, 180, 150), "outdoor": (120, 170, 220), "night": (30, 30, 60)}


@dataclass(frozen=True)
class _Face:
    cls: int
    box: tuple[float, float, float, float]
    points: np.ndarray  # [5, 2]
    visibility: np.ndarray  # [5]
    truncated: bool
    age: str


def _faces(rng: np.random.Generator, w: int, h: int, n: int, class_p: np.ndarray) -> list[_Face]:
    faces: list[_Face] = []
    for _ in range(n):
        cls = int(rng.choice(len(class_p), p=class_p))
        age = "child" if rng.random() < 0.2 else "adult"
        fw = float(rng.uniform(0.12, 0.35) * min(w, h)) * (0.75 if age == "child" else 1.0)
        fh = fw * float(rng.uniform(1.15, 1.35))
        cut = rng.random() < 0.08  # a face cut by the image border
        margin = -0.45 if cut else 0.02
        cx = float(rng.uniform(margin * fw + fw / 2, w - fw / 2 - margin * fw))
        cy = float(rng.uniform(margin * fh + fh / 2, h - fh / 2 - margin * fh))
        rel = np.array([[-0.2, -0.12], [0.2, -0.12], [0.0, 0.08], [-0.15, 0.28], [0.15, 0.28]])
        rel = rel + rng.normal(0, 0.015, rel.shape)
        points = np.column_stack([cx + rel[:, 0] * fw, cy + rel[:, 1] * fh])
        x1, y1, x2, y2 = cx - fw / 2, cy - fh / 2, cx + fw / 2, cy + fh / 2
        cx1, cy1, cx2, cy2 = max(x1, 0.0), max(y1, 0.0), min(x2, float(w)), min(y2, float(h))
        if cx2 - cx1 < 4 or cy2 - cy1 < 4:
            continue
        truncated = (cx1, cy1, cx2, cy2) != (x1, y1, x2, y2)
        inside = (points[:, 0] >= 0) & (points[:, 0] <= w) & (points[:, 1] >= 0) & (points[:, 1] <= h)
        vis = np.where(inside, 2, 0).astype(np.uint8)
        if cls == 1:  # mask: mouth corners hidden
            vis[3:5] = np.where(inside[3:5], 1, 0)
        if cls == 2:  # sunglasses: eyes hidden
            vis[0:2] = np.where(inside[0:2], 1, 0)
        box = tuple(round(v, 1) for v in (cx1, cy1, cx2, cy2))
        faces.append(_Face(cls, box, np.round(points, 1), vis, truncated, age))  # type: ignore[arg-type]
    return faces


def _hat_colour(cls: int) -> tuple[int, int, int]:
    """The hat colour of class ``cls`` (3 and up): hues a golden angle apart, two brightnesses."""
    import colorsys

    r, g, b = colorsys.hsv_to_rgb((cls * 0.381966) % 1.0, 0.9, 0.95 if cls % 2 else 0.6)
    return int(r * 255), int(g * 255), int(b * 255)


def _draw(rng: np.random.Generator, w: int, h: int, scene: str, faces: Sequence[_Face]) -> np.ndarray:
    from PIL import Image, ImageDraw

    base = np.array(_BACKGROUNDS[scene], dtype=np.float32)
    yy, xx = np.mgrid[0:h, 0:w].astype(np.float32)
    grad = (xx / max(w, 1) * 30 - yy / max(h, 1) * 20)[..., None]
    noise = rng.normal(0, 6, (h, w, 1)).astype(np.float32)
    pixels = np.clip(base + grad + noise, 0, 255).astype(np.uint8)
    img = Image.fromarray(pixels, "RGB")
    draw = ImageDraw.Draw(img)
    for f in faces:
        (lx, ly), (rx, ry), (nx, ny), (mlx, mly), (mrx, mry) = f.points
        fw = (rx - lx) / 0.4
        fh = fw * 1.25
        cx, cy = (lx + rx) / 2, (ly + ry) / 2 + 0.12 * fh
        skin = (230, 190, 160) if f.age == "adult" else (245, 205, 180)
        draw.ellipse([cx - fw / 2, cy - fh / 2, cx + fw / 2, cy + fh / 2], fill=skin, outline=(120, 80, 60))
        e = max(1.5, fw * 0.06)
        for ex, ey in ((lx, ly), (rx, ry)):
            draw.ellipse([ex - e, ey - e, ex + e, ey + e], fill=(40, 40, 40))
        draw.polygon([(nx, ny - fh * 0.08), (nx - e, ny + e), (nx + e, ny + e)], fill=(200, 140, 120))
        draw.line([(mlx, mly), ((mlx + mrx) / 2, mly + e), (mrx, mry)], fill=(150, 50, 50), width=max(1, int(e)))
        if f.cls == 1:
            draw.rectangle([cx - fw * 0.35, ny + e, cx + fw * 0.35, cy + fh * 0.42], fill=(170, 210, 240))
        if f.cls == 2:
            draw.rectangle([lx - 2 * e, ly - 1.5 * e, rx + 2 * e, ry + 1.5 * e], fill=(20, 20, 20))
        if f.cls >= 3:  # further classes: a hat of the class's own colour
            draw.rectangle([cx - fw * 0.45, cy - fh * 0.5, cx + fw * 0.45, ly - 2 * e], fill=_hat_colour(f.cls))
    return np.asarray(img)


def _xml(stem: str, w: int, h: int, scene: str, faces: Sequence[_Face], classes: Sequence[str]) -> str:
    out = [
        '<annotation verified="yes">',
        "  <folder>JPEGImages</folder>",
        f"  <filename>{stem}.jpg</filename>",
        "  <source><database>detloader synthetic faces</database></source>",
        f"  <size><width>{w}</width><height>{h}</height><depth>3</depth></size>",
        "  <segmented>0</segmented>",
        "  <attributes><attribute><name>class</name>"
        f"<value>{scene}</value></attribute></attributes>",
    ]
    for f in faces:
        x1, y1, x2, y2 = f.box
        out += [
            "  <object>",
            f"    <name>{escape(classes[f.cls])}</name>",
            f"    <truncated>{int(f.truncated)}</truncated>",
            f"    <occluded>{int(f.cls != 0)}</occluded>",
            "    <difficult>0</difficult>",
            f"    <bndbox><xmin>{x1:g}</xmin><ymin>{y1:g}</ymin><xmax>{x2:g}</xmax><ymax>{y2:g}</ymax></bndbox>",
            "    <keypoints>",
        ]
        for name, (x, y), v in zip(FACE5.names, f.points, f.visibility):
            if v == 0:
                x, y = 0.0, 0.0
            out.append(f'      <keypoint name="{name}" x="{x:g}" y="{y:g}" visible="{int(v)}"/>')
        out += [
            "    </keypoints>",
            f"    <attributes><attribute><name>age</name><value>{f.age}</value></attribute></attributes>",
            "  </object>",
        ]
    out.append("</annotation>\n")
    return "\n".join(out)


def make_synthetic(
    out: str | os.PathLike[str],
    images: int = 200,
    *,
    seed: int = 0,
    size: tuple[int, int] = (320, 240),
    classes: Sequence[str] = DEFAULT_CLASSES,
    class_frequencies: Sequence[float] = DEFAULT_CLASS_FREQUENCIES,
    max_objects: int = 4,
    empty_fraction: float = 0.05,
    write_images: bool = True,
    image_pool: int | None = None,
    quality: int = 90,
    progress: Callable[[int, int], None] | None = None,
) -> Path:
    """Write ``images`` annotated images of ``size`` (width, height) to ``out`` (created) and
    return its path. ``class_frequencies`` are the expected shares of ``classes``; a non-empty
    image holds 1 to ``max_objects`` objects (uniform), ``empty_fraction`` of them none.
    ``write_images=False`` writes only the XML (index benchmarks; the images are then missing).
    ``image_pool``: draw only this many distinct images and hard-link the rest to them (large
    indexes for loader benchmarks at little disk cost); annotations stay distinct, so beyond the
    pool the pixels do not match their boxes: for throughput, not training."""
    if images < 0:
        raise DetloaderValueError(f"images={images} must be >= 0")
    if len(classes) != len(class_frequencies) or not classes:
        raise DetloaderValueError(
            f"classes={list(classes)} and class_frequencies={list(class_frequencies)} "
            "must be non-empty and of the same length"
        )
    p = np.asarray(class_frequencies, dtype=np.float64)
    if (p < 0).any() or p.sum() <= 0:
        raise DetloaderValueError(f"class_frequencies={list(class_frequencies)} must be >= 0 with a positive sum")
    p = p / p.sum()
    if image_pool is not None and image_pool < 1:
        raise DetloaderValueError(f"image_pool={image_pool} must be >= 1")
    w, h = size
    root = Path(out)
    ann_dir, img_dir, sets_dir = root / "Annotations", root / "JPEGImages", root / "ImageSets" / "Main"
    for d in (ann_dir, img_dir, sets_dir):
        d.mkdir(parents=True, exist_ok=True)
    import simplejpeg

    rng = np.random.default_rng(seed)
    scene_p = np.asarray(IMAGE_CLASS_FREQUENCIES)
    stems: list[str] = []
    for i in range(images):
        stem = f"synth_{i:06d}"
        stems.append(stem)
        scene = IMAGE_CLASSES[int(rng.choice(len(IMAGE_CLASSES), p=scene_p))]
        n = 0 if rng.random() < empty_fraction else int(rng.integers(1, max_objects + 1))
        faces = _faces(rng, w, h, n, p)
        (ann_dir / f"{stem}.xml").write_text(_xml(stem, w, h, scene, faces, classes), encoding="utf-8")
        if write_images:
            target = img_dir / f"{stem}.jpg"
            if image_pool is not None and i >= image_pool:
                source = img_dir / f"{stems[i % image_pool]}.jpg"
                if target.exists():
                    target.unlink()
                try:
                    os.link(source, target)
                except OSError:
                    target.write_bytes(source.read_bytes())
            else:
                img_rng = np.random.default_rng([seed, i])
                pixels = _draw(img_rng, w, h, scene, faces)
                target.write_bytes(simplejpeg.encode_jpeg(pixels, quality=quality, colorspace="RGB"))
        if progress is not None and (i % 256 == 255 or i == images - 1):
            progress(i + 1, images)
    order = np.random.default_rng(seed + 1).permutation(images)
    n_val = images // 5
    val = sorted(stems[j] for j in order[:n_val])
    train = sorted(stems[j] for j in order[n_val:])
    (sets_dir / "train.txt").write_text("".join(s + "\n" for s in train))
    (sets_dir / "val.txt").write_text("".join(s + "\n" for s in val))
    return root

