"""A model's predictions for one image (:class:`ImagePredictions`), read from what a model gives
(:func:`as_predictions`) and checked against the evaluated index (:func:`check_prediction`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
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


#: COCO's largest box area (its "all" range, ``1e5 ** 2`` px²): the evaluation passes over a
#: larger detection without a word (neither a hit nor a false positive), so such a box is refused.
MAX_BOX_AREA = 1e10
#: No image side reaches it (the readers' size limit is ``2**31 - 1``): a coordinate beyond it
#: is no pixel of the image, whatever its area.
MAX_COORDINATE = 2.0**31


def image_id_of(value: Any) -> int:
    """An image id as an int: an int (numpy, or a one-value tensor), an integral float or the
    text of an integer; :class:`PredictionError` for anything else (``0.7`` is not truncated,
    ``True`` is not an id)."""
    if getattr(value, "ndim", None) == 0 and hasattr(value, "item"):  # numpy scalar, 0-d tensor
        value = value.item()
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, str) and value.strip().lstrip("-").isdigit():
        return int(value)
    raise PredictionError(f"image_id={value!r} is not an integer image id")


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
    annotation coordinates, as torch tensors (any device), numpy arrays or lists. An entry's own
    ``image_id`` and the one it comes with (its key in a mapping) must agree
    (:class:`PredictionError` otherwise: which is meant is not guessed)."""
    key = None if image_id is None else image_id_of(image_id)
    if isinstance(entry, ImagePredictions):
        if key is not None and key != entry.image_id:
            raise PredictionError(f"the entry under image_id={key} has image_id={entry.image_id}; give one id")
        return entry
    if not isinstance(entry, Mapping) or not {"boxes", "scores", "labels"} <= set(entry):
        what = sorted(entry) if isinstance(entry, Mapping) else type(entry).__name__
        raise DetloaderValueError(
            f"a prediction must be an ImagePredictions or a dict with boxes, scores, labels; got {what}"
        )
    own = entry.get("image_id")
    own = None if own is None else image_id_of(own)
    if own is not None and key is not None and own != key:
        raise PredictionError(f"the entry under image_id={key} has image_id={own}; give one id")
    image_id = own if own is not None else key
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
    return ImagePredictions(image_id, boxes, scores, labels, lms, probs)


def _box_areas(boxes: np.ndarray) -> np.ndarray:
    """Areas in float64 (``1e30`` sides do not overflow), 0 for inverted sides."""
    sides = np.clip(boxes[:, 2:].astype(np.float64) - boxes[:, :2], 0, None)
    with np.errstate(invalid="ignore"):
        return sides.prod(axis=1)


def check_predictions(predictions: Sequence[ImagePredictions], n_images: int, n_classes: int) -> None:
    """Every prediction can be scored against an index of ``n_images`` rows and ``n_classes``
    classes, else a :class:`PredictionError` naming the first bad value and counting its kind
    over all of them: an image id that is no row, a label that is no class index, a box with
    NaN or infinity, a box over :data:`MAX_BOX_AREA` or beyond :data:`MAX_COORDINATE`, a score
    outside [0, 1]."""
    for p in predictions:
        if not 0 <= p.image_id < n_images:
            raise PredictionError(
                f"image_id={p.image_id} is not a row of the index ({n_images} images); pass ids='dataset' to "
                "score_predictions for the dataset's own image ids"
            )
    labels = [(p.labels < 0) | (p.labels >= n_classes) for p in predictions]
    _first_bad(predictions, labels, lambda p, j: (
        f"label {int(p.labels[j])} is not a class index of the dataset (0..{n_classes - 1})",
        "pass labels='category' to score_predictions for the dataset's category ids",
    ))
    finite = [np.isfinite(p.boxes).all(axis=1) for p in predictions]
    _first_bad(predictions, [~f for f in finite], lambda p, j: (
        f"box {j} is {p.boxes[j].tolist()}", "boxes must be finite xyxy pixels: drop or fix NaN / inf boxes"
    ))
    absurd = [(_box_areas(p.boxes) > MAX_BOX_AREA) | (abs(p.boxes) > MAX_COORDINATE).any(axis=1) for p in predictions]
    _first_bad(predictions, absurd, lambda p, j: (
        f"box {j} is [{', '.join(f'{v:g}' for v in p.boxes[j].tolist())}]",
        "boxes must be xyxy pixels of the image: COCO's evaluation passes over a box larger than 1e10 px² "
        "(100000 x 100000) without a word, and no image reaches 2**31 px (normalised the wrong way, overflowed?)",
    ))
    _first_bad(predictions, [~((p.scores >= 0.0) & (p.scores <= 1.0)) for p in predictions], lambda p, j: (
        f"score {float(p.scores[j])!r} is outside [0, 1]",
        "scores rank detections and meet score_threshold as probabilities: apply the sigmoid / softmax first",
    ))


def _first_bad(predictions: Sequence[ImagePredictions], masks: list[np.ndarray], say: Any) -> None:
    """:class:`PredictionError` for the first ``True`` of ``masks`` (one per prediction), with
    what ``say(p, j)`` gives (the value, what to do) and how many there are in how many images."""
    counts = [int(m.sum()) for m in masks]
    total = sum(counts)
    if not total:
        return
    i = next(i for i, c in enumerate(counts) if c)
    p = predictions[i]
    what, todo = say(p, int(np.flatnonzero(masks[i])[0]))
    images = sum(1 for c in counts if c)
    raise PredictionError(
        f"image_id={p.image_id}: {what} ({total} such in {images} image{'s' if images > 1 else ''}); {todo}"
    )
