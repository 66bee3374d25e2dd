"""A model's predictions for one image (:class:`ImagePredictions`), read from what a model gives
(:func:`as_predictions`) and checked against the evaluated index (:func:`check_prediction`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from detloader.errors import DetloaderValueError, PredictionError


@dataclass(frozen=True)
class ImagePredictions:
    """Predictions for one image, in annotation coordinates (plain numpy: cheap to pickle
    between ranks).

    Attributes:
        image_id: row of the image in the index being evaluated.
        boxes: float32 ``[P, 4]`` xyxy pixels; scores: float32 ``[P]`` in [0, 1]; labels: int64
            ``[P]`` class indexes of the index.
        landmarks: float32 ``[P, K, 2]`` pixels.
        image_probs: float32 ``[I]`` image-class probabilities (``I = 0``: no head).
    """

    image_id: int
    boxes: np.ndarray
    scores: np.ndarray
    labels: np.ndarray
    landmarks: np.ndarray
    image_probs: np.ndarray


def _array(value: Any, dtype: Any) -> np.ndarray:
    if hasattr(value, "detach"):  # a torch tensor, on any device, of any float type
        value = value.detach().cpu()
        value = value.float() if value.is_floating_point() else value
    return np.asarray(value, dtype=dtype)


def as_predictions(entry: Any, image_id: int | None = None) -> ImagePredictions:
    """One image's predictions as :class:`ImagePredictions`: one already (returned as it is),
    or a mapping with ``boxes`` ``[P, 4]`` xyxy, ``scores`` ``[P]``, ``labels`` ``[P]`` (class
    ids of the index) and optionally ``landmarks`` ``[P, K, 2]``, ``image_probs`` ``[I]``
    (image-class scores: the highest counts) and ``image_id`` (else ``image_id``), all in
    annotation coordinates, as torch tensors (any device), numpy arrays or lists."""
    if isinstance(entry, ImagePredictions):
        return entry
    if not isinstance(entry, Mapping) or not {"boxes", "scores", "labels"} <= set(entry):
        what = sorted(entry) if isinstance(entry, Mapping) else type(entry).__name__
        raise DetloaderValueError(
            f"a prediction must be an ImagePredictions or a dict with boxes, scores, labels; got {what}"
        )
    image_id = entry.get("image_id", image_id)
    if image_id is None:
        raise DetloaderValueError(f"a prediction without image_id (keys {sorted(entry)})")
    boxes = _array(entry["boxes"], np.float32)
    boxes = boxes.reshape(0, 4) if boxes.size == 0 else boxes
    scores, labels = _array(entry["scores"], np.float32).reshape(-1), _array(entry["labels"], np.int64).reshape(-1)
    n = len(boxes)
    raw = entry.get("landmarks")
    lms = np.zeros((n, 0, 2), np.float32) if raw is None else _array(raw, np.float32)
    lms = lms.reshape(n, 0, 2) if lms.size == 0 else lms
    probs = _array(entry.get("image_probs", ()), np.float32).reshape(-1)
    if boxes.ndim != 2 or boxes.shape[1] != 4 or len(scores) != n or len(labels) != n or lms.ndim != 3 or (
        lms.shape[::2] != (n, 2)
    ):
        raise DetloaderValueError(
            f"image_id={image_id}: boxes {boxes.shape}, scores {scores.shape}, labels {labels.shape}, landmarks "
            f"{lms.shape}; expected [P, 4], [P], [P], [P, K, 2]"
        )
    return ImagePredictions(int(image_id), boxes, scores, labels, lms, probs)


def check_prediction(p: ImagePredictions, n_images: int, n_classes: int) -> None:
    """``p`` can be scored against an index of ``n_images`` rows and ``n_classes`` classes, else a
    :class:`PredictionError` naming the value."""
    if not 0 <= p.image_id < n_images:
        raise PredictionError(
            f"image_id={p.image_id} is not a row of the index ({n_images} images); pass ids='dataset' to "
            "score_predictions for the dataset's own image ids"
        )
    bad = np.flatnonzero((p.labels < 0) | (p.labels >= n_classes))
    if bad.size:
        raise PredictionError(
            f"image_id={p.image_id}: label {int(p.labels[bad[0]])} is not a class index of the dataset (0.."
            f"{n_classes - 1}); pass labels='category' to score_predictions for the dataset's category ids"
        )
    bad = np.flatnonzero(~np.isfinite(p.boxes).all(axis=1))
    if bad.size:
        raise PredictionError(
            f"image_id={p.image_id}: box {bad[0]} is {p.boxes[bad[0]].tolist()}; boxes must be finite xyxy pixels "
            "(drop or fix NaN / inf boxes before scoring)"
        )
    bad = np.flatnonzero(~((p.scores >= 0.0) & (p.scores <= 1.0)))
    if bad.size:
        raise PredictionError(
            f"image_id={p.image_id}: score {float(p.scores[bad[0]])!r} is outside [0, 1]; scores rank detections "
            "and meet score_threshold as probabilities: apply the sigmoid / softmax first"
        )
