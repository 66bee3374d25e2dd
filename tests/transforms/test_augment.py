"""Detection augmentations: mosaic and mixup with partners from the loader's own (balanced)
order, random affine with landmarks, hue, flip pairs, aspect-ratio batches, pictures."""

from __future__ import annotations

import itertools
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
from helpers import voc_object, voc_xml, write_image
from hypothesis import given, settings
from hypothesis import strategies as st
from PIL import Image

import detloader
from detloader import MISSING
from detloader.annotations.landmarks import FACE5, FlipPairWarning, LandmarkSchema, infer_flip_pairs
from detloader.balance import AspectRatioBatchSampler, PartnerSampler, WeightedSampler
from detloader.balance.wrappers import PARTNER_EPOCHS
from detloader.show import show_dataset
from detloader.synth import make_synthetic
from detloader.transforms import (
    Annotated,
    ColorJitter,
    Compose,
    MixUp,
    Mosaic,
    RandomAffine,
    RandomHorizontalFlip,
    Resize,
    adjust_colour,
    crop_boxes,
    warp_boxes,
    warp_points,
)

PROPERTY = settings(max_examples=40, deadline=None)


@pytest.fixture(scope="module")
def synth(tmp_path_factory: pytest.TempPathFactory) -> detloader.AnnotationIndex:
    """200 small synthetic faces: classes about 90 / 8 / 2 %."""
    return detloader.read_annotations(make_synthetic(tmp_path_factory.mktemp("aug") / "s", 200, seed=0, size=(96, 72)))


def _data(seed: int, w: int, h: int, n: int) -> Annotated:
    """Random image, n boxes and FACE5 landmarks (some absent) inside it."""
    rng = np.random.default_rng(seed)
    x = np.sort(rng.uniform(0, w, (n, 2)), axis=1)
    y = np.sort(rng.uniform(0, h, (n, 2)), axis=1)
    boxes = np.stack([x[:, 0], y[:, 0], x[:, 1] + 1e-3, y[:, 1] + 1e-3], 1).clip(0, [w, h, w, h])
    points = np.stack([rng.uniform(0, w, (n, 5)), rng.uniform(0, h, (n, 5))], -1)
    return Annotated.create(
        rng.integers(0, 256, (h, w, 3), dtype=np.uint8), boxes, rng.integers(0, 3, n), points,
        rng.integers(0, 3, (n, 5)), schema=FACE5,
    )


def _assert_points_inside(d: Annotated) -> None:
    """Visible landmarks strictly inside the image (never clipped onto its border); the
    others at (0, 0) with visibility 0; boxes inside with positive size."""
    w, h = d.width, d.height
    on = d.visibility > 0
    assert ((d.landmarks[on] > 0) & (d.landmarks[on] < [w, h])).all()
    assert (d.landmarks[~on] == 0).all()
    b = d.boxes
    assert (b[:, :2] >= 0).all() and (b[:, 2] <= w).all() and (b[:, 3] <= h).all()
    assert ((b[:, 2] > b[:, 0]) & (b[:, 3] > b[:, 1])).all()


# -- RandomAffine ----------------------------------------------------------------------------
@PROPERTY
@given(seed=st.integers(0, 10_000), w=st.integers(16, 90), h=st.integers(16, 90), n=st.integers(0, 6))
def test_affine_moves_landmarks_with_the_image_and_never_onto_the_border(seed, w, h, n):
    data = _data(seed, w, h, n)
    before = (data.landmarks.copy(), data.visibility.copy())
    boxes = data.boxes.copy()
    t = RandomAffine(degrees=40, translate=0.3, scale=(0.5, 2.0), shear=10, mirror=0.5)
    out = t(data, np.random.default_rng(seed))
    _assert_points_inside(out)
    m = t.matrix(w, h, np.random.default_rng(seed))  # the matrix is drawn first: replayed
    # boxes around the moved corners, kept when a quarter of that box stays inside
    clipped, keep = crop_boxes(warp_boxes(boxes, m), 0, 0, w, h, 0.25)
    assert out.object_ids.tolist() == np.flatnonzero(keep).tolist()
    np.testing.assert_allclose(out.boxes, clipped[keep])
    expected = warp_points(*before, m)[out.object_ids]
    vis = before[1][out.object_ids]
    if np.linalg.det(m[:, :2]) < 0:  # mirrored: slots swapped (left eye stays left_eye)
        perm = FACE5.flip_permutation()
        expected, vis = expected[:, perm], vis[:, perm]
    on = out.visibility > 0
    np.testing.assert_allclose(out.landmarks[on], expected[on], atol=1e-3)
    inside = ((expected > 0) & (expected < [w, h])).all(-1) & (vis > 0)
    assert (on == inside).all(), "points inside stay visible, points outside get visibility 0"
    assert (out.visibility[on] == vis[on]).all()


