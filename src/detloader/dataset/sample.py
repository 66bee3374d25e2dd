"""The :class:`Sample`: one transformed image and its targets, what
:class:`~detloader.dataset.DetectionDataset` yields and :func:`~detloader.loader.collate.collate_detection`
batches; :func:`as_sample` makes one of a user dataset's ``(image, boxes, labels[, landmarks[,
visibility]])`` or ``(image, target_dict)`` (docs/loader.md, "collate_detection and Batch").
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from detloader.annotations.index import MISSING
from detloader.errors import DetloaderTypeError, DetloaderValueError
from detloader.transforms.functional import affine_boxes, affine_points, chw_tensor


@dataclass(frozen=True, eq=False)
class Sample:
    """One transformed image and its targets.

    Attributes:
        image: uint8 ``[3, H, W]`` RGB tensor (may be a non-contiguous view of ``[H, W, 3]``
            memory; :func:`~detloader.loader.collate.collate_detection` copies it into the batch).
        boxes: float32 ``[N, 4]`` xyxy pixels of ``image``.
        labels: int64 ``[N]`` object class ids.
        landmarks: float32 ``[N, K, 2]`` pixels of ``image``; (0, 0) where visibility is 0.
        visibility: uint8 ``[N, K]``: 0 absent or outside the image, 1 hidden, 2 visible.
        image_label: image-level class id, or ``MISSING``.
        image_id: row of the image in the dataset's index, or ``MISSING``.
        orig_size: (width, height) of the annotation frame (the size the annotation states).
        scale, offset: the map from annotation coordinates to ``image`` coordinates,
            ``x' = x * scale[0] + offset[0]``, ``y' = y * scale[1] + offset[1]`` (``scale[0] <
            0`` after a horizontal flip); :meth:`boxes_to_original` inverts it.
        object_ids: int64 ``[N]`` rows of the objects in the index (crops drop some), or
            ``MISSING`` when unknown; use them to look up other per-object fields
            (``index.difficult[ids]``, ``index.object_attributes[ids]``).
    """

    image: torch.Tensor
    boxes: np.ndarray
    labels: np.ndarray
    landmarks: np.ndarray
    visibility: np.ndarray
    image_label: int
    image_id: int
    orig_size: tuple[int, int]
    scale: tuple[float, float]
    offset: tuple[float, float]
    object_ids: np.ndarray

    @property
    def size(self) -> tuple[int, int]:
        """(width, height) of ``image``."""
        return int(self.image.shape[2]), int(self.image.shape[1])

    def boxes_to_original(self, boxes: np.ndarray) -> np.ndarray:
        """float32 ``[N, 4]`` boxes of ``image`` (e.g. predictions) in annotation coordinates."""
        return affine_boxes(boxes, *self._to_original())

    def landmarks_to_original(self, landmarks: np.ndarray) -> np.ndarray:
        """float32 ``[N, K, 2]`` points of ``image`` in annotation coordinates (all points are
        mapped; use the visibility to ignore absent ones)."""
        vis = np.ones(np.shape(landmarks)[:-1], dtype=np.uint8)
        return affine_points(landmarks, vis, *self._to_original())

    def _to_original(self) -> tuple[float, float, float, float]:
        """(sx, sy, ox, oy) of the inverse map: ``image`` -> annotation coordinates."""
        (sx, sy), (ox, oy) = self.scale, self.offset
        return 1 / sx, 1 / sy, -ox / sx, -oy / sy


class SampleBatch(list):  # type: ignore[type-arg]
    """The samples of one batch, as :meth:`DetectionDataset.__getitems__
    <detloader.dataset.DetectionDataset.__getitems__>` gives them to a loader from
    :func:`~detloader.make_loader`: when every image came out the same size, ``images`` is the
    uint8 ``[B, 3, H, W]`` tensor that already holds them (sample ``j``'s image is a view of
    ``images[j]``, copied there as soon as it was made, while its pixels were in the cache), and
    :func:`~detloader.loader.collate.collate_detection` takes it as the batch's images without
    a copy; else None. ``release``: what frees that memory for the worker's next batch
    (:func:`~detloader.loader.collate.release_buffer`), None when nothing needs it."""

    images: torch.Tensor | None = None
    release: Any = None


# -- a user's sample -------------------------------------------------------------------------
def _image_tensor(image: Any, position: int) -> torch.Tensor:
    if isinstance(image, torch.Tensor):
        t = image
        if t.ndim == 2:
            t = t.unsqueeze(0).expand(3, -1, -1)
        if t.ndim != 3 or t.shape[0] != 3:
            raise DetloaderValueError(
                f"samples[{position}]: torch image shape {tuple(image.shape)}; expected [3, H, W] or [H, W]"
            )
    else:
        a = np.asarray(image)
        if a.ndim == 2:
            a = np.repeat(a[..., None], 3, axis=2)
        if a.ndim != 3 or a.shape[2] != 3:
            raise DetloaderValueError(f"samples[{position}]: numpy image shape {a.shape}; expected [H, W, 3] or [H, W]")
        t = chw_tensor(a)
    if t.dtype != torch.uint8:
        raise DetloaderValueError(
            f"samples[{position}]: image dtype {t.dtype}; collate_detection batches uint8 images "
            "(normalise on the device with Batch.normalize)"
        )
    return t


def _from_parts(
    image: Any,
    boxes: Any,
    labels: Any,
    landmarks: Any,
    visibility: Any,
    image_label: int,
    position: int,
) -> Sample:
    img = _image_tensor(image, position)
    h, w = int(img.shape[1]), int(img.shape[2])
    b = np.asarray(boxes if boxes is not None else np.zeros((0, 4)), dtype=np.float32)
    if b.size == 0:
        b = b.reshape(0, 4)
    if b.ndim != 2 or b.shape[1] != 4:
        raise DetloaderValueError(f"samples[{position}]: boxes shape {b.shape}; expected [N, 4]")
    n = len(b)
    lab = np.asarray(labels if labels is not None else np.zeros(0), dtype=np.int64).reshape(-1)
    if len(lab) != n:
        raise DetloaderValueError(f"samples[{position}]: {len(lab)} labels for {n} boxes")
    if landmarks is None:
        lm = np.zeros((n, 0, 2), dtype=np.float32)
        vis = np.zeros((n, 0), dtype=np.uint8)
    else:
        raw = np.asarray(landmarks, dtype=np.float32)
        if n == 0 and raw.ndim != 3:  # e.g. an empty list for an image without objects
            raw = np.zeros((0, 0, 2), dtype=np.float32)
        if raw.ndim != 3 or raw.shape[0] != n or raw.shape[2] not in (2, 3):
            raise DetloaderValueError(f"samples[{position}]: landmarks shape {raw.shape}; expected [N={n}, K, 2 or 3]")
        lm = np.ascontiguousarray(raw[..., :2])
        if visibility is not None:
            vis = np.asarray(visibility, dtype=np.uint8)
            if vis.shape != lm.shape[:2]:
                raise DetloaderValueError(f"samples[{position}]: visibility shape {vis.shape}; expected {lm.shape[:2]}")
        elif raw.shape[2] == 3:
            vis = raw[..., 2].astype(np.uint8)
        else:
            vis = np.full(lm.shape[:2], 2, dtype=np.uint8)
        vis = np.where(np.isfinite(lm).all(axis=-1), vis, 0).astype(np.uint8)
        lm = np.where((vis > 0)[..., None], lm, 0).astype(np.float32)
    return Sample(
        img, b, lab, lm, vis, int(image_label), MISSING, (w, h), (1.0, 1.0), (0.0, 0.0),
        np.full(n, MISSING, dtype=np.int64),
    )


def as_sample(sample: Any, position: int) -> Sample:
    """A dataset's sample as a :class:`Sample` (a user's tuple or dict is checked and
    completed: no landmarks -> K = 0, visibility 2 where not given, identity scale)."""
    if isinstance(sample, Sample):
        return sample
    if isinstance(sample, (tuple, list)):
        if len(sample) == 2 and isinstance(sample[1], Mapping):
            image, target = sample
            if "boxes" not in target:
                raise DetloaderValueError(f"samples[{position}]: target dict has no 'boxes' (keys: {sorted(target)})")
            landmarks = target.get("landmarks", target.get("keypoints"))
            image_label = target.get("image_label", MISSING)
            return _from_parts(
                image, target["boxes"], target.get("labels"), landmarks,
                target.get("visibility"), int(image_label), position,
            )
        if 3 <= len(sample) <= 5:
            parts = list(sample) + [None] * (5 - len(sample))
            return _from_parts(*parts, image_label=MISSING, position=position)
    raise DetloaderTypeError(
        f"samples[{position}]: {type(sample).__name__} is not a Sample, (image, boxes, labels"
        "[, landmarks[, visibility]]) or (image, target_dict)"
    )
