"""The albumentations adapter: its logic against a stand-in Compose (always), and against the
real library (skipped when the optional extra is not installed)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pytest

from detloader.annotations.landmarks import FACE5
from detloader.transforms import Annotated
from detloader.transforms.albumentations import BOX_FIELD, POINT_FIELD, AlbumentationsTransform


@dataclass
class _Params:
    format: str
    label_fields: list[str]
    remove_invisible: bool = False


@dataclass
class _Processor:
    params: _Params


@dataclass
class _StandIn:
    """Behaves like an albumentations Compose of [HorizontalFlip(p=1), Crop(x_min=w/4)] with
    BboxParams(min_visibility=0.5), or of [Transpose()]: returns the same dict shapes."""

    mode: str = "flip_crop"
    bbox_format: str = "pascal_voc"
    remove_invisible: bool = False
    seeds: list[int] = field(default_factory=list)

    @property
    def processors(self) -> dict[str, _Processor]:
        return {
            "bboxes": _Processor(_Params(self.bbox_format, [BOX_FIELD])),
            "keypoints": _Processor(_Params("xy", [POINT_FIELD], self.remove_invisible)),
        }

    def set_random_seed(self, seed: int) -> None:
        self.seeds.append(seed)

    def __call__(
        self, *, image: np.ndarray, bboxes: np.ndarray, keypoints: np.ndarray, **labels: Any
    ) -> dict[str, Any]:
        h, w = image.shape[:2]
        b, k = np.array(bboxes, dtype=np.float64), np.array(keypoints, dtype=np.float64)
        if self.mode == "transpose":
            return {
                "image": image.transpose(1, 0, 2).copy(),
                "bboxes": b[:, [1, 0, 3, 2]],
                "keypoints": k[:, ::-1],
                BOX_FIELD: labels[BOX_FIELD],
                POINT_FIELD: labels[POINT_FIELD],
            }
        x0 = w // 4
        image = image[:, ::-1][:, x0:].copy()
        b = np.stack([w - b[:, 2], b[:, 1], w - b[:, 0], b[:, 3]], 1) - [x0, 0, x0, 0]
        area = (b[:, 2] - b[:, 0]) * (b[:, 3] - b[:, 1])
        clipped = np.clip(b, 0, [w - x0, h, w - x0, h])
        keep = (clipped[:, 2] - clipped[:, 0]) * (clipped[:, 3] - clipped[:, 1]) >= 0.5 * area
        k = np.stack([w - k[:, 0] - x0, k[:, 1]], 1)
        return {
            "image": image,
            "bboxes": clipped[keep],
            BOX_FIELD: [i for i, kept in zip(labels[BOX_FIELD], keep) if kept],
            "keypoints": k,
            POINT_FIELD: labels[POINT_FIELD],
        }


def _data() -> Annotated:
    image = np.zeros((40, 80, 3), dtype=np.uint8)
    image[:, :10] = 255
    boxes = [[50, 5, 70, 30], [2, 2, 12, 12], [30, 10, 50, 20]]
    pts = np.array(
        [
            [[55, 10], [65, 10], [60, 20], [56, 25], [64, 25]],
            [[4, 4], [9, 4], [6, 7], [4, 10], [9, 10]],
            [[35, 12], [45, 12], [40, 15], [36, 18], [44, 18]],
        ],
        dtype=np.float32,
    )
    vis = np.full((3, 5), 2)
    vis[0, 3] = 0
    return Annotated.create(image, boxes, [0, 1, 2], pts, vis, schema=FACE5)


def test_adapter_follows_boxes_swaps_landmarks_and_records_the_map() -> None:
    stand_in = _StandIn()
    out = AlbumentationsTransform(stand_in)(_data(), np.random.default_rng(0))
    assert len(stand_in.seeds) == 1
    assert out.image.shape == (40, 60, 3) and (out.image[:, -10:] == 255).all()
    # box 1 (x 2..12) flips to 68..78 -> 48..58; box 0 (x 50..70) -> 10..30 -> -10..10 keeps
    # exactly half its area (min_visibility 0.5): kept and clipped
    assert out.object_ids.tolist() == [0, 1, 2] and out.labels.tolist() == [0, 1, 2]
    assert out.boxes.tolist() == [[0, 5, 10, 30], [48, 2, 58, 12], [10, 10, 30, 20]]
    # mirrored: the new left eye of object 2 is its old right eye, at 80 - 45 - 20 = 15
    assert out.landmarks[2, 0].tolist() == [15, 12] and out.landmarks[2, 1].tolist() == [25, 12]
    # object 0 after the swap: left eye <- old right eye (80-65-20 = -5: outside, 0);
    # right eye <- old left eye (5); nose at 0 (inside); left mouth <- old right mouth (-4:
    # outside); right mouth <- old left mouth (absent)
    assert out.visibility[0].tolist() == [0, 2, 2, 0, 0]
    assert out.landmarks[0, 0].tolist() == [0, 0] and out.landmarks[0, 1].tolist() == [5, 10]
    np.testing.assert_allclose(out.affine, [-1, 1, 60, 0], atol=1e-6)


def test_transpose_is_a_reflection_and_has_no_axis_map() -> None:
    out = AlbumentationsTransform(_StandIn(mode="transpose"))(_data(), np.random.default_rng(0))
    assert out.image.shape == (80, 40, 3)
    assert out.landmarks[2, 0].tolist() == [12, 45]  # old right eye (45, 12), transposed
    # no axis-aligned map back (NaN offsets); the scale says it mirrors (show: "flipped")
    assert np.isnan(out.affine[2:]).all() and out.affine[:2].tolist() == [-1, 1]


def test_adapter_refuses_a_compose_it_cannot_follow() -> None:
    with pytest.raises(ValueError, match="format='coco'.*expected format='pascal_voc'"):
        AlbumentationsTransform(_StandIn(bbox_format="coco"))
    with pytest.raises(ValueError, match="remove_invisible=True"):
        AlbumentationsTransform(_StandIn(remove_invisible=True))
    with pytest.raises(ValueError, match="no bboxes processor"):
        AlbumentationsTransform(lambda **kw: kw)


def test_with_real_albumentations() -> None:
    A = pytest.importorskip("albumentations")
    t = AlbumentationsTransform.build([A.HorizontalFlip(p=1.0)])
    out = t(_data(), np.random.default_rng(0))
    assert out.boxes[2].tolist() == pytest.approx([30, 10, 50, 20], abs=1e-3)
    # albumentations flips keypoints as pixel indices: 80 - 1 - 45 (boxes: 80 - x)
    assert out.landmarks[2, 0].tolist() == pytest.approx([34, 12], abs=1e-2)
    assert out.visibility[0].tolist() == [2, 2, 2, 2, 0]
    again = AlbumentationsTransform.build([A.RandomCrop(30, 30)])
    a = again(_data(), np.random.default_rng(5))
    b = again(_data(), np.random.default_rng(5))
    assert np.array_equal(a.image, b.image) and np.array_equal(a.boxes, b.boxes)
