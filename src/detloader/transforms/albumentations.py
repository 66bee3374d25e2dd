"""Use an albumentations ``Compose`` as a detloader transform (optional extra).

albumentations is imported only by :meth:`AlbumentationsTransform.build`. The ``Compose`` must
declare ``BboxParams(format="pascal_voc", label_fields=["object_index"])`` and
``KeypointParams(format="xy", label_fields=["point_index"], remove_invisible=False)``
(``coord_format=`` where albumentations renamed it): the index's pixel units, and the label
fields that carry each box's and point's row through albumentations' filtering. Three probe
points tell a reflection (then the schema's flip permutation and the mirror classes apply;
an image holding a one-sided class is mirrored once more, so its map is no reflection) and
re-estimate ``Annotated.affine``. See docs/loader.md, "albumentations".
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import Any

import numpy as np

from detloader.annotations.landmarks import LandmarkSchema
from detloader.errors import DetloaderTypeError, DetloaderValueError, MissingExtraError
from detloader.transforms.base import Annotated
from detloader.transforms.functional import clip_boxes, compose_affine, hflip_boxes, hflip_image, invalidate_outside

BOX_FIELD = "object_index"
POINT_FIELD = "point_index"


def _params_format(params: Any) -> str | None:
    for attr in ("coord_format", "format"):
        value = getattr(params, attr, None)
        if isinstance(value, str):
            return value
    return None


def _check_processor(compose: Any, key: str, fmt: str, field: str, extra: str) -> None:
    processors = getattr(compose, "processors", None)
    if not isinstance(processors, dict) or key not in processors:
        raise DetloaderValueError(f"albumentations Compose has no {key} processor: build it with {extra}")
    params = processors[key].params
    got = _params_format(params)
    fields = list(getattr(params, "label_fields", None) or [])
    if got != fmt or field not in fields:
        raise DetloaderValueError(
            f"albumentations Compose: {key} format={got!r}, label_fields={fields}; "
            f"expected format={fmt!r} with {field!r} in label_fields ({extra})"
        )


class AlbumentationsTransform:
    """Wrap an albumentations ``Compose`` (it must declare the parameters of the module docstring).

    Args:
        compose: the albumentations ``Compose``.
        schema: landmark schema for the flip permutation; default: the data's (set by
            :class:`~detloader.dataset.DetectionDataset`).
    """

    preserves_size = False

    def __init__(self, compose: Any, *, schema: LandmarkSchema | None = None) -> None:
        if not callable(compose):
            raise DetloaderTypeError(f"compose={compose!r} is not callable")
        _check_processor(
            compose, "bboxes", "pascal_voc", BOX_FIELD,
            f"A.BboxParams(format='pascal_voc', label_fields=[{BOX_FIELD!r}])",
        )
        _check_processor(
            compose, "keypoints", "xy", POINT_FIELD,
            f"A.KeypointParams(format='xy', label_fields=[{POINT_FIELD!r}], remove_invisible=False)",
        )
        kp_params = compose.processors["keypoints"].params
        if getattr(kp_params, "remove_invisible", False):
            raise DetloaderValueError(
                "albumentations Compose: KeypointParams(remove_invisible=True) would drop "
                "landmark slots; use remove_invisible=False (the adapter sets visibility 0)"
            )
        self.compose = compose
        self.permutation = schema.flip_permutation() if schema is not None else None

    @property
    def mirrors(self) -> bool:
        """Whether the pipeline holds a transform that can mirror (a flip, transpose or D4)."""

        def walk(t: Any) -> bool:
            inner = getattr(t, "transforms", None)
            name = type(t).__name__
            return any(k in name for k in ("Flip", "Transpose", "D4", "Symmetry")) or (
                isinstance(inner, (list, tuple)) and any(walk(c) for c in inner)
            )

        return walk(self.compose)

    @classmethod
    def build(
        cls,
        transforms: Sequence[Any],
        *,
        min_visibility: float = 0.0,
        min_area: float = 0.0,
        schema: LandmarkSchema | None = None,
        **compose_kwargs: Any,
    ) -> AlbumentationsTransform:
        """``A.Compose(transforms, bbox_params=..., keypoint_params=...)`` with the parameters
        this adapter needs, wrapped. Imports albumentations (ImportError names the extra)."""
        try:
            import albumentations as A
        except ImportError as err:
            raise MissingExtraError(
                "AlbumentationsTransform.build needs albumentations: pip install 'detloader[albumentations]'"
            ) from err

        def params(cls_: Any, fmt: str, **kw: Any) -> Any:
            try:
                return cls_(format=fmt, **kw)
            except TypeError:  # versions that renamed the argument
                return cls_(coord_format=fmt, **kw)

        bbox = params(
            A.BboxParams, "pascal_voc", label_fields=[BOX_FIELD], min_visibility=min_visibility, min_area=min_area
        )
        keypoints = params(A.KeypointParams, "xy", label_fields=[POINT_FIELD], remove_invisible=False)
        compose = A.Compose(list(transforms), bbox_params=bbox, keypoint_params=keypoints, **compose_kwargs)
        return cls(compose, schema=schema)

    def _seed(self, rng: np.random.Generator) -> None:
        seed = int(rng.integers(0, 2**31 - 1))
        setter = getattr(self.compose, "set_random_seed", None)
        if callable(setter):
            setter(seed)
        else:  # albumentations 1.x draws from the global generators
            random.seed(seed)
            np.random.seed(seed)

    def __call__(self, data: Annotated, rng: np.random.Generator) -> Annotated:
        self._seed(rng)
        w, h = data.width, data.height
        n, k = data.landmarks.shape[:2]
        probes = np.array([[0.25 * w, 0.25 * h], [0.75 * w, 0.25 * h], [0.25 * w, 0.75 * h]])
        points = np.concatenate([data.landmarks.reshape(-1, 2).astype(np.float64), probes])
        points = np.minimum(points, [w - 1e-3, h - 1e-3])  # albumentations wants x < width
        out = self.compose(
            image=np.ascontiguousarray(data.image),
            bboxes=data.boxes.astype(np.float64).reshape(-1, 4),
            **{BOX_FIELD: list(range(n))},
            keypoints=points,
            **{POINT_FIELD: list(range(len(points)))},
        )
        image = np.asarray(out["image"])
        if image.dtype != np.uint8 or image.ndim != 3 or image.shape[2] != 3:
            raise DetloaderValueError(
                f"albumentations returned an image of dtype={image.dtype}, shape={image.shape}; "
                "expected uint8 [H, W, 3] (leave normalisation to Batch.normalize)"
            )
        moved = np.full((len(points), 2), np.nan)  # points albumentations dropped stay NaN
        idx = np.asarray(out[POINT_FIELD], dtype=np.int64).reshape(-1)
        if len(idx):
            moved[idx] = np.asarray(out["keypoints"], dtype=np.float64).reshape(len(idx), -1)[:, :2]
        before, after = probes, moved[n * k :]

        def orientation(p: np.ndarray) -> float:
            (x0, y0), (x1, y1), (x2, y2) = p
            return float((x1 - x0) * (y2 - y0) - (y1 - y0) * (x2 - x0))

        reflected = bool(np.isfinite(after).all() and orientation(after) * orientation(before) < 0)
        labels = data.mirrored_labels() if reflected else data.labels
        undo = reflected and labels is None  # a one-sided class: mirror back, the net map is no reflection
        if undo:
            iw = image.shape[1]
            image = hflip_image(image)
            moved[:, 0] = iw - moved[:, 0]
            after = moved[n * k :]
            reflected, labels = False, data.labels
        landmarks = moved[: n * k].reshape(n, k, 2)
        visibility = np.array(data.visibility, dtype=np.uint8)
        visibility[~np.isfinite(landmarks).all(axis=-1)] = 0
        if reflected and k:
            perm = self.permutation if self.permutation is not None else data.flip_permutation
            if perm is None:
                raise DetloaderValueError(
                    "AlbumentationsTransform: the transform mirrored the image but no flip "
                    "permutation is known; pass schema="
                )
            landmarks, visibility = landmarks[:, perm], visibility[:, perm]
        kept = np.asarray(out[BOX_FIELD], dtype=np.int64).reshape(-1)
        boxes = np.asarray(out["bboxes"], dtype=np.float32).reshape(len(kept), -1)[:, :4]
        boxes = hflip_boxes(boxes, image.shape[1]) if undo else boxes
        oh, ow = image.shape[:2]
        landmarks, visibility = invalidate_outside(np.nan_to_num(landmarks[kept]), visibility[kept], ow, oh)
        data.image = image
        data.boxes = clip_boxes(boxes, ow, oh)
        data.labels = labels[kept]
        data.object_ids = data.object_ids[kept]
        data.landmarks, data.visibility = landmarks, visibility
        data.affine = _affine_from_probes(data.affine, before, after)
        return data

    def __repr__(self) -> str:
        return f"AlbumentationsTransform({self.compose!r})"


def _affine_from_probes(affine: np.ndarray, before: np.ndarray, after: np.ndarray) -> np.ndarray:
    """The previous map followed by the axis-aligned map that took the probes ``before`` to
    ``after``. A map that is not axis-aligned (rotation, shear, transpose) gets NaN offsets and
    its overall scale, negative in x when it mirrors (:class:`~.base.Annotated`); all NaN when
    a probe was lost (a warp)."""
    (x0, y0), (x1, _), (_, y2) = before
    (u0, v0), (u1, v1), (u2, v2) = after
    scale = max(abs(x1 - x0), abs(y2 - y0))
    if not np.isfinite(after).all():
        return np.full(4, np.nan)
    if abs(v1 - v0) > 1e-3 * scale or abs(u2 - u0) > 1e-3 * scale:
        det = ((u1 - u0) * (v2 - v0) - (v1 - v0) * (u2 - u0)) / ((x1 - x0) * (y2 - y0))
        s = float(np.sqrt(abs(det)))
        return compose_affine(affine, float(np.copysign(s, det)), s, np.nan, np.nan)
    sx, sy = (u1 - u0) / (x1 - x0), (v2 - v0) / (y2 - y0)
    return compose_affine(affine, sx, sy, u0 - sx * x0, v0 - sy * y0)
