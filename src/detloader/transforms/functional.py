"""Kernels: pure numpy functions of arrays and numbers that never modify their inputs and know
nothing about randomness. Images are uint8 ``[H, W, 3]``, boxes
float32 ``[N, 4]`` xyxy pixels, landmarks float32 ``[N, K, 2]`` with uint8 visibility
``[N, K]``. An affine given as four numbers is axis-aligned: ``x' = x*sx + ox``,
``y' = y*sy + oy``; the ``warp_*`` kernels take a general float64 ``[2, 3]`` matrix
(``[x', y'] = M @ [x, y, 1]``, in the same continuous pixel coordinates).
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from typing import TYPE_CHECKING, Literal

import numpy as np

from detloader.errors import DetloaderValueError

if TYPE_CHECKING:  # torch is imported where a kernel needs it, not for `import transforms`
    import torch

Interpolation = Literal["bilinear", "nearest"]
INTERPOLATIONS: tuple[str, ...] = ("bilinear", "nearest")
#: Landmarks may sit this far (pixels) outside the image after a scale: float rounding.
_ROUNDING = 1e-3


def chw_tensor(image: np.ndarray) -> torch.Tensor:
    """uint8 ``[3, H, W]`` tensor over ``image``'s (``[H, W, 3]``) memory: no copy, also for a
    read-only view of writable memory (the image store's copy-on-write planes), except when
    the strides are negative or the memory is read-only, which torch cannot wrap (then a
    contiguous copy)."""
    import torch  # torch: lazy, `import detloader.transforms` stays light

    planes = image.transpose(2, 0, 1)
    if not image.flags.writeable:
        planes = planes.view()
        try:
            planes.flags.writeable = True  # allowed only where the memory is writable
        except ValueError:
            return torch.from_numpy(planes.copy())
    if any(s < 0 for s in image.strides):
        return torch.from_numpy(np.ascontiguousarray(image)).permute(2, 0, 1)
    return torch.from_numpy(planes)


def resize_image(image: np.ndarray, width: int, height: int, interpolation: Interpolation = "bilinear") -> np.ndarray:
    """``image`` (uint8 ``[H, W, 3]``) resized to ``[height, width, 3]``, pixel-centre aligned
    (``x -> x * width / W`` is exact); antialiased when shrinking more than 2x. Runs on torch's
    uint8 kernel (2-3x faster than Pillow); the result is an ``[H, W, 3]`` view of
    channel-first memory, which the Dataset turns into a CHW tensor without a copy."""
    h, w = image.shape[:2]
    if (w, h) == (width, height):
        return image
    if width < 1 or height < 1:
        raise DetloaderValueError(f"resize_image: width={width}, height={height} must be >= 1")
    import torch.nn.functional as F  # torch: lazy, as chw_tensor

    x = chw_tensor(image).unsqueeze(0)
    antialias = interpolation != "nearest" and (width * 2 < w or height * 2 < h)
    slot = getattr(_destination, "slot", None)
    if slot is not None and tuple(slot.shape) == (3, height, width):
        _destination.slot = None  # once: a later resize may read this one's output
        if _resize_into(x, slot.unsqueeze(0), interpolation, antialias):
            return slot.permute(1, 2, 0).numpy()
    if interpolation == "nearest":
        out = F.interpolate(x, size=(height, width), mode="nearest-exact")
    else:
        out = F.interpolate(x, size=(height, width), mode="bilinear", align_corners=False, antialias=antialias)
    return out[0].permute(1, 2, 0).numpy()


#: ``slot``: the uint8 ``[3, H, W]`` batch memory the next :func:`resize_image` to that size
#: writes its output into (:func:`resize_into`), per thread.
_destination = threading.local()


@contextlib.contextmanager
def resize_into(slot: torch.Tensor | None) -> Iterator[None]:
    """Within it, on this thread, the first :func:`resize_image` whose output is ``slot``'s size
    writes it there (a batch's memory, :class:`~detloader.dataset.DetectionDataset`): the kernel
    fills the batch as it computes, instead of fresh memory that is copied there afterwards
    (about a sixth of the resize's time on 384 px images). The pixels are the same."""
    _destination.slot = slot
    try:
        yield
    finally:
        _destination.slot = None


def _resize_into(x: torch.Tensor, out: torch.Tensor, interpolation: Interpolation, antialias: bool) -> bool:
    """``F.interpolate``'s kernel for ``x`` with its ``out=`` form (the same pixels); False
    where this torch has no such form (then the caller resizes as usual)."""
    import torch

    size = tuple(out.shape[2:])
    nn = torch._C._nn
    try:
        if interpolation == "nearest":
            nn._upsample_nearest_exact2d(x, size, None, None, out=out)
        elif antialias:
            nn._upsample_bilinear2d_aa(x, size, False, None, None, out=out)
        else:
            nn.upsample_bilinear2d(x, size, False, None, None, out=out)
    except (AttributeError, TypeError, RuntimeError):
        return False
    return True


def affine_boxes(boxes: np.ndarray, sx: float, sy: float, ox: float, oy: float) -> np.ndarray:
    """float32 ``[N, 4]`` xyxy boxes under ``x' = x*sx + ox``, ``y' = y*sy + oy``; corners are
    reordered when a scale is negative (a flip), so ``x1 < x2`` still holds. Computed in
    float64."""
    b = np.asarray(boxes, dtype=np.float64).reshape(-1, 4)
    t = b * (sx, sy, sx, sy)
    t += (ox, oy, ox, oy)
    out = np.empty(b.shape, dtype=np.float32)
    # ufuncs with out= (a few microseconds less per call than min/max reductions: this runs
    # several times per sample)
    np.minimum(t[:, :2], t[:, 2:], out=out[:, :2])
    np.maximum(t[:, :2], t[:, 2:], out=out[:, 2:])
    return out


def affine_points(
    landmarks: np.ndarray, visibility: np.ndarray, sx: float, sy: float, ox: float, oy: float
) -> np.ndarray:
    """float32 ``[N, K, 2]`` landmarks under the same map; absent points (visibility 0) stay
    at (0, 0)."""
    p = np.asarray(landmarks, dtype=np.float64) * (sx, sy)
    p += (ox, oy)
    out = p.astype(np.float32)
    out[np.asarray(visibility) == 0] = 0.0
    return out


def warp_image(
    image: np.ndarray, matrix: np.ndarray, width: int, height: int, fill: int = 0,
    interpolation: Interpolation = "bilinear",
) -> np.ndarray:
    """``image`` moved by the ``[2, 3]`` ``matrix`` onto a ``width x height`` canvas of
    ``fill``: output pixel centre ``p`` takes the input at ``M^-1 p`` (torch's
    ``grid_sample``, bilinear or nearest; edges blend with ``fill``)."""
    import torch  # torch: lazy, as chw_tensor
    import torch.nn.functional as F

    h, w = image.shape[:2]
    inv = np.linalg.inv(np.vstack([np.asarray(matrix, dtype=np.float64), [0, 0, 1]]))
    xs = np.arange(width, dtype=np.float32) + 0.5  # output pixel centres
    ys = (np.arange(height, dtype=np.float32) + 0.5)[:, None]
    grid = np.empty((1, height, width, 2), dtype=np.float32)  # input positions, -1..1 edge to edge
    for c, size in ((0, w), (1, h)):
        a, b, t = (np.float32(v * 2 / size) for v in inv[c])
        grid[0, ..., c] = xs * a + ys * b + (t - 1)
    # numpy for the element-wise steps: torch's intra-op threads cost more than they save here
    x = np.asarray(image, dtype=np.float32) - np.float32(fill)  # zeros outside: fill added back
    out = F.grid_sample(
        torch.from_numpy(x).permute(2, 0, 1)[None], torch.from_numpy(grid),
        mode=interpolation, padding_mode="zeros", align_corners=False,
    )[0].numpy()
    out += np.float32(fill)
    # a convex mix of values in 0..255: rounding is all the conversion needs
    return np.rint(out, out=out).astype(np.uint8).transpose(1, 2, 0)


def warp_points(landmarks: np.ndarray, visibility: np.ndarray, matrix: np.ndarray) -> np.ndarray:
    """float32 ``[N, K, 2]`` landmarks under the ``[2, 3]`` ``matrix``; absent points
    (visibility 0) stay at (0, 0)."""
    m = np.asarray(matrix, dtype=np.float64)
    out = (np.asarray(landmarks, dtype=np.float64) @ m[:, :2].T + m[:, 2]).astype(np.float32)
    out[np.asarray(visibility) == 0] = 0.0
    return out


def warp_boxes(boxes: np.ndarray, matrix: np.ndarray) -> np.ndarray:
    """float32 ``[N, 4]``: the xyxy box around each box's four corners under ``matrix`` (a
    rotation makes it larger than the object, as in every corner-based pipeline)."""
    m = np.asarray(matrix, dtype=np.float64)
    b = np.asarray(boxes, dtype=np.float64).reshape(-1, 4)
    corners = b[:, [0, 1, 2, 1, 2, 3, 0, 3]].reshape(-1, 4, 2) @ m[:, :2].T + m[:, 2]
    return np.concatenate([corners.min(axis=1), corners.max(axis=1)], axis=1).astype(np.float32)


def blend_images(a: np.ndarray, b: np.ndarray, weight: float) -> np.ndarray:
    """uint8 ``weight * a + (1 - weight) * b``, rounded (two images of the same size)."""
    out = np.asarray(a, dtype=np.float32) * np.float32(weight)
    out += np.asarray(b, dtype=np.float32) * np.float32(1.0 - weight)
    return np.rint(out).astype(np.uint8)


def compose_affine(affine: np.ndarray, sx: float, sy: float, ox: float, oy: float) -> np.ndarray:
    """float64 ``[4]`` ``(sx, sy, ox, oy)``: the map ``affine`` followed by
    ``x' = x*sx + ox``, ``y' = y*sy + oy``."""
    a = affine
    return np.array([a[0] * sx, a[1] * sy, a[2] * sx + ox, a[3] * sy + oy])


def clip_boxes(boxes: np.ndarray, width: float, height: float) -> np.ndarray:
    """Boxes clipped into ``[0, width] x [0, height]`` (a new array)."""
    out = np.array(boxes, dtype=np.float32).reshape(-1, 4)
    np.maximum(out, 0.0, out=out)  # np.maximum/np.minimum: np.clip's wrapper costs ~10 us
    np.minimum(out, np.array([width, height, width, height], dtype=np.float32), out=out)
    return out


def invalidate_outside(
    landmarks: np.ndarray, visibility: np.ndarray, width: float, height: float, tol: float = 0.0
) -> tuple[np.ndarray, np.ndarray]:
    """Landmarks outside ``[-tol, width + tol] x [-tol, height + tol]`` get visibility 0 and
    coordinates (0, 0); returns new (landmarks, visibility)."""
    lm = np.array(landmarks, dtype=np.float32)
    vis = np.array(visibility, dtype=np.uint8)
    # NaN compares False and infinities lie outside any bound: both count as outside
    inside = lm >= np.float32(-tol)
    inside &= lm <= np.array([width + tol, height + tol], dtype=np.float32)
    vis[~inside.all(axis=-1)] = 0
    lm[vis == 0] = 0.0
    return lm, vis


def clip_points(
    landmarks: np.ndarray, visibility: np.ndarray, width: float, height: float
) -> tuple[np.ndarray, np.ndarray]:
    """Points within rounding distance of the image are clipped into it, points further out
    get visibility 0 (for maps that are meant to keep points inside)."""
    lm, vis = invalidate_outside(landmarks, visibility, width, height, tol=_ROUNDING)
    np.maximum(lm, 0.0, out=lm)
    np.minimum(lm, np.array([width, height], dtype=np.float32), out=lm)
    return lm, vis


def hflip_image(image: np.ndarray) -> np.ndarray:
    """The image mirrored left-right (a copy in the same memory layout)."""
    return np.flip(image, 1).copy(order="K")


def hflip_boxes(boxes: np.ndarray, width: float) -> np.ndarray:
    """Boxes mirrored in an image ``width`` wide: ``x -> width - x``, corners reordered."""
    return affine_boxes(boxes, -1.0, 1.0, float(width), 0.0)


def hflip_landmarks(
    landmarks: np.ndarray, visibility: np.ndarray, width: float, permutation: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Landmarks mirrored (``x -> width - x``) and their slots swapped by ``permutation``
    (``new[k] = old[permutation[k]]``, from :meth:`LandmarkSchema.flip_permutation`), so a
    left eye is still called ``left_eye`` after the flip."""
    points = affine_points(landmarks, visibility, -1.0, 1.0, float(width), 0.0)
    return points[:, permutation], np.asarray(visibility)[:, permutation]


def crop_image(image: np.ndarray, x0: int, y0: int, width: int, height: int, fill: int = 0) -> np.ndarray:
    """The ``width x height`` window at ``(x0, y0)``; parts outside the image are ``fill``.
    A view when the window lies inside the image."""
    h, w = image.shape[:2]
    if 0 <= x0 and 0 <= y0 and x0 + width <= w and y0 + height <= h:
        return image[y0 : y0 + height, x0 : x0 + width]
    out = _canvas_like(image, width, height, fill)
    sx0, sy0 = max(x0, 0), max(y0, 0)
    sx1, sy1 = min(x0 + width, w), min(y0 + height, h)
    if sx1 > sx0 and sy1 > sy0:
        out[sy0 - y0 : sy1 - y0, sx0 - x0 : sx1 - x0] = image[sy0:sy1, sx0:sx1]
    return out


def crop_boxes(
    boxes: np.ndarray, x0: float, y0: float, width: float, height: float, min_visibility: float
) -> tuple[np.ndarray, np.ndarray]:
    """Boxes in the frame of the window ``(x0, y0, width, height)``, clipped to it, and the
    bool mask of boxes to keep: positive size after clipping and at least ``min_visibility``
    of their area inside. Returns (all boxes shifted and clipped, keep)."""
    shifted = affine_boxes(boxes, 1.0, 1.0, -float(x0), -float(y0))
    clipped = clip_boxes(shifted, width, height)
    bw, bh = clipped[:, 2] - clipped[:, 0], clipped[:, 3] - clipped[:, 1]
    area = np.maximum(shifted[:, 2] - shifted[:, 0], 0) * np.maximum(shifted[:, 3] - shifted[:, 1], 0)
    inside = bw * bh
    with np.errstate(invalid="ignore", divide="ignore"):
        frac = np.where(area > 0, inside / area, 0.0)
    keep = (bw > 0) & (bh > 0) & (frac >= min_visibility)
    return clipped, keep


def pad_image(image: np.ndarray, width: int, height: int, left: int, top: int, fill: int = 0) -> np.ndarray:
    """A ``[height, width, 3]`` canvas of ``fill`` with ``image`` placed at ``(left, top)``."""
    h, w = image.shape[:2]
    if left < 0 or top < 0 or left + w > width or top + h > height:
        raise DetloaderValueError(f"pad_image: a {w}x{h} image at left={left}, top={top} does not fit {width}x{height}")
    if (w, h) == (width, height):
        return image
    out = _canvas_like(image, width, height, fill)
    out[top : top + h, left : left + w] = image
    return out


def _canvas_like(image: np.ndarray, width: int, height: int, fill: int) -> np.ndarray:
    """A ``[height, width, 3]`` array of ``fill`` in ``image``'s memory layout: channel-first
    memory (what :func:`resize_image` returns) stays channel-first, so copying ``image`` in
    is three plain plane copies, not a transposition (10x faster), and the Dataset's CHW
    tensor over the result needs no copy either."""
    if image.strides[2] > image.strides[1]:  # planes: [3, H, W] memory
        return np.full((3, height, width), fill, dtype=np.uint8).transpose(1, 2, 0)
    return np.full((height, width, 3), fill, dtype=np.uint8)


def adjust_colour(
    image: np.ndarray, brightness: float = 1.0, contrast: float = 1.0, saturation: float = 1.0, hue: float = 0.0
) -> np.ndarray:
    """Brightness, contrast and saturation factors (1 = unchanged) as torchvision defines
    them, in that order, on uint8, then a hue shift of ``hue`` turns: brightness and contrast
    are one 256-entry lookup table; saturation blends with the luma image in 32-bit integers;
    hue rotates the colours about the grey axis (a 3x3 matrix: 1/3 turn takes pure red to pure
    green, as HSV's hue; greys stay). Contrast uses the mean luma of every 4th pixel in each
    direction (cheap, deterministic)."""
    out = image
    if brightness != 1.0 or contrast != 1.0:
        values = np.arange(256, dtype=np.float64) * brightness
        if contrast != 1.0:
            sample = np.asarray(image[::4, ::4], dtype=np.float64)
            mean = float((sample @ np.array([0.299, 0.587, 0.114])).mean()) * brightness
            mean = min(mean, 255.0)
            values = (values - mean) * contrast + mean
        lut = np.clip(np.rint(values), 0, 255).astype(np.uint8)
        out = lut[out]
    if saturation != 1.0:
        a = np.asarray(out, dtype=np.int32)  # int16 overflows: 255 * 150 > 32767
        gray = (a[..., 0] * 77 + a[..., 1] * 150 + a[..., 2] * 29 + 128) >> 8
        s = int(round(saturation * 256))
        mixed = gray[..., None] + (((a - gray[..., None]) * s) >> 8)
        out = np.clip(mixed, 0, 255).astype(np.uint8)
    if hue != 0.0:
        c, s3 = np.cos(2 * np.pi * hue), np.sin(2 * np.pi * hue) / np.sqrt(3.0)
        turn = c * np.eye(3) + (1 - c) / 3 + s3 * np.array([[0, -1, 1], [1, 0, -1], [-1, 1, 0]])
        rotated = np.asarray(out, dtype=np.float32) @ turn.T.astype(np.float32)
        rotated += 0.5  # then clipped and truncated: rounded
        np.maximum(rotated, 0.0, out=rotated)
        out = np.minimum(rotated, 255.0, out=rotated).astype(np.uint8)
    return out