def test_affine_records_its_map():
    t = RandomAffine(translate=0.3, scale=(0.5, 2.0))  # axis-aligned: the exact map
    m = t.matrix(40, 30, np.random.default_rng(1))
    out = t(Annotated.create(np.zeros((30, 40, 3), np.uint8)), np.random.default_rng(1))
    np.testing.assert_allclose(out.affine, [m[0, 0], m[1, 1], m[0, 2], m[1, 2]])
    # rotated: no map back (NaN offsets); the scale's sign still says it mirrored
    rotated = RandomAffine(degrees=30, mirror=1.0)(
        Annotated.create(np.zeros((40, 40, 3), np.uint8)), np.random.default_rng(0)
    )
    assert np.isnan(rotated.affine[2:]).all() and rotated.affine[0] < 0 < rotated.affine[1]


def test_mirroring_affine_swaps_left_and_right_slots():
    data = Annotated.create(
        np.zeros((50, 50, 3), np.uint8), [[10, 10, 40, 40]], [0],
        np.array([[[15, 20], [35, 20], [25, 25], [18, 35], [32, 35]]], np.float32), schema=FACE5,
    )
    out = RandomAffine(translate=0, scale=(1, 1), mirror=1.0)(data, np.random.default_rng(0))
    # a pure mirror about the centre: x -> 50 - x, and the left eye (15) is the new right eye
    np.testing.assert_allclose(out.landmarks[0], [[15, 20], [35, 20], [25, 25], [18, 35], [32, 35]])
    np.testing.assert_allclose(out.affine, [-1, 1, 50, 0])


# -- Mosaic ----------------------------------------------------------------------------------
def _tile(boxes, points, value: int = 200) -> Annotated:
    b = np.asarray(boxes, np.float32).reshape(-1, 4)
    p = np.asarray(points, np.float32).reshape(len(b), 5, 2)
    return Annotated.create(np.full((100, 100, 3), value, np.uint8), b, np.arange(len(b)), p, schema=FACE5)


def test_mosaic_layout_clipping_dropping_and_landmarks_outside():
    # full-size tiles (scale 1) around the centre (50, 50): each shows one quarter of its image
    mosaic = Mosaic(center=(0.5, 0.5), scale=(1.0, 1.0), min_visibility=0.25)
    row = lambda x, y: [[x, y]] * 5  # noqa: E731
    tiles = [
        _tile([[60, 60, 80, 80], [10, 10, 30, 30], [40, 60, 60, 80], [42, 60, 52, 80]],
              [row(70, 70), row(20, 20), [[45, 70], [55, 70], [55, 75], [55, 75], [55, 75]], row(51, 70)]),
        _tile([], [], 10),
        _tile([], [], 20),
        _tile([[10, 10, 20, 20]], [row(15, 15)], 30),
    ]
    out = mosaic(tiles, 100, 100, np.random.default_rng(0))
    _assert_points_inside(out)
    # tile 0 spans [-50, 50]^2: box A is inside; B is gone; C keeps half (clipped at x = 0);
    # D keeps 2 of 10 px (20 % < 25 %) and is dropped with its landmarks; tile 3 spans [50, 150]^2
    assert out.labels.tolist() == [0, 2, 0]
    np.testing.assert_allclose(out.boxes, [[10, 10, 30, 30], [0, 10, 10, 30], [60, 60, 70, 70]])
    # C's first point (x 45 -> -5) left the canvas: visibility 0, slot kept, not clipped to 0
    assert out.visibility[1].tolist() == [0, 2, 2, 2, 2] and out.landmarks[1, 0].tolist() == [0, 0]
    np.testing.assert_allclose(out.landmarks[1, 1], [5, 20])
    quadrants = [out.image[:50, :50], out.image[:50, 50:], out.image[50:, :50], out.image[50:, 50:]]
    assert [int(q.min()) for q in quadrants] == [int(q.max()) for q in quadrants] == [200, 10, 20, 30]


