"""collate_detection and Batch: padding, flat targets, user tuples, device helpers."""

from __future__ import annotations

import functools
import pickle
from pathlib import Path

import numpy as np
import pytest
import torch

from detloader import MISSING, read_annotations
from detloader.collate import Batch, collate_detection
from detloader.dataset import DetectionDataset
from detloader.loader import accelerator_available
from detloader.transforms import Compose, RandomHorizontalFlip, Resize


@pytest.fixture
def dataset(small_synth_root: Path) -> DetectionDataset:
    index = read_annotations(small_synth_root)
    return DetectionDataset(index, Resize(96, mode="longer"), seed=0)


def _tall_and_wide() -> list[tuple[np.ndarray, np.ndarray, np.ndarray]]:
    a = np.full((10, 20, 3), 50, dtype=np.uint8)
    b = np.full((16, 8, 3), 90, dtype=np.uint8)
    return [
        (a, np.array([[1, 1, 5, 5], [2, 2, 19, 9]], np.float32), np.array([3, 4])),
        (b, np.zeros((0, 4), np.float32), np.zeros(0, np.int64)),
    ]


def test_batch_from_dataset_samples(synth_root: Path) -> None:
    dataset = DetectionDataset(read_annotations(synth_root), Resize(96, mode="longer"), seed=0)
    empty = int(np.flatnonzero(dataset.index.objects_per_image == 0)[0])
    ids = [0, empty, 1, 2]
    samples = [dataset[i] for i in ids]
    batch = collate_detection(samples)
    assert isinstance(batch, Batch) and len(batch) == 4
    m = sum(len(s.boxes) for s in samples)
    assert batch.images.dtype == torch.uint8 and batch.images.shape[:2] == (4, 3)
    assert batch.boxes.shape == (m, 4) and batch.boxes.dtype == torch.float32
    assert batch.labels.shape == (m,) and batch.labels.dtype == torch.int64
    assert batch.landmarks.shape == (m, 5, 2) and batch.visibility.shape == (m, 5)
    assert batch.visibility.dtype == torch.uint8
    assert batch.batch_index.tolist() == [b for b, s in enumerate(samples) for _ in s.boxes]
    assert batch.object_counts == tuple(len(s.boxes) for s in samples)
    assert batch.image_ids.tolist() == ids
    assert batch.image_labels.tolist() == [s.image_label for s in samples]
    assert batch.object_ids.tolist() == [int(o) for s in samples for o in s.object_ids]
    for b, s in enumerate(samples):
        w, h = s.size
        assert batch.image_sizes[b].tolist() == [w, h]
        assert torch.equal(batch.images[b, :, :h, :w], s.image)
        assert batch.orig_sizes[b].tolist() == list(s.orig_size)
        assert batch.scale[b].tolist() == pytest.approx(s.scale)
    assert batch.images.is_contiguous()


def test_padding_largest_fixed_and_divisible() -> None:
    items = _tall_and_wide()
    batch = collate_detection(items)
    assert batch.images.shape == (2, 3, 16, 20)
    assert (batch.images[0, :, :10, :20] == 50).all() and (batch.images[0, :, 10:] == 0).all()
    assert (batch.images[1, :, :, :8] == 90).all() and (batch.images[1, :, :, 8:] == 0).all()
    assert batch.valid_mask().sum(dim=(1, 2)).tolist() == [200, 128]
    padded = collate_detection(items, pad_to=(24, 24), fill=7)
    assert padded.images.shape == (2, 3, 24, 24) and (padded.images[0, :, 10:] == 7).all()
    assert collate_detection(items, size_divisor=32).images.shape == (2, 3, 32, 32)
    with pytest.raises(ValueError, match=r"samples\[0\]: image 20x10 is larger than pad_to=\(12, 12\)"):
        collate_detection(items, pad_to=(12, 12))
    as_fn = functools.partial(collate_detection, pad_to=(24, 24))
    assert pickle.loads(pickle.dumps(as_fn))(items).images.shape == (2, 3, 24, 24)


