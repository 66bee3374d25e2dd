"""Transforms: kernels, parameters, and the laws (hypothesis) that keep annotations honest."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from detloader.annotations.landmarks import FACE5, LandmarkSchema
from detloader.transforms import (
    Annotated,
    ColorJitter,
    Compose,
    RandomCrop,
    RandomHorizontalFlip,
    RandomResizedCrop,
    Resize,
    adjust_colour,
    affine_boxes,
    crop_boxes,
    hflip_landmarks,
    min_input_size,
    resize_image,
)

SCHEMA = FACE5
PROPERTY = settings(max_examples=60, deadline=None)


def _random_data(seed: int, w: int, h: int, n: int, schema: LandmarkSchema = SCHEMA) -> Annotated:
    """A random image with n boxes inside it and landmarks (some absent) inside it."""
    rng = np.random.default_rng(seed)
    image = rng.integers(0, 256, (h, w, 3), dtype=np.uint8)
    x = np.sort(rng.uniform(0, w, (n, 2)), axis=1)
    y = np.sort(rng.uniform(0, h, (n, 2)), axis=1)
    x[:, 1] = np.maximum(x[:, 1], np.minimum(x[:, 0] + 1, w))
    y[:, 1] = np.maximum(y[:, 1], np.minimum(y[:, 0] + 1, h))
    x[:, 0] = np.minimum(x[:, 0], x[:, 1] - 0.5)
    y[:, 0] = np.minimum(y[:, 0], y[:, 1] - 0.5)
    boxes = np.stack([x[:, 0], y[:, 0], x[:, 1], y[:, 1]], 1)
    k = len(schema)
    points = np.stack([rng.uniform(0, w, (n, k)), rng.uniform(0, h, (n, k))], -1)
    vis = rng.integers(0, 3, (n, k))
    return Annotated.create(image, boxes, rng.integers(0, 3, n), points, vis, schema=schema)


def _copy(d: Annotated) -> Annotated:
    return Annotated(
        d.image.copy(), d.boxes.copy(), d.labels.copy(), d.landmarks.copy(), d.visibility.copy(),
        d.object_ids.copy(), d.affine.copy(), d.flip_permutation,
    )


def _assert_valid(d: Annotated) -> None:
    """The guarantees every transform gives."""
    h, w = d.image.shape[:2]
    assert d.image.dtype == np.uint8 and d.image.shape[2] == 3
    n = len(d.boxes)
    assert d.boxes.dtype == np.float32 and d.boxes.shape == (n, 4)
    assert len(d.labels) == len(d.landmarks) == len(d.visibility) == len(d.object_ids) == n
    b = d.boxes
    assert (b[:, 0] >= 0).all() and (b[:, 1] >= 0).all() and (b[:, 2] <= w).all() and (b[:, 3] <= h).all()
    assert (b[:, 2] > b[:, 0]).all() and (b[:, 3] > b[:, 1]).all()
    p, v = d.landmarks, d.visibility
    present = v > 0
    inside = (p[..., 0] >= 0) & (p[..., 0] <= w) & (p[..., 1] >= 0) & (p[..., 1] <= h)
    assert (inside | ~present).all()
    assert (p[~present] == 0).all()


sizes = st.tuples(st.integers(8, 64), st.integers(8, 64))
transform_factory = st.one_of(
    st.builds(RandomHorizontalFlip, st.sampled_from([0.0, 0.5, 1.0])),
    st.builds(
        lambda s, m: Resize(s, mode=m) if m in ("shorter", "longer") else Resize((s, s + 3), mode=m),
        st.integers(4, 80),
        st.sampled_from(["fixed", "shorter", "longer", "letterbox"]),
    ),
    st.builds(lambda s, mv: RandomCrop((s, s + 5), min_visibility=mv), st.integers(4, 70), st.floats(0, 1)),
    st.builds(
        lambda s, lo, mv: RandomResizedCrop(s, scale=(lo, 1.0), min_visibility=mv),
        st.integers(4, 48),
        st.floats(0.05, 1.0),
        st.floats(0, 1),
    ),
    st.builds(ColorJitter, st.floats(0, 1), st.floats(0, 1), st.floats(0, 1)),
)


# -- laws -------------------------------------------------------------------------------------
@PROPERTY
@given(seed=st.integers(0, 2**31), size=sizes, n=st.integers(0, 4))
def test_double_flip_is_the_identity(seed: int, size: tuple[int, int], n: int) -> None:
    data = _random_data(seed, *size, n)
    before = _copy(data)
    flip = RandomHorizontalFlip(p=1.0)
    rng = np.random.default_rng(0)
    once = flip(data, rng)
    if n and (before.visibility[:, 0] != before.visibility[:, 1]).any():
        assert not np.array_equal(once.visibility, before.visibility)  # slots really swapped
    twice = flip(once, rng)
    assert np.array_equal(twice.image, before.image)
    tol = 4 * np.finfo(np.float32).eps * max(size)
    np.testing.assert_allclose(twice.boxes, before.boxes, atol=tol, rtol=0)
    np.testing.assert_allclose(twice.landmarks, before.landmarks, atol=tol, rtol=0)
    assert np.array_equal(twice.visibility, before.visibility)
    np.testing.assert_allclose(twice.affine, [1, 1, 0, 0])


@PROPERTY
@given(
    seed=st.integers(0, 2**31),
    size=sizes,
    n=st.integers(0, 5),
    transforms=st.lists(transform_factory, min_size=1, max_size=4),
)
def test_any_transform_keeps_annotations_inside_and_on_the_affine(
    seed: int, size: tuple[int, int], n: int, transforms: list[object]
) -> None:
    data = _random_data(seed, *size, n)
    before = _copy(data)
    out = Compose(transforms)(data, np.random.default_rng(seed))  # type: ignore[arg-type]
    _assert_valid(out)
    # every kept object is its input object under the recorded map: the same box without
    # crops, a part of it with crops
    sx, sy, ox, oy = out.affine
    ids = out.object_ids
    mapped = affine_boxes(before.boxes[ids], sx, sy, ox, oy)
    if any(isinstance(t, (RandomCrop, RandomResizedCrop)) for t in transforms):
        assert (out.boxes[:, :2] >= mapped[:, :2] - 1e-3).all()
        assert (out.boxes[:, 2:] <= mapped[:, 2:] + 1e-3).all()
    else:
        assert len(ids) == n
        np.testing.assert_allclose(out.boxes, mapped, atol=1e-3)
    assert np.array_equal(out.labels, before.labels[ids])
    # a flip swapped slots: follow the sign of sx
    perm = SCHEMA.flip_permutation() if sx < 0 else np.arange(len(SCHEMA))
    src_points, src_vis = before.landmarks[ids][:, perm], before.visibility[ids][:, perm]
    shown = out.visibility > 0
    assert (src_vis[shown] == out.visibility[shown]).all()
    expect = np.stack([src_points[..., 0] * sx + ox, src_points[..., 1] * sy + oy], -1)
    np.testing.assert_allclose(out.landmarks[shown], expect[shown], atol=1e-3)


@PROPERTY
@given(
    seed=st.integers(0, 2**31),
    size=sizes,
    n=st.integers(0, 4),
    target=st.integers(4, 96),
    mode=st.sampled_from(["fixed", "shorter", "longer", "letterbox"]),
)
def test_resize_maps_annotations_exactly(seed: int, size: tuple[int, int], n: int, target: int, mode: str) -> None:
    data = _random_data(seed, *size, n)
    before = _copy(data)
    t = Resize(target, mode=mode)  # type: ignore[arg-type]
    out = t(data, np.random.default_rng(0))
    w, h = size
    cw, ch = t.content_size(w, h)
    ow, oh = t.output_size(w, h)
    assert out.image.shape == (oh, ow, 3)
    left, top = ((ow - cw) // 2, (oh - ch) // 2) if mode == "letterbox" else (0, 0)
    sx, sy = cw / w, ch / h
    np.testing.assert_allclose(out.affine, [sx, sy, left, top])
    expect = before.boxes.astype(np.float64) * [sx, sy, sx, sy] + [left, top, left, top]
    np.testing.assert_allclose(out.boxes, expect, rtol=1e-6, atol=1e-4)
    shown = before.visibility > 0
    pts = before.landmarks.astype(np.float64) * [sx, sy] + [left, top]
    np.testing.assert_allclose(out.landmarks[shown], pts[shown], rtol=1e-6, atol=1e-4)
    assert np.array_equal(out.visibility, before.visibility)  # nothing leaves the image
    if mode in ("shorter", "longer"):
        side = min(cw, ch) if mode == "shorter" else max(cw, ch)
        assert side == target


@pytest.mark.parametrize("mode", ["fixed", "letterbox"])
@pytest.mark.parametrize(("w", "h", "size"), [(40, 30, (100, 60)), (90, 70, (30, 20))])
def test_resized_pixels_sit_where_the_box_goes(mode: str, w: int, h: int, size: tuple[int, int]) -> None:
    image = np.zeros((h, w, 3), dtype=np.uint8)
    image[10:20, 12:26] = 255  # box (12, 10, 26, 20): pixels 12..25 x 10..19
    data = Annotated.create(image, [[12, 10, 26, 20]], [0])
    out = Resize(size, mode=mode)(data, np.random.default_rng(0))  # type: ignore[arg-type]
    gray = out.image[..., 0].astype(np.float64)
    ys, xs = np.mgrid[0 : gray.shape[0], 0 : gray.shape[1]]
    cx = (gray * (xs + 0.5)).sum() / gray.sum()
    cy = (gray * (ys + 0.5)).sum() / gray.sum()
    x1, y1, x2, y2 = out.boxes[0]
    assert abs(cx - (x1 + x2) / 2) < 0.1 and abs(cy - (y1 + y2) / 2) < 0.1


# -- flips --------------------------------------------------------------------------------------
def test_flip_swaps_left_and_right_landmarks() -> None:
    image = np.zeros((10, 100, 3), dtype=np.uint8)
    image[:, :50] = 200
    pts = [[[30, 5], [60, 5], [45, 7], [35, 9], [55, 9]]]
    data = Annotated.create(image, [[20, 1, 70, 10]], [1], pts, [[2, 1, 2, 0, 2]], schema=SCHEMA)
    out = RandomHorizontalFlip(p=1.0)(data, np.random.default_rng(0))
    assert out.image[0, 99, 0] == 200 and out.image[0, 0, 0] == 0
    assert out.boxes.tolist() == [[30, 1, 80, 10]]
    # the old right eye (x=60) is the new left eye at 100-60=40, hidden as it was
    assert out.landmarks[0, 0].tolist() == [40, 5] and out.visibility[0, 0] == 1
    assert out.landmarks[0, 1].tolist() == [70, 5] and out.visibility[0, 1] == 2
    assert out.landmarks[0, 2].tolist() == [55, 7]
    # the right mouth corner was absent: now the left one is, at (0, 0)
    assert out.visibility[0, 3] == 2 and out.visibility[0, 4] == 0
    assert out.landmarks[0, 4].tolist() == [0, 0]


def test_flip_kernel_permutation_contract() -> None:
    pts = np.array([[[1, 0], [2, 0], [3, 0]]], dtype=np.float32)
    vis = np.array([[2, 1, 2]], dtype=np.uint8)
    out, v = hflip_landmarks(pts, vis, 10, np.array([1, 0, 2]))
    assert out[0, :, 0].tolist() == [8, 9, 7] and v.tolist() == [[1, 2, 2]]


def test_flip_needs_a_permutation_for_landmarks() -> None:
    data = _random_data(0, 20, 20, 2)
    data.flip_permutation = None
    with pytest.raises(ValueError, match="no flip permutation"):
        RandomHorizontalFlip(p=1.0)(data, np.random.default_rng(0))
    out = RandomHorizontalFlip(p=1.0, schema=SCHEMA)(data, np.random.default_rng(0))
    _assert_valid(out)


def test_flip_probability_draws_from_the_given_generator() -> None:
    flip = RandomHorizontalFlip(p=0.5)
    flips = [flip(_random_data(0, 8, 8, 0), np.random.default_rng(s)).affine[0] < 0 for s in range(200)]
    assert 60 < sum(flips) < 140
    again = [flip(_random_data(0, 8, 8, 0), np.random.default_rng(s)).affine[0] < 0 for s in range(200)]
    assert flips == again


# -- crops --------------------------------------------------------------------------------------
def test_crop_drops_mostly_hidden_boxes_with_their_landmarks() -> None:
    image = np.zeros((100, 100, 3), dtype=np.uint8)
    boxes = [[10, 10, 30, 30], [40, 40, 60, 60], [45, 10, 85, 20]]
    pts = np.array(
        [[[20, 20]] * 5, [[50, 50]] * 5, [[50, 15], [80, 15], [60, 15], [70, 15], [75, 15]]], dtype=np.float32
    )
    data = Annotated.create(image, boxes, [0, 1, 2], pts, np.full((3, 5), 2), schema=SCHEMA)
    # window x 35..75, y 0..100 (forced: image width 100, window 40 -> x0 from the generator)
    crop = RandomCrop((40, 100), min_visibility=0.5)
    rng = np.random.default_rng(0)
    x0 = int(np.random.default_rng(0).integers(0, 61))
    out = crop(data, rng)
    assert out.image.shape == (100, 40, 3)
    kept = []
    for j, (bx0, _by0, bx1, _by1) in enumerate(boxes):
        inside = max(0, min(bx1, x0 + 40) - max(bx0, x0)) / (bx1 - bx0)
        if inside >= 0.5:
            kept.append(j)
    assert out.object_ids.tolist() == kept
    _assert_valid(out)
    for row, j in enumerate(kept):
        xs = pts[j, :, 0] - x0
        expect_vis = np.where((xs >= 0) & (xs <= 40), 2, 0)
        assert out.visibility[row].tolist() == expect_vis.tolist()


def test_crop_boxes_kernel() -> None:
    boxes = np.array([[4, 4, 10, 10], [8, 8, 12, 12], [20, 20, 30, 30]], dtype=np.float32)
    clipped, keep = crop_boxes(boxes, 5, 5, 5, 5, min_visibility=0.25)
    assert keep.tolist() == [True, True, False]
    assert clipped[0].tolist() == [0, 0, 5, 5] and clipped[1].tolist() == [3, 3, 5, 5]
    _, keep = crop_boxes(boxes, 5, 5, 5, 5, min_visibility=0.3)
    assert keep.tolist() == [True, False, False]  # box 1 keeps 4/16 of its area


def test_random_crop_pads_a_small_image() -> None:
    data = _random_data(1, 10, 12, 3)
    data.image[:] = 100
    out = RandomCrop(20, fill=7)(data, np.random.default_rng(0))
    assert out.image.shape == (20, 20, 3)
    assert (out.image == 7).sum() == 3 * (400 - 120)
    assert len(out.boxes) == 3  # all boxes stay whole
    _assert_valid(out)


def test_random_resized_crop_window_is_inside_and_falls_back() -> None:
    t = RandomResizedCrop(16, scale=(0.3, 0.6))
    rng = np.random.default_rng(0)
    for _ in range(50):
        x0, y0, w, h = t.window(50, 40, rng)
        assert 0 <= x0 and 0 <= y0 and x0 + w <= 50 and y0 + h <= 40
        assert 0.25 * 2000 <= w * h <= 0.65 * 2000
    narrow = RandomResizedCrop(16, scale=(0.99, 1.0), ratio=(1.0, 1.0), attempts=1)
    assert narrow.window(100, 10, np.random.default_rng(0)) == (45, 0, 10, 10)


# -- colour -------------------------------------------------------------------------------------
def test_adjust_colour() -> None:
    image = np.random.default_rng(0).integers(0, 256, (16, 16, 3), dtype=np.uint8)
    assert np.array_equal(adjust_colour(image), image)
    gray = adjust_colour(image, saturation=0.0)
    assert (np.abs(gray.astype(int) - gray[..., :1]) <= 0).all()
    assert (adjust_colour(image, brightness=0.0) == 0).all()
    assert adjust_colour(image, brightness=1.5).astype(int).sum() > image.astype(int).sum()
    flat = adjust_colour(image, contrast=0.0)
    assert flat.max() - flat.min() <= 1


def test_colour_jitter_leaves_geometry_alone() -> None:
    data = _random_data(3, 30, 20, 3)
    before = _copy(data)
    out = ColorJitter(0.5, 0.5, 0.5)(data, np.random.default_rng(1))
    assert not np.array_equal(out.image, before.image)
    assert np.array_equal(out.boxes, before.boxes) and np.array_equal(out.landmarks, before.landmarks)


# -- decode hints, kernels, arguments -------------------------------------------------------------
def test_min_input_size_looks_through_size_keeping_transforms() -> None:
    resize = Resize(100, mode="shorter")
    assert Compose([RandomHorizontalFlip(), ColorJitter(), resize]).min_input_size(800, 400) == (200, 100)
    assert Compose([RandomCrop(50), resize]).min_input_size(800, 400) is None
    assert min_input_size([Compose([RandomHorizontalFlip()]), Resize((64, 32))], 800, 400) == (64, 32)
    assert min_input_size([RandomHorizontalFlip()], 800, 400) is None


def test_resize_image_layouts_and_identity() -> None:
    image = np.random.default_rng(0).integers(0, 256, (10, 20, 3), dtype=np.uint8)
    assert resize_image(image, 20, 10) is image
    flipped = image[:, ::-1]
    a = resize_image(flipped, 40, 20)
    b = resize_image(np.ascontiguousarray(flipped), 40, 20)
    assert a.shape == (20, 40, 3) and np.array_equal(a, b)
    nearest = resize_image(image, 40, 20, "nearest")
    assert np.array_equal(nearest[::2, ::2], image)


def test_landmark_schema_mismatch_and_bad_arguments() -> None:
    image = np.zeros((4, 4, 3), dtype=np.uint8)
    with pytest.raises(ValueError, match="K=2 points but the schema has 5"):
        Annotated.create(image, [[0, 0, 1, 1]], [0], np.zeros((1, 2, 2)), schema=SCHEMA)
    with pytest.raises(ValueError, match="expected uint8"):
        Annotated.create(np.zeros((4, 4, 3), dtype=np.float32))
    with pytest.raises(ValueError, match="mode='square'"):
        Resize(10, mode="square")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="size=\\(10, 20\\): mode='shorter' needs one positive int"):
        Resize((10, 20), mode="shorter")
    with pytest.raises(ValueError, match="max_size=5"):
        Resize(10, mode="shorter", max_size=5)
    with pytest.raises(ValueError, match="p=1.5"):
        RandomHorizontalFlip(p=1.5)
    with pytest.raises(ValueError, match="scale=\\(0.5, 0.2\\)"):
        RandomResizedCrop(10, scale=(0.5, 0.2))
    with pytest.raises(ValueError, match="interpolation='cubic'"):
        Resize(10, interpolation="cubic")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="brightness=2"):
        ColorJitter(brightness=2)


def test_shorter_side_with_max_size() -> None:
    t = Resize(100, mode="shorter", max_size=150)
    assert t.content_size(400, 100) == (150, 38)
    assert t.content_size(120, 100) == (120, 100)