@PROPERTY
@given(seed=st.integers(0, 10_000), w=st.integers(8, 90), h=st.integers(8, 90))
def test_mosaic_keeps_each_object_and_its_landmarks_in_its_quadrant(seed, w, h):
    rng = np.random.default_rng(seed)
    tiles = [_data(seed + k, *(int(v) for v in rng.integers(8, 90, 2)), int(rng.integers(0, 5))) for k in range(4)]
    out = Mosaic()(tiles, w, h, np.random.default_rng(seed))
    _assert_points_inside(out)
    draw = np.random.default_rng(seed)  # the centre is drawn first: replayed
    cx = min(max(round(w * draw.uniform(0.25, 0.75)), 1), w - 1)
    cy = min(max(round(h * draw.uniform(0.25, 0.75)), 1), h - 1)
    for box, points, vis in zip(out.boxes, out.landmarks, out.visibility):
        x0, x1 = (0, cx) if box[2] <= cx else (cx, w)
        y0, y1 = (0, cy) if box[3] <= cy else (cy, h)
        assert x0 <= box[0] and box[2] <= x1 and y0 <= box[1] and box[3] <= y1
        on = points[vis > 0]
        assert ((on >= [x0, y0]) & (on <= [x1, y1])).all(), "a landmark crossed into another image"


def test_mosaic_samples_have_no_image_class_and_landmarks_inside(synth):
    ds = detloader.DetectionDataset(
        synth, Compose([RandomAffine(degrees=15, shear=3, mirror=0.5), Resize(80, mode="letterbox")]), seed=0
    )
    ds = ds.with_mix(Mosaic(1.0))
    for k in range(20):
        s = ds[[k, k + 1, k + 2, k + 3]]
        assert s.image_label == MISSING and s.image_id == k and s.size == (80, 80)
        w, h = s.size
        on = s.visibility > 0
        assert ((s.landmarks[on] > 0) & (s.landmarks[on] < [w, h])).all()
        # the objects come from the four images of the group
        assert set(synth.object_image[s.object_ids].tolist()) <= {k, k + 1, k + 2, k + 3}
    with pytest.raises(ValueError, match="index group .* 2 indices"):
        ds[[0, 1]]


def test_mixup_blends_and_keeps_the_objects_of_both():
    a = Annotated.create(np.full((20, 30, 3), 100, np.uint8), [[1, 1, 5, 5]], [0])
    b = Annotated.create(np.full((10, 10, 3), 200, np.uint8), [[1, 1, 5, 5]], [1])  # fits as 20x20
    out = MixUp(alpha=1e6)(a, b, np.random.default_rng(0))  # r ~ 0.5
    assert out.labels.tolist() == [0, 1] and out.image.shape == (20, 30, 3)
    np.testing.assert_allclose(out.boxes[1], [2, 2, 10, 10])  # the partner fitted: scaled 2x
    assert abs(int(out.image[0, 0, 0]) - 150) <= 1 and abs(int(out.image[-1, -1, 0]) - 50) <= 1


# -- the loader: balance, workers, resume, switching off ------------------------------------
def _objects(loader, epochs: int) -> np.ndarray:
    counts = np.zeros(3)
    for e in range(epochs):
        detloader.set_epoch(loader, e)
        for batch in loader:
            counts += np.bincount(batch.labels.numpy(), minlength=3)
    return counts / counts.sum()