def test_user_tuples_in_every_form() -> None:
    hwc = np.zeros((4, 6, 3), np.uint8)
    chw = torch.zeros(3, 4, 6, dtype=torch.uint8)
    gray = np.zeros((4, 6), np.uint8)
    box = np.array([[0, 0, 2, 2]], np.float32)
    lm2 = np.array([[[1, 1], [np.nan, np.nan]]], np.float32)
    lm3 = np.array([[[1, 1, 1], [3, 3, 2]]], np.float32)
    batch = collate_detection(
        [
            (hwc, box, [1], lm2),
            (chw, torch.tensor(box), torch.tensor([2]), lm3),
            (gray, box, [0], lm3[..., :2], np.array([[0, 2]])),
            (hwc, {"boxes": box, "labels": [5], "keypoints": lm3, "image_label": 2}),
            (hwc, [], [], []),  # an image without objects
        ]
    )
    assert batch.images.shape == (5, 3, 4, 6)
    assert batch.labels.tolist() == [1, 2, 0, 5]
    assert batch.visibility.tolist() == [[2, 0], [1, 2], [0, 2], [1, 2]]
    assert batch.landmarks[0].tolist() == [[1, 1], [0, 0]]  # NaN -> absent, zeroed
    assert batch.landmarks[2, 0].tolist() == [0, 0]
    assert batch.image_labels.tolist() == [MISSING, MISSING, MISSING, 2, MISSING]
    assert batch.image_ids.tolist() == [MISSING] * 5
    assert (batch.object_ids == MISSING).all()
    assert batch.scale.tolist() == [[1, 1]] * 5 and batch.orig_sizes[0].tolist() == [6, 4]
    plain = collate_detection([(hwc, box, [1]), (chw, box, [0])])
    assert plain.landmarks.shape == (2, 0, 2) and "keypoints" not in plain.targets()[0]


def test_bad_samples_are_named() -> None:
    box = np.zeros((1, 4), np.float32)
    with pytest.raises(ValueError, match=r"samples\[1\]: image dtype torch.float32.*uint8"):
        collate_detection([(np.zeros((2, 2, 3), np.uint8), box, [0]), (torch.zeros(3, 2, 2), box, [0])])
    with pytest.raises(ValueError, match=r"samples\[0\]: 2 labels for 1 boxes"):
        collate_detection([(np.zeros((2, 2, 3), np.uint8), box, [0, 1])])
    with pytest.raises(ValueError, match=r"samples\[0\]: boxes shape \(1, 3\)"):
        collate_detection([(np.zeros((2, 2, 3), np.uint8), np.zeros((1, 3)), [0])])
    with pytest.raises(ValueError, match="different landmark counts K=\\[1, 2\\]"):
        collate_detection(
            [
                (np.zeros((2, 2, 3), np.uint8), box, [0], np.zeros((1, 1, 2))),
                (np.zeros((2, 2, 3), np.uint8), box, [0], np.zeros((1, 2, 2))),
            ]
        )
    with pytest.raises(TypeError, match=r"samples\[0\]: str is not a Sample"):
        collate_detection(["image.jpg"])
    with pytest.raises(ValueError, match="samples is empty"):
        collate_detection([])
    with pytest.raises(ValueError, match=r"samples\[0\]: numpy image shape \(2, 2, 4\)"):
        collate_detection([(np.zeros((2, 2, 4), np.uint8), box, [0])])


def test_targets_for_torchvision(dataset: DetectionDataset) -> None:
    batch = collate_detection([dataset[i] for i in range(4)])
    targets = batch.targets()
    assert len(targets) == 4
    for b, t in enumerate(targets):
        n = batch.object_counts[b]
        assert t["boxes"].shape == (n, 4) and t["labels"].shape == (n,)
        assert t["keypoints"].shape == (n, 5, 3)
        rows = batch.batch_index == b
        assert torch.equal(t["boxes"], batch.boxes[rows])
        assert torch.equal(t["keypoints"][..., 2], batch.visibility[rows].float())
        assert int(t["image_id"]) == b
    shifted = batch.targets(label_offset=1)
    assert torch.equal(torch.cat([t["labels"] for t in shifted]), batch.labels + 1)


