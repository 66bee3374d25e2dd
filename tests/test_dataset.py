"""DetectionDataset: samples, reduced decoding, EXIF/size rules, seeds and epochs, pickling."""

from __future__ import annotations

import io
import pickle
import shutil
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from PIL import Image

from detloader import MISSING, read_annotations
from detloader.dataset import DetectionDataset, Sample
from detloader.transforms import ColorJitter, Compose, RandomHorizontalFlip, RandomResizedCrop, Resize


@pytest.fixture
def index(small_synth_root: Path):  # type: ignore[no-untyped-def]
    return read_annotations(small_synth_root)


def _first_with_objects(index) -> int:  # type: ignore[no-untyped-def]
    return int(np.flatnonzero(index.objects_per_image > 1)[0])


def test_sample_without_transform_is_the_annotation(index) -> None:  # type: ignore[no-untyped-def]
    ds = DetectionDataset(index, seed=0)
    assert len(ds) == len(index)
    i = _first_with_objects(index)
    s = ds[i]
    assert isinstance(s, Sample)
    view = index.image(i)
    assert s.image.dtype == torch.uint8 and tuple(s.image.shape) == (3, view.height, view.width)
    assert s.size == view.size and s.orig_size == view.size
    assert s.boxes.dtype == np.float32 and np.array_equal(s.boxes, view.boxes)
    assert s.labels.dtype == np.int64 and np.array_equal(s.labels, view.labels)
    assert s.landmarks.dtype == np.float32 and s.landmarks.shape == (len(view.boxes), 5, 2)
    assert s.visibility.dtype == np.uint8 and np.array_equal(s.visibility, view.visibility)
    shown = view.visibility > 0
    assert np.array_equal(s.landmarks[shown], view.landmarks[shown])
    assert (s.landmarks[~shown] == 0).all()
    assert s.scale == (1.0, 1.0) and s.offset == (0.0, 0.0)
    assert s.image_id == i and s.image_label == view.image_label
    lo = int(index.object_offsets[i])
    assert s.object_ids.tolist() == list(range(lo, lo + len(view.boxes)))
    # the pixels are the file's
    ref = np.asarray(Image.open(view.path).convert("RGB"))
    assert np.abs(s.image.permute(1, 2, 0).numpy().astype(int) - ref).mean() < 2
    # negative indices, out of range
    assert ds[-1].image_id == len(index) - 1
    with pytest.raises(IndexError, match="i=24 out of range for 24"):
        ds[len(index)]