def test_mosaic_keeps_the_balanced_class_shares(synth):
    raw = np.bincount(synth.labels, minlength=3) / len(synth.labels)
    ds = detloader.DetectionDataset(synth, seed=0)
    plain = _objects(detloader.make_loader(ds, batch_size=16, balance="sqrt", seed=0), 3)
    mosaic = _objects(detloader.make_loader(ds, batch_size=16, balance="sqrt", seed=0, mosaic=1.0), 3)
    assert raw[2] < 0.03 and plain[2] > 2 * raw[2]  # the rare class, balanced up
    # partners from the same balanced stream: within 25 % of the share without mosaic
    # (partners drawn uniformly would bring it three quarters of the way back to raw)
    assert abs(mosaic[2] - plain[2]) <= 0.25 * plain[2], (raw, plain, mosaic)


def _batches(loader, epochs=(0, 1)) -> list[tuple[torch.Tensor, ...]]:
    out = []
    for e in epochs:
        detloader.set_epoch(loader, e)
        out += [(b.images.clone(), b.boxes.clone(), b.visibility.clone(), b.image_labels.clone()) for b in loader]
    return out


def _same(a, b) -> bool:
    return len(a) == len(b) and all(torch.equal(x, y) for p, q in zip(a, b) for x, y in zip(p, q))


@pytest.mark.parametrize("workers, threads", [(2, 0), (0, 2)])
def test_identical_batches_for_any_num_workers_and_decode_threads(synth, workers, threads):
    ds = detloader.DetectionDataset(
        synth, Compose([RandomAffine(degrees=10), ColorJitter(hue=0.05), Resize(64, mode="letterbox")]), seed=3
    )
    kw = dict(batch_size=8, balance="sqrt", seed=1, mosaic=0.5, mixup=0.3)
    reference = _batches(detloader.make_loader(ds, **kw))
    assert _same(reference, _batches(detloader.make_loader(ds, num_workers=workers, decode_threads=threads, **kw)))
    labels = torch.cat([b[3] for b in reference])
    assert 0 < int((labels == MISSING).sum()) < len(labels)  # some mixed samples, some plain


def test_resume_with_mosaic_yields_exactly_the_rest(synth):
    ds = detloader.DetectionDataset(synth, Resize(48, mode="letterbox"), seed=0)

    def make(workers=0):
        return detloader.ResumableLoader(detloader.make_loader(
            ds, batch_size=6, balance="sqrt", seed=2, mosaic=0.5, num_workers=workers))

    whole = make()
    whole.set_epoch(1)
    reference = [b.images.clone() for b in whole]
    loader = make(workers=2)
    loader.set_epoch(1)
    head = [b.images.clone() for b in itertools.islice(loader, 5)]
    state = loader.state_dict()
    resumed = make()
    resumed.load_state_dict(state)
    resumed.set_epoch(1)
    rest = [b.images.clone() for b in resumed]
    assert len(head) + len(rest) == len(reference)
    assert all(torch.equal(a, b) for a, b in zip(head + rest, reference))


def test_mosaic_epochs_switch_off_gives_the_plain_samples(synth):
    ds = detloader.DetectionDataset(synth, Resize(48, mode="letterbox"), seed=0)
    plain = _batches(detloader.make_loader(ds, batch_size=8, balance="sqrt", seed=4), epochs=(2,))
    mosaic = detloader.make_loader(ds, batch_size=8, balance="sqrt", seed=4, mosaic=Mosaic(1.0, epochs=2))
    assert all((b[3] == MISSING).all() for b in _batches(mosaic, epochs=(1,)))
    # from epoch 2 on no mosaic: the first index of each group, the same batches as without
    assert _same(_batches(mosaic, epochs=(2,)), plain)