def test_target_formats_detr_and_yolo(dataset: DetectionDataset) -> None:
    batch = collate_detection([dataset[i] for i in range(4)])
    h, w = batch.images.shape[-2:]
    scale = torch.tensor([w, h, w, h], dtype=torch.float32)
    detr = batch.targets(format="detr", label_offset=1)
    assert len(detr) == 4 and set(detr[0]) == {"class_labels", "boxes"}
    boxes = torch.cat([t["boxes"] for t in detr])
    assert boxes.dtype == torch.float32 and boxes.shape == (batch.num_objects, 4)
    assert bool(((boxes >= 0) & (boxes <= 1)).all())
    assert torch.equal(torch.cat([t["class_labels"] for t in detr]), batch.labels + 1)
    cx, cy, bw, bh = (boxes * scale).unbind(1)  # round trip: cx, cy, w, h -> xyxy pixels
    torch.testing.assert_close(torch.stack([cx - bw / 2, cy - bh / 2, cx + bw / 2, cy + bh / 2], 1), batch.boxes)
    yolo = batch.targets(format="yolo")
    rows, points = yolo["targets"], yolo["keypoints"]
    assert rows.dtype == points.dtype == torch.float32
    assert rows.shape == (batch.num_objects, 6) and points.shape == (batch.num_objects, 5, 3)
    assert torch.equal(rows[:, 0].long(), batch.batch_index) and torch.equal(rows[:, 1].long(), batch.labels)
    torch.testing.assert_close(rows[:, 2:], boxes)
    shown = batch.visibility > 0
    assert bool(((points[..., :2][shown] >= 0) & (points[..., :2][shown] <= 1)).all())
    torch.testing.assert_close(points[..., :2] * scale[:2], batch.landmarks)
    assert torch.equal(points[..., 2], batch.visibility.float())
    # the docstring's numbers
    one = collate_detection([(np.zeros((80, 100, 3), np.uint8), np.zeros((0, 4)), []),
                             (np.zeros((80, 100, 3), np.uint8), [[10, 20, 50, 60]], [2], [[[30, 40]]])])
    close = functools.partial(torch.testing.assert_close, check_dtype=False)
    close(one.targets(format="yolo")["targets"], torch.tensor([[1, 2, 0.3, 0.5, 0.4, 0.5]]))
    close(one.targets(format="yolo")["keypoints"], torch.tensor([[[0.3, 0.5, 2.0]]]))
    close(one.targets(format="detr")[1]["boxes"], torch.tensor([[0.3, 0.5, 0.4, 0.5]]))
    with pytest.raises(ValueError, match="format='coco' is not one of"):
        batch.targets(format="coco")


def test_image_list_is_what_torchvision_takes(dataset: DetectionDataset) -> None:
    batch = collate_detection([dataset[i] for i in range(3)])
    images = batch.image_list()
    assert [tuple(x.shape) for x in images] == [(3, int(h), int(w)) for w, h in batch.image_sizes.tolist()]
    for b, x in enumerate(images):
        assert x.dtype == torch.float32 and 0.0 <= float(x.min()) and float(x.max()) <= 1.0
        torch.testing.assert_close(x * 255, batch.images[b, :, : x.shape[1], : x.shape[2]].float())


def test_normalize_to_and_mapping_back(dataset: DetectionDataset) -> None:
    batch = collate_detection([dataset[i] for i in range(3)])
    x = batch.normalize(mean=(0.5, 0.5, 0.5), std=(0.25, 0.25, 0.25))
    assert x.dtype == torch.float32 and x.shape == batch.images.shape
    expect = (batch.images.float() / 255 - 0.5) / 0.25
    torch.testing.assert_close(x, expect)
    with pytest.raises(ValueError, match="std=\\(0.1, 0.0, 0.1\\)"):
        batch.normalize(std=(0.1, 0.0, 0.1))
    moved = batch.to("cpu")
    assert torch.equal(moved.boxes, batch.boxes) and moved.object_counts == batch.object_counts
    back = batch.boxes_to_original(batch.boxes, batch.batch_index)
    orig = dataset.index.boxes[batch.object_ids.numpy()]
    torch.testing.assert_close(back, torch.from_numpy(orig), atol=1e-3, rtol=0)
    pts = batch.landmarks_to_original(batch.landmarks, batch.batch_index)
    shown = batch.visibility > 0
    ref = torch.from_numpy(dataset.index.landmarks[batch.object_ids.numpy()])
    torch.testing.assert_close(pts[shown], ref[shown], atol=1e-3, rtol=0)


def test_flipped_boxes_map_back(small_synth_root: Path) -> None:
    index = read_annotations(small_synth_root)
    ds = DetectionDataset(index, Compose([RandomHorizontalFlip(p=1.0), Resize(64, mode="shorter")]), seed=0)
    batch = collate_detection([ds[i] for i in range(4)])
    back = batch.boxes_to_original(batch.boxes, batch.batch_index)
    torch.testing.assert_close(back, torch.from_numpy(index.boxes[batch.object_ids.numpy()]), atol=1e-3, rtol=0)