def test_resize_uses_a_reduced_decode_and_maps_boxes_exactly(index) -> None:  # type: ignore[no-untyped-def]
    i = _first_with_objects(index)
    w, h = index.image(i).size  # 320 x 240
    fast = DetectionDataset(index, Resize((w // 2, h // 2)), seed=0)
    slow = DetectionDataset(index, Resize((w // 2, h // 2)), seed=0, reduced_decode=False)
    assert fast.load(i).image.shape == (h // 2, w // 2, 3)  # decoded at 1/2 by libjpeg
    assert slow.load(i).image.shape == (h, w, 3)
    a, b = fast[i], slow[i]
    assert a.scale == b.scale == (0.5, 0.5)
    np.testing.assert_allclose(a.boxes, index.image(i).boxes * 0.5, rtol=1e-6)
    np.testing.assert_array_equal(a.boxes, b.boxes)
    diff = (a.image.int() - b.image.int()).abs().float().mean().item()
    assert diff < 4.0  # the same picture, by another route
    # a resize that shrinks less than 2x decodes at full size
    assert DetectionDataset(index, Resize((w - 10, h - 10))).load(i).image.shape == (h, w, 3)


def test_boxes_map_back_to_the_annotation(index) -> None:  # type: ignore[no-untyped-def]
    t = Compose([RandomHorizontalFlip(p=1.0), Resize((100, 200), mode="letterbox")])
    ds = DetectionDataset(index, t, seed=0)
    i = _first_with_objects(index)
    s = ds[i]
    assert s.scale[0] < 0 and s.offset[1] > 0
    np.testing.assert_allclose(s.boxes_to_original(s.boxes), index.image(i).boxes, atol=1e-3)
    shown = s.visibility > 0
    back = s.landmarks_to_original(s.landmarks)
    perm = index.landmark_schema.flip_permutation()
    np.testing.assert_allclose(back[shown], index.image(i).landmarks[:, perm][shown], atol=1e-3)


def test_per_sample_generators_follow_seed_and_epoch(index) -> None:  # type: ignore[no-untyped-def]
    t = Compose([RandomHorizontalFlip(), ColorJitter(), RandomResizedCrop(64)])
    ds = DetectionDataset(index, t, seed=7)
    first = [ds[i] for i in range(6)]
    again = [ds[i] for i in range(6)]  # same epoch: the same samples, in any order
    for a, b in zip(first, again):
        assert torch.equal(a.image, b.image) and np.array_equal(a.boxes, b.boxes)
    assert torch.equal(ds[3].image, first[3].image)
    ds.set_epoch(1)
    assert ds.epoch == 1
    assert any(not torch.equal(ds[i].image, first[i].image) for i in range(6))
    other = DetectionDataset(index, t, seed=8)
    assert any(not torch.equal(other[i].image, first[i].image) for i in range(6))
    with pytest.raises(ValueError, match="epoch=-1"):
        ds.set_epoch(-1)
    assert isinstance(DetectionDataset(index, t).seed, int)  # seed=None draws one


def test_epoch_is_shared_with_pickled_copies(index) -> None:  # type: ignore[no-untyped-def]
    from multiprocessing.reduction import ForkingPickler

    import torch.multiprocessing  # noqa: F401  (registers the shared-memory reducers)

    ds = DetectionDataset(index, seed=0)
    buf = io.BytesIO()
    ForkingPickler(buf, pickle.HIGHEST_PROTOCOL).dump(ds)
    copy = pickle.loads(buf.getvalue())
    ds.set_epoch(5)
    assert copy.epoch == 5  # the same shared-memory cell


def test_dataset_pickles_small(index) -> None:  # type: ignore[no-untyped-def]
    ds = DetectionDataset(index, Compose([RandomHorizontalFlip(), Resize(64)]), seed=0)
    blob = pickle.dumps(ds)
    assert len(blob) < 8_000  # the index travels as its cache file name, no per-sample lists
    copy = pickle.loads(blob)
    assert torch.equal(copy[2].image, ds[2].image)


def test_arguments_are_checked(index) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(TypeError, match="expected an AnnotationIndex"):
        DetectionDataset([1, 2, 3])  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="is not callable"):
        DetectionDataset(index, transform=3)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="exif='yes'"):
        DetectionDataset(index, exif="yes")  # type: ignore[arg-type]

    def bad(data, rng):  # type: ignore[no-untyped-def]
        data.image = data.image.astype(np.float32)
        return data

    with pytest.raises(ValueError, match="expected numpy uint8"):
        DetectionDataset(index, bad)[0]


# -- files that disagree with their annotation ------------------------------------------------
def _voc(
    root: Path, name: str, image: Image.Image, size: tuple[int, int], box: tuple[int, ...], **save: object
) -> None:
    (root / "Annotations").mkdir(parents=True, exist_ok=True)
    (root / "JPEGImages").mkdir(parents=True, exist_ok=True)
    image.save(root / "JPEGImages" / f"{name}.jpg", "JPEG", quality=95, **save)
    x1, y1, x2, y2 = box
    (root / "Annotations" / f"{name}.xml").write_text(
        f"<annotation><filename>{name}.jpg</filename>"
        f"<size><width>{size[0]}</width><height>{size[1]}</height><depth>3</depth></size>"
        f"<object><name>thing</name><bndbox><xmin>{x1}</xmin><ymin>{y1}</ymin>"
        f"<xmax>{x2}</xmax><ymax>{y2}</ymax></bndbox></object></annotation>"
    )


def _exif(orientation: int) -> bytes:
    exif = Image.Exif()
    exif[0x0112] = orientation
    return exif.tobytes()


def test_exif_rotation_follows_the_annotation_size(tmp_path: Path) -> None:
    raw = Image.new("RGB", (80, 40), (0, 0, 0))
    _voc(tmp_path, "rotated", raw, (40, 80), (5, 10, 30, 70), exif=_exif(6))
    _voc(tmp_path, "raw", raw, (80, 40), (10, 5, 70, 30), exif=_exif(6))
    index = read_annotations(tmp_path, check_images=False)
    ds = DetectionDataset(index)
    names = [index.relative_image_path(i) for i in range(len(index))]
    rot, keep = names.index("JPEGImages/rotated.jpg"), names.index("JPEGImages/raw.jpg")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert tuple(ds[rot].image.shape) == (3, 80, 40)
    with pytest.warns(RuntimeWarning, match="EXIF orientation 6 not applied"):
        assert tuple(ds[keep].image.shape) == (3, 40, 80)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # once per process
        ds[keep]
    with pytest.warns(RuntimeWarning, match="image is 80x40 but its annotation says 40x80"):
        assert tuple(DetectionDataset(index, exif="ignore")[rot].image.shape) == (3, 40, 80)


def test_size_mismatch_scales_annotations_and_warns_once(tmp_path: Path) -> None:
    image = Image.new("RGB", (100, 50), (9, 9, 9))
    _voc(tmp_path, "a", image, (200, 100), (20, 10, 120, 90))
    _voc(tmp_path, "b", image, (200, 100), (0, 0, 200, 100))
    index = read_annotations(tmp_path, check_images=False)
    ds = DetectionDataset(index)
    with pytest.warns(RuntimeWarning, match="image is 100x50 but its annotation says 200x100"):
        s = ds[0]
    assert s.scale == (0.5, 0.5) and s.orig_size == (200, 100)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        t = ds[1]
    assert t.boxes.tolist() == [[0, 0, 100, 50]]
    assert {tuple(s.boxes[0].tolist()), tuple(t.boxes[0].tolist())} == {(10, 5, 60, 45), (0, 0, 100, 50)}


def test_a_broken_image_names_its_file(tmp_path: Path, small_synth_root: Path) -> None:
    root = tmp_path / "copy"
    shutil.copytree(small_synth_root, root)
    index = read_annotations(root)
    target = index.image_path(0)
    target.write_bytes(b"garbage")
    with pytest.raises(ValueError, match=target.name):
        DetectionDataset(index)[0]


def test_image_label_missing_is_kept(tmp_path: Path) -> None:
    _voc(tmp_path, "a", Image.new("RGB", (10, 10)), (10, 10), (1, 1, 5, 5))
    index = read_annotations(tmp_path, check_images=False)
    assert DetectionDataset(index)[0].image_label == MISSING


def test_only_a_transform_that_draws_gets_a_generator(index, monkeypatch: pytest.MonkeyPatch) -> None:  # type: ignore[no-untyped-def]
    from detloader.transforms.base import draws

    class MyResize(Resize):  # a subclass may draw: it is not taken at its parent's word
        pass

    assert not draws(Resize(64)) and not draws(Compose([Resize(64), Compose([Resize(32)])]))
    assert draws(Compose([RandomHorizontalFlip(), Resize(64)])) and draws(MyResize(64))
    assert draws(lambda data, rng: data)
    made: list[int] = []
    generator = DetectionDataset.generator
    monkeypatch.setattr(
        DetectionDataset, "generator", lambda self, i, epoch=None: made.append(i) or generator(self, i, epoch)
    )
    ds = DetectionDataset(index, Compose([Resize(64)]), seed=0)
    ds[0]
    assert made == []
    ds.transform = Compose([RandomHorizontalFlip(), Resize(64)])  # replaced: told again
    ds[3]
    assert made == [3]


_INSIDE = [0.0, 0.25, 0.5, 1.0]  # x W or H
_EDGE = [-0.0, -1e-4, 0.5, 1.0 + 1e-4, 1.0 + 2e-3, float("nan"), float("inf")]


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_objects_in_frame_skip_a_clip_that_would_change_nothing(index, data) -> None:  # type: ignore[no-untyped-def]
    """The clip at the annotated size is skipped for images whose objects lie in the frame: the
    arrays equal, bit for bit, those of the clip. Objects drawn inside, then a few values
    spoiled: on and across every edge, -0.0, NaN, an absent point off (0, 0)."""
    idx = index.subset(np.arange(len(index)))
    m, k = idx.landmarks.shape[:2]
    w = idx.width[idx.object_image].astype(np.float64)[:, None]
    h = idx.height[idx.object_image].astype(np.float64)[:, None]

    def draw(values: list[float], n: int) -> np.ndarray:
        return np.array(data.draw(st.lists(st.sampled_from(values), min_size=n, max_size=n)), dtype=np.float64)

    corners = np.sort(draw(_INSIDE, m * 4).reshape(m, 2, 2), axis=1)  # [object, corner, axis]: x1 <= x2
    boxes = corners.reshape(m, 4)
    points = draw(_INSIDE, m * k * 2).reshape(m, k, 2)
    vis = draw([0, 1, 2], m * k).astype(np.uint8).reshape(m, k)
    points[vis == 0] = 0.0
    spoil = st.tuples(st.integers(0, m - 1), st.integers(0, 3), st.integers(0, max(k - 1, 0)), st.sampled_from(_EDGE))
    for obj, j, p, value in data.draw(st.lists(spoil, max_size=4)):
        if data.draw(st.booleans()) or not k:
            boxes[obj, j] = value
        else:
            points[obj, p, j % 2] = value
    idx.boxes = (boxes * np.hstack([w, h, w, h])).astype(np.float32)
    idx.landmarks = (points * np.stack([np.repeat(w, k, 1), np.repeat(h, k, 1)], axis=-1)).astype(np.float32)
    idx.visibility = vis
    ds = DetectionDataset(idx, seed=0)
    clipped = DetectionDataset(idx, seed=0)
    clipped._frame = np.zeros(len(idx), dtype=np.bool_)  # every image clipped
    for i in range(len(idx)):
        image = np.zeros((int(idx.height[i]), int(idx.width[i]), 3), dtype=np.uint8)
        a, b = ds._annotated(i, image, 1.0, 1.0), clipped._annotated(i, image, 1.0, 1.0)
        for name in ("boxes", "labels", "landmarks", "visibility", "object_ids", "affine"):
            assert getattr(a, name).tobytes() == getattr(b, name).tobytes(), (i, name)
    assert ds._in_frame()[idx.objects_per_image > 0].any()  # the skip is taken