def test_partners_follow_the_wrapped_sampler_and_its_ranks():
    weights = np.linspace(1, 4, 50)
    for rank in (0, 1):
        base = WeightedSampler(weights, seed=3, rank=rank, world_size=2)
        groups = PartnerSampler(WeightedSampler(weights, seed=3, rank=rank, world_size=2), 3)
        groups.set_epoch(5)
        items = np.array(list(groups))
        base.set_epoch(5)
        assert items.shape == (25, 4) and (items[:, 0] == base.indices()).all()
        base.set_epoch(5 + 2 * PARTNER_EPOCHS)
        assert (items[:, 2] == base.indices()).all()


def test_mosaic_refuses_what_it_cannot_do(synth):
    ds = detloader.DetectionDataset(synth)
    with pytest.raises(ValueError, match="partners from the loader's order: pass shuffle=True"):
        detloader.make_loader(ds, batch_size=2, mosaic=0.5)
    with pytest.raises(ValueError, match="so batch_sampler cannot be combined"):
        detloader.make_loader(ds, batch_sampler=[[0, 1]], mosaic=0.5)
    with pytest.raises(ValueError, match="world_size=2: AspectRatioBatchSampler shares"):
        AspectRatioBatchSampler(WeightedSampler(np.ones(4), rank=0, world_size=2), np.ones(4), 2)


# -- colour, flip pairs ----------------------------------------------------------------------
def test_hue_turns_red_to_green_and_keeps_grey():
    image = np.array([[[255, 0, 0], [128, 128, 128]]], np.uint8)
    out = adjust_colour(image, hue=1 / 3)
    assert out[0, 0].tolist() == [0, 255, 0] and out[0, 1].tolist() == [128, 128, 128]
    with pytest.raises(ValueError, match="hue=0.7"):
        ColorJitter(hue=0.7)


def test_flip_pairs_inferred_from_names():
    assert infer_flip_pairs(["left_eye", "right_eye", "l_ear", "r_ear", "hand_left", "hand_right",
                             "eyeL", "eyeR", "LEye", "REye", "nose"]) == ((0, 1), (2, 3), (4, 5), (6, 7), (8, 9))
    # words that only contain a side are no side
    assert infer_flip_pairs(["cleft", "bright", "Lip", "Rim"]) == ()
    assert LandmarkSchema.from_names(["eye-l", "eye-r"]).flip_pairs == ((0, 1),)


def test_asymmetric_pairs_and_missing_partners_are_named():
    lone = LandmarkSchema.from_names(["left_eye", "right_eye", "left_ear", "nose"])
    assert lone.flip_problems() == [
        ("flip_partner_missing", "landmark 'left_ear' has no partner 'right_ear': a flip keeps it in its slot"),
    ]
    crossed = LandmarkSchema.from_names(["left_eye", "right_eye", "nose"], flip_pairs=[("left_eye", "nose")])
    kinds = {k for k, _ in crossed.flip_problems()}
    assert kinds == {"flip_pair_asymmetric"}
    assert "'left_eye' is paired with 'nose', not its mirror 'right_eye'" in crossed.flip_problems()[0][1]
    with pytest.warns(FlipPairWarning, match=r"left_ear.*\[flip_partner_missing\]") as caught:
        RandomHorizontalFlip(schema=lone)
    assert caught[0].message.kind == "flip_partner_missing"
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        FACE5.flip_permutation()  # a sound schema: no warning


# -- aspect-ratio batches --------------------------------------------------------------------
@pytest.fixture(scope="module")
def mixed_aspect(tmp_path_factory: pytest.TempPathFactory) -> detloader.AnnotationIndex:
    """24 images: 64x48 (wide), 48x64 (tall) and 40x80 (very tall), one object each."""
    root = tmp_path_factory.mktemp("aspect")
    sizes = [(64, 48), (48, 64), (40, 80)]
    for i in range(24):
        w, h = sizes[i % 3]
        write_image(root / "JPEGImages" / f"im{i:02d}.jpg", (w, h))
        xml = voc_xml(f"im{i:02d}.jpg", [voc_object("a", (2, 2, 20, 20))], size=(w, h))
        (root / "Annotations").mkdir(exist_ok=True)
        (root / "Annotations" / f"im{i:02d}.xml").write_text(xml)
    return detloader.read_annotations(root)