def test_batch_pickles_and_empty_batches_work() -> None:
    img = np.zeros((4, 4, 3), np.uint8)
    batch = collate_detection([(img, np.zeros((0, 4)), []), (img, [], [])])
    assert batch.num_objects == 0 and batch.boxes.shape == (0, 4)
    assert [t["boxes"].shape for t in batch.targets()] == [(0, 4), (0, 4)]
    copy = pickle.loads(pickle.dumps(batch))
    assert torch.equal(copy.images, batch.images) and copy.object_counts == (0, 0)


def test_batch_leaves_a_worker_as_one_shared_file(dataset: DetectionDataset, monkeypatch: pytest.MonkeyPatch) -> None:
    """Only the images cross in shared memory (one descriptor round trip per batch); the
    targets travel by value and come back as equal tensors of the same dtypes."""
    from multiprocessing.reduction import ForkingPickler

    import torch.multiprocessing.reductions as reductions

    batch = collate_detection([dataset[i] for i in range(4)])
    shared: list[object] = []
    original = reductions.reduce_storage
    monkeypatch.setattr(reductions, "reduce_storage", lambda s: shared.append(s) or original(s))
    ForkingPickler.register(torch.UntypedStorage, reductions.reduce_storage)
    try:
        copy = ForkingPickler.loads(ForkingPickler.dumps(batch))
    finally:
        ForkingPickler.register(torch.UntypedStorage, original)
    assert len(shared) == 1
    for name in ("images", "boxes", "labels", "landmarks", "visibility", "scale", "image_ids", "object_ids"):
        a, b = getattr(batch, name), getattr(copy, name)
        assert a.dtype == b.dtype and torch.equal(a, b), name


def test_worker_buffers_are_reused_once_the_main_process_lets_go() -> None:
    """A buffer is handed out again only after its flag is cleared; a larger batch gets a
    larger buffer; with every buffer out, new memory (no flag)."""
    from detloader.collate import _WorkerBuffers

    pool = _WorkerBuffers()
    first, i = pool.take((2, 3, 4, 4))
    second, j = pool.take((2, 3, 4, 4))
    assert (i, j) == (0, 1) and first.data_ptr() != second.data_ptr()
    pool.held[i] = 0  # what the main process does when the batch is dropped
    again, k = pool.take((1, 3, 4, 4))
    assert k == i and again.data_ptr() == first.data_ptr() and again.shape == (1, 3, 4, 4)
    pool.held[k] = 0
    larger, k = pool.take((4, 3, 4, 4))
    assert k == i and larger.numel() == 192 and pool.held.tolist()[:2] == [1, 1]
    for _ in range(pool.SLOTS - 2):
        pool.take((1, 3, 1, 1))
    extra, none = pool.take((1, 3, 1, 1))
    assert none is None and extra.is_shared() and all(pool.held.tolist())


def _with_slot(samples: list[object]) -> tuple[Batch, int | None]:
    """The batch and the worker buffer its images lie in (None: new memory)."""
    batch = collate_detection(samples)
    buffer = getattr(batch, "_buffer", None)
    return batch, None if buffer is None else buffer[1]


def test_worker_batches_stay_intact_while_held_and_reuse_memory_once_dropped(dataset: DetectionDataset) -> None:
    """Batches from worker processes equal the in-process ones, whether the loop keeps them
    all (each worker runs out of buffers and takes new memory) or drops each (the workers
    take their buffers again)."""
    from torch.utils.data import DataLoader

    from detloader.collate import _WorkerBuffers

    slots = _WorkerBuffers.SLOTS
    expected = [b.images.clone() for b in DataLoader(dataset, batch_size=1, collate_fn=collate_detection)]
    loader = DataLoader(dataset, batch_size=1, num_workers=2, collate_fn=_with_slot)
    kept = list(loader)
    assert len(kept) == len(expected) > 2 * slots  # more batches than the workers' buffers
    assert all(torch.equal(b.images, e) for (b, _), e in zip(kept, expected))
    assert sum(slot is None for _, slot in kept) == len(kept) - 2 * slots
    del kept
    taken = []
    for (batch, slot), e in zip(loader, expected):
        assert torch.equal(batch.images, e)
        taken.append(slot)
        del batch
    assert None not in taken and len(set(taken)) <= slots