def _padding(loader) -> tuple[int, int]:
    padded = content = 0
    for b in loader:
        sizes = b.image_sizes
        padded += b.images.shape[0] * b.images.shape[2] * b.images.shape[3] - int((sizes[:, 0] * sizes[:, 1]).sum())
        content += int((sizes[:, 0] * sizes[:, 1]).sum())
    return padded, content


def test_group_by_aspect_pads_less_and_keeps_every_image(mixed_aspect):
    ds = detloader.DetectionDataset(mixed_aspect, seed=0)
    mixed, content = _padding(detloader.make_loader(ds, batch_size=4, shuffle=True, seed=0))
    two, _ = _padding(detloader.make_loader(ds, batch_size=4, shuffle=True, seed=0, group_by_aspect=True))
    three, _ = _padding(detloader.make_loader(ds, batch_size=4, shuffle=True, seed=0, group_by_aspect=(0.7, 1.0)))
    assert mixed > 0.3 * content and two < mixed / 2 and three == 0, (mixed, two, three, content)
    # evaluation: the index order, every image exactly once, no padding within a bucket
    loader = detloader.make_loader(ds, batch_size=5, group_by_aspect=(0.7, 1.0))
    ids = [i for b in loader for i in b.image_ids.tolist()]
    assert sorted(ids) == list(range(24)) and len(loader) == 6  # 8 per bucket: 5 + 3, three buckets
    assert ids[:5] == [0, 3, 6, 9, 12]  # the first bucket to fill: the wide images


def test_group_by_aspect_is_seeded_and_resumable(mixed_aspect):
    ds = detloader.DetectionDataset(mixed_aspect, seed=0)

    def make():
        return detloader.ResumableLoader(detloader.make_loader(
            ds, batch_size=3, balance="sqrt", seed=5, group_by_aspect=True, mosaic=0.5))

    whole = make()
    whole.set_epoch(2)
    reference = [b.image_ids.tolist() for b in whole]
    loader = make()
    loader.set_epoch(2)
    head = [b.image_ids.tolist() for b in itertools.islice(loader, 3)]
    resumed = make()
    resumed.load_state_dict(loader.state_dict())
    resumed.set_epoch(2)
    assert head + [b.image_ids.tolist() for b in resumed] == reference
    sizes = mixed_aspect.width / mixed_aspect.height
    assert all(len({sizes[i] >= 1 for i in batch}) == 1 for batch in reference)  # one bucket per batch
    # ranks share whole batches out, as many to each (here without padding: drop_last)
    order = WeightedSampler(np.ones(24), replacement=False, seed=1)
    whole = AspectRatioBatchSampler(order, sizes, 4, drop_last=True, world_size=1)
    parts = [AspectRatioBatchSampler(order, sizes, 4, drop_last=True, rank=r, world_size=2) for r in (0, 1)]
    batches = list(whole)
    assert [list(p) for p in parts] == [batches[r::2] for r in (0, 1)] and len(parts[0]) == 3


# -- pictures --------------------------------------------------------------------------------
def test_show_renders_mosaic_and_affine_samples(synth, tmp_path: Path):
    ds = detloader.DetectionDataset(
        synth, Compose([RandomAffine(degrees=20, mirror=1.0), Resize(96, mode="letterbox")]), seed=0
    )
    assert all(ds[i].scale[0] < 0 for i in range(4))  # mirrored: show captions "flipped"
    affine = show_dataset(ds, tmp_path / "affine.png", n=4, after_transform=True, tile=96)
    mixed = show_dataset(ds.with_mix(Mosaic(1.0), MixUp(0.5)), tmp_path / "mix.png", n=4, after_transform=True, tile=96)
    for grid in (affine, mixed):
        assert grid.path is not None and Image.open(grid.path).size == grid.image.size
    assert affine.image_ids == mixed.image_ids  # the same first images, drawn as mosaics
    assert np.asarray(affine.image).tobytes() != np.asarray(mixed.image).tobytes()