def test_a_reused_buffer_crosses_to_the_main_process_once(dataset: DetectionDataset, monkeypatch) -> None:
    """Each worker's flags, and each of its buffers, are sent with the first batch in them; later
    batches in the same buffer name it. The batches equal the in-process ones, also those the loop
    keeps while others are made; when the loader's workers end, the main process lets go of
    their buffers."""
    from torch.utils.data import DataLoader

    from detloader import make_loader
    from detloader.loader import collate

    received: list[tuple[int, tuple[int, int], bool, bool]] = []
    real = collate._received_images

    def spy(name, i, generation, shape, buffer, flags):  # type: ignore[no-untyped-def]
        received.append((name[0], (i, generation), buffer is not None, flags is not None))
        return real(name, i, generation, shape, buffer, flags)

    monkeypatch.setattr(collate, "_received_images", spy)
    expected = [b.images.clone() for b in DataLoader(dataset, batch_size=1, collate_fn=collate_detection)]
    order = [k % len(dataset) for k in range(3 * len(dataset))]
    loader = make_loader(dataset, batch_sampler=[[i] for i in order], num_workers=2)
    kept = []
    for k, (batch, e) in enumerate(zip(loader, [expected[i] for i in order], strict=True)):
        assert torch.equal(batch.images, e)
        if k < 3:
            kept.append((batch, e))  # held while the workers make later batches
    assert all(torch.equal(b.images, e) for b, e in kept)
    workers = {pid for pid, *_ in received}
    assert len(workers) == 2 and len(received) > 4 * collate._WorkerBuffers.SLOTS
    for pid in workers:
        sent = [(slot, buffer, flags) for p, slot, buffer, flags in received if p == pid]
        assert sent[0][1:] == (True, True)  # the first batch brings the buffer and the flags
        # the flags until the main process holds them (prefetch_factor=2: 2 batches on their way);
        # a buffer once: it is taken again only after the main process let go of it, having mapped it
        assert sum(flags for *_, flags in sent) <= 2
        once = [slot for slot, buffer, _ in sent if buffer]
        assert len(once) == len(set(once)) < len(sent)
    assert not {m.pid for m in collate._mapped.values()} & workers  # the iterator ended its workers


def test_images_sent_on_from_the_main_process_are_copied_out_of_the_worker_buffer() -> None:
    """A batch's images from a reused buffer are not shared memory themselves: pickled for
    another process, they move to shared memory of their own, so the worker reusing its
    buffer cannot change them; the buffer is released once they are freed."""
    from multiprocessing.reduction import ForkingPickler

    from detloader.loader import collate

    pool = collate._WorkerBuffers()
    images, i = pool.take((2, 3, 4, 4))
    images.fill_(9)
    try:
        got = collate._received_images(*pool.sent(i, (2, 3, 4, 4)))
        assert pool.flags[-1] == 1 and pool.flags[pool.SLOTS + i] == pool.generations[i]  # mapped: not sent again
        assert pool.sent(i, (2, 3, 4, 4))[4:] == (None, None)
        ForkingPickler.dumps(got)
        images.fill_(1)  # the worker writing its buffer again
        assert got.is_shared() and int(got.min()) == 9
        assert pool.held[i] == 1
        del got
        assert pool.held[i] == 0
    finally:
        collate.forget_buffers([pool.name[0]])
    assert pool.flags[pool.SLOTS :].tolist() == [0] * (pool.SLOTS + 1)  # a worker still alive would send again


def test_buffers_of_a_worker_that_died_are_let_go_when_the_next_worker_is_met() -> None:
    """Where no iterator ends the workers (a plain DataLoader), a dead worker's buffers are let
    go when a new worker's first batch arrives; a live worker's stay."""
    import subprocess
    import sys

    from detloader.loader import collate

    ended = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    dead, alive, new = collate._WorkerBuffers(), collate._WorkerBuffers(), collate._WorkerBuffers()
    dead.name = (int(ended.stdout), "dead")
    try:
        for pool in (alive, dead):
            images, i = pool.take((1, 3, 2, 2))
            del images
            collate._received_images(*pool.sent(i, (1, 3, 2, 2)))  # dropped at once: released
        assert {"dead", alive.name[1]} <= set(collate._mapped)
        _, i = new.take((1, 3, 2, 2))
        collate._received_images(*new.sent(i, (1, 3, 2, 2)))
        assert "dead" not in collate._mapped and {alive.name[1], new.name[1]} <= set(collate._mapped)
        assert dead.held.tolist() == alive.held.tolist() == new.held.tolist() == [0] * dead.SLOTS
    finally:
        collate.forget_buffers([dead.name[0], alive.name[0]])


@pytest.mark.skipif(not accelerator_available(), reason="pinning needs an accelerator")
def test_pin_memory_and_non_blocking_copy(dataset: DetectionDataset) -> None:
    batch = collate_detection([dataset[i] for i in range(2)]).pin_memory()
    assert batch.images.is_pinned() and batch.boxes.is_pinned()
    device = torch.accelerator.current_accelerator()
    on = batch.to(device, non_blocking=True)
    x = on.normalize()
    assert x.device.type == device.type and torch.equal(on.boxes.cpu(), batch.boxes)


# -- images put into the batch as they are made (a loader worker's path) -----------------------
def _take(shape: tuple[int, ...]) -> tuple[torch.Tensor, None]:
    return torch.full(shape, 7, dtype=torch.uint8), None  # not zeros: a slot left unwritten shows


@pytest.mark.parametrize("threads", [0, 2])
@pytest.mark.parametrize(
    "transform",
    [Resize((40, 32)), Compose([Resize((40, 32)), RandomHorizontalFlip(1.0)]), Resize((200, 150), mode="letterbox"),
     Resize((10, 8))],
    ids=["resize", "resize-then-flip", "letterbox", "shrink-4x"],
)
def test_a_batch_made_in_place_equals_the_batch_collated_from_samples(small_synth_root, transform, threads):
    """DetectionDataset.batch_buffer (what a make_loader worker sets): each image is resized
    into (or copied to) its slot of one tensor, collate_detection takes that tensor without a
    copy, and the batch equals the one collated from the samples' own images."""
    index = read_annotations(small_synth_root)
    plain = DetectionDataset(index, transform, seed=0, decode_threads=threads)
    placed = DetectionDataset(index, transform, seed=0, decode_threads=threads)
    placed.batch_buffer = _take
    ids = [3, 0, 7, 7, 11, 5]
    samples = placed.__getitems__(ids)
    assert samples.images is not None and samples.images.shape[0] == len(ids)
    batch, expected = collate_detection(samples), collate_detection(plain.__getitems__(ids))
    assert batch.images is samples.images  # no copy
    for name in ("images", "boxes", "labels", "landmarks", "image_sizes", "scale", "offset"):
        assert torch.equal(getattr(batch, name), getattr(expected, name)), name
    for j, sample in enumerate(samples):
        assert sample.image.data_ptr() == samples.images[j].data_ptr()


def test_images_of_different_sizes_keep_their_memory_and_the_batch_is_padded(small_synth_root):
    """Without a fixed output size the first image's size does not fit the others: they keep
    their own memory, ``images`` is None, and the collate pads as usual (same batch)."""
    index = read_annotations(small_synth_root)
    sizes = {(int(index.width[i]), int(index.height[i])) for i in range(len(index))}
    placed = DetectionDataset(index, None, seed=0)
    placed.batch_buffer = _take
    ids = list(range(len(index)))
    samples = placed.__getitems__(ids)
    if len(sizes) > 1:
        assert samples.images is None
    expected = collate_detection(DetectionDataset(index, None, seed=0).__getitems__(ids))
    assert torch.equal(collate_detection(samples).images, expected.images)


def test_resize_into_writes_the_next_resize_of_its_size_once():
    """resize_into: the first resize_image to the slot's size writes there (the pixels of a
    plain resize), the next one writes fresh memory; a resize to another size leaves it."""
    from detloader.transforms.functional import resize_image, resize_into

    rng = np.random.default_rng(0)
    image = rng.integers(0, 256, (37, 53, 3), dtype=np.uint8)
    cases = [((20, 16), "bilinear"), ((10, 8), "bilinear"), ((20, 16), "nearest"), ((90, 70), "bilinear")]
    for size, interpolation in cases:  # shrinking, shrinking 5x (antialiased), nearest, growing
        expected = resize_image(image, *size, interpolation)
        slot = torch.zeros((3, size[1], size[0]), dtype=torch.uint8)
        with resize_into(slot):
            other = resize_image(image, size[0] + 1, size[1], interpolation)  # another size: not there
            first = resize_image(image, *size, interpolation)
            second = resize_image(image, *size, interpolation)
        assert torch.equal(slot, torch.from_numpy(np.ascontiguousarray(expected.transpose(2, 0, 1))))
        assert np.array_equal(first, expected) and np.array_equal(second, expected) and other.shape[1] == size[0] + 1
        assert torch.from_numpy(first.transpose(2, 0, 1)).data_ptr() == slot.data_ptr()
        assert torch.from_numpy(second.transpose(2, 0, 1)).data_ptr() != slot.data_ptr()
