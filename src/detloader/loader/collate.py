"""Batching for detection: images of different sizes and a varying number of objects.

``collate_detection(samples) -> Batch`` pads the images top-left into one uint8 tensor and
concatenates the objects of all images into flat tensors with a ``batch_index`` column, so no
Python list of per-image dicts crosses the worker -> main process boundary. Besides
:class:`~detloader.dataset.Sample` it takes a user dataset's ``(image, boxes, labels[,
landmarks[, visibility]])`` or ``(image, target_dict)``. See docs/loader.md, "collate_detection
and Batch".
"""

from __future__ import annotations

import math
import os
import secrets
import threading
import weakref
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, fields, replace
from multiprocessing.reduction import ForkingPickler
from typing import Any

import numpy as np
import torch

from detloader.dataset.sample import as_sample
from detloader.errors import DetloaderValueError, LoaderWorkerError

#: ImageNet statistics in 0..1 units, the usual default for pretrained backbones.
IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
#: Layouts of :meth:`Batch.targets`.
TARGET_FORMATS: tuple[str, ...] = ("torchvision", "detr", "yolo")


@dataclass(frozen=True, eq=False)
class Batch:
    """A batch of ``B`` images with ``M`` objects in all.

    Attributes:
        images: uint8 ``[B, 3, H, W]``; image ``b`` occupies ``[:, :h_b, :w_b]`` (top-left),
            the rest is padding.
        image_sizes: int64 ``[B, 2]`` (w_b, h_b) of each image inside the padding.
        orig_sizes: int64 ``[B, 2]`` (width, height) of each annotation frame.
        scale, offset: float32 ``[B, 2]``: ``x_batch = x_orig * scale + offset`` per axis
            (see :meth:`boxes_to_original`).
        image_ids: int64 ``[B]`` rows in the index (``MISSING`` when unknown).
        image_labels: int64 ``[B]`` image-level class ids (``MISSING`` allowed).
        boxes: float32 ``[M, 4]`` xyxy pixels of the batch images.
        batch_index: int64 ``[M]`` image of each object, non-decreasing.
        labels: int64 ``[M]``.
        landmarks: float32 ``[M, K, 2]``; visibility: uint8 ``[M, K]`` (0 absent, 1 hidden,
            2 visible).
        object_ids: int64 ``[M]`` rows in the index (``MISSING`` when unknown).
        object_counts: objects per image, a tuple of ``B`` ints (kept on the host so that
            :meth:`targets` needs no device synchronisation).
    """

    images: torch.Tensor
    image_sizes: torch.Tensor
    orig_sizes: torch.Tensor
    scale: torch.Tensor
    offset: torch.Tensor
    image_ids: torch.Tensor
    image_labels: torch.Tensor
    boxes: torch.Tensor
    batch_index: torch.Tensor
    labels: torch.Tensor
    landmarks: torch.Tensor
    visibility: torch.Tensor
    object_ids: torch.Tensor
    object_counts: tuple[int, ...]

    def __len__(self) -> int:
        return int(self.images.shape[0])

    @property
    def num_objects(self) -> int:
        return int(self.boxes.shape[0])

    @property
    def device(self) -> torch.device:
        return self.images.device

    def _mapped(self, fn: Callable[[torch.Tensor], Any]) -> dict[str, Any]:
        """The fields by name, ``fn`` applied to the tensors."""
        values = {f.name: getattr(self, f.name) for f in fields(self)}
        return {name: fn(v) if isinstance(v, torch.Tensor) else v for name, v in values.items()}

    def _apply(self, fn: Callable[[torch.Tensor], torch.Tensor]) -> Batch:
        return Batch(**self._mapped(fn))

    def __reduce__(self) -> tuple[Any, ...]:
        """Pickles the small CPU tensors (all but the images, in practice) by value: a batch
        leaves a DataLoader worker with one shared-memory file at most, not thirteen, and each
        file costs a descriptor round trip with the worker (docs/loader.md, "collate_detection
        and Batch"). Through a multiprocessing queue, :func:`_reduce_for_queue` instead."""
        return _unpickle_batch, (self._mapped(_by_value),)

    def pin_memory(self) -> Batch:
        """A copy in page-locked memory (DataLoader's ``pin_memory=True`` calls this)."""
        return self._apply(lambda t: t.pin_memory())

    def to(self, device: torch.device | str, non_blocking: bool = True) -> Batch:
        """All tensors on ``device``; asynchronous from pinned memory when ``non_blocking``."""
        return self._apply(lambda t: t.to(device, non_blocking=non_blocking))

    def normalize(
        self,
        mean: Sequence[float] = IMAGENET_MEAN,
        std: Sequence[float] = IMAGENET_STD,
        dtype: torch.dtype = torch.float32,
    ) -> torch.Tensor:
        """``(images / 255 - mean) / std`` as ``dtype`` ``[B, 3, H, W]`` on the images' device
        (call after :meth:`to`: uint8 travels, floats are made where the model runs). ``mean``
        and ``std`` are per channel in 0..1 units."""
        if len(mean) != 3 or len(std) != 3:
            raise DetloaderValueError(f"mean={tuple(mean)}, std={tuple(std)} need 3 values each")
        if any(s <= 0 for s in std):
            raise DetloaderValueError(f"std={tuple(std)} must be positive")
        dev = self.images.device
        m = torch.tensor(mean, dtype=dtype, device=dev).view(1, 3, 1, 1) * 255
        s = torch.tensor(std, dtype=dtype, device=dev).view(1, 3, 1, 1) * 255
        return self.images.to(dtype).sub_(m).div_(s)

    def valid_mask(self) -> torch.Tensor:
        """bool ``[B, H, W]``: True on image pixels, False on padding."""
        b, _, h, w = self.images.shape
        dev = self.images.device
        sizes = self.image_sizes
        cols = torch.arange(w, device=dev).view(1, 1, w) < sizes[:, 0].view(b, 1, 1)
        rows = torch.arange(h, device=dev).view(1, h, 1) < sizes[:, 1].view(b, 1, 1)
        return cols & rows

    def image_list(self) -> list[torch.Tensor]:
        """The images as torchvision's detectors take them: a list of float32 ``[3, h_b, w_b]``
        in [0, 1], each cut to its own size (no padding). Not :meth:`normalize`: those models
        normalise (and resize) inside, so normalised input would be normalised twice."""
        return [self.images[b, :, :h, :w].float().div_(255) for b, (w, h) in enumerate(self.image_sizes.tolist())]

    def targets(self, label_offset: int = 0, format: str = "torchvision") -> Any:
        """The objects in the layout a model family takes; ``label_offset`` is added to every
        class id (1 for torchvision's detectors, which reserve 0 for the background). ``format``:

        * ``"torchvision"``: one dict per image: ``boxes`` float32 ``[N, 4]`` xyxy pixels,
          ``labels`` int64 ``[N]``, ``keypoints`` float32 ``[N, K, 3]`` when ``K > 0``,
          ``image_label``, ``image_id`` (boxes and labels are views into the batch).
        * ``"detr"``: one dict per image: ``class_labels`` int64 ``[N]``, ``boxes`` float32
          ``[N, 4]`` (cx, cy, w, h) divided by the padded ``W`` and ``H`` of :attr:`images`.
        * ``"yolo"``: ``{"targets": float32 [M, 6], "keypoints": float32 [M, K, 3]}``: rows
          (batch_idx, cls, cx, cy, w, h) divided as for ``"detr"``, landmarks (x / W, y / H, v).

        Worked numbers: docs/loader.md, "collate_detection and Batch"."""
        if format not in TARGET_FORMATS:
            raise DetloaderValueError(f"format={format!r} is not one of {TARGET_FORMATS}")
        counts, b = list(self.object_counts), self.boxes
        labels = self.labels + label_offset if label_offset else self.labels
        vis = self.visibility.unsqueeze(-1).to(b.dtype)
        if format == "torchvision":
            out = []
            points = torch.split(torch.cat([self.landmarks, vis], dim=-1), counts)
            for i, (x, c, p) in enumerate(zip(torch.split(b, counts), torch.split(labels, counts), points)):
                out.append(
                    {"boxes": x, "labels": c, "image_label": self.image_labels[i], "image_id": self.image_ids[i]}
                )
                if self.landmarks.shape[1]:
                    out[-1]["keypoints"] = p
            return out
        h, w = self.images.shape[-2:]
        size = torch.tensor([w, h, w, h], dtype=b.dtype, device=b.device)
        box = torch.cat([(b[:, :2] + b[:, 2:]) / 2, b[:, 2:] - b[:, :2]], dim=1) / size
        if format == "detr":
            return [
                {"class_labels": c, "boxes": x} for c, x in zip(torch.split(labels, counts), torch.split(box, counts))
            ]
        rows = torch.cat([self.batch_index.unsqueeze(1).to(b.dtype), labels.unsqueeze(1).to(b.dtype), box], dim=1)
        return {"targets": rows, "keypoints": torch.cat([self.landmarks / size[:2], vis], dim=-1)}

    def boxes_to_original(self, boxes: torch.Tensor, image_index: torch.Tensor) -> torch.Tensor:
        """Boxes ``[P, 4]`` of batch images ``image_index`` ``[P]`` (e.g. predictions) in the
        coordinates of their annotation frames (corners reordered after flips)."""
        s = self.scale[image_index].to(boxes.dtype)
        o = self.offset[image_index].to(boxes.dtype)
        xs = (boxes[:, 0::2] - o[:, :1]) / s[:, :1]
        ys = (boxes[:, 1::2] - o[:, 1:]) / s[:, 1:]
        return torch.stack(
            [xs.min(dim=1).values, ys.min(dim=1).values, xs.max(dim=1).values, ys.max(dim=1).values],
            dim=1,
        )

    def landmarks_to_original(self, landmarks: torch.Tensor, image_index: torch.Tensor) -> torch.Tensor:
        """Points ``[P, K, 2]`` of batch images ``image_index`` ``[P]`` in annotation
        coordinates."""
        s = self.scale[image_index].to(landmarks.dtype).unsqueeze(1)
        o = self.offset[image_index].to(landmarks.dtype).unsqueeze(1)
        return (landmarks - o) / s


#: Bytes up to which a tensor of a :class:`Batch` pickles by value.
_INLINE = 1 << 16


def _by_value(t: torch.Tensor) -> torch.Tensor | np.ndarray:
    return t.numpy() if t.device.type == "cpu" and t.nbytes <= _INLINE else t


def _unpickle_batch(values: dict[str, Any], sent: tuple[Any, ...] | None = None) -> Batch:
    if sent is not None:  # the images are in a worker's reused buffer (_reduce_for_queue)
        values["images"] = _received_images(*sent)
    return Batch(**{k: torch.from_numpy(v) if isinstance(v, np.ndarray) else v for k, v in values.items()})


def _reduce_for_queue(batch: Batch) -> tuple[Any, ...]:
    """How a :class:`Batch` crosses a multiprocessing queue (a DataLoader worker's results):
    as :meth:`Batch.__reduce__`, except that images made in one of the worker's reused buffers
    (:class:`_WorkerBuffers`) are sent by name, the buffer itself only until the main process
    has mapped it."""
    buffer = getattr(batch, "_buffer", None)
    values = batch._mapped(_by_value)
    if buffer is None or _worker_buffers is None or buffer[0] is not _worker_buffers.held:
        return _unpickle_batch, (values,)
    values["images"] = None
    return _unpickle_batch, (values, _worker_buffers.sent(buffer[1], tuple(batch.images.shape)))


ForkingPickler.register(Batch, _reduce_for_queue)


def _new_shared(numel: int) -> torch.Tensor:
    base = torch.empty(0, dtype=torch.uint8)
    return base.new(base._typed_storage()._new_shared(numel, device=base.device))


class _WorkerBuffers:
    """The shared-memory image buffers of one DataLoader worker, up to ``SLOTS`` (what a loop
    with ``prefetch_factor=2`` has out at once), each reused once the main process has dropped
    every tensor over the batch it went out in: a new shared-memory file costs the kernel a
    zeroed page per 4 KiB, several times the collate's copy. With every buffer out, new memory.

    ``flags`` (int32, shared memory) is what the worker and the main process tell each other:
    ``held[i] = flags[i]`` is 1 while buffer ``i`` is out (the worker sets it, the main process
    clears it when the batch's memory is freed there); ``flags[SLOTS + i]`` is the generation
    of buffer ``i`` (a new one each time the buffer grows) that the main process has mapped;
    ``flags[-1]`` is 1 once the main process holds ``flags``. A batch sends its buffer, or
    ``flags``, only until the main process says it has it (:meth:`sent`): each such file costs a
    descriptor round trip with the worker, and sending them once took most of the main
    process's time per batch away."""

    SLOTS = 4

    def __init__(self) -> None:
        self.flags = torch.zeros(2 * self.SLOTS + 1, dtype=torch.int32).share_memory_()
        self.held = self.flags[: self.SLOTS]
        self._flags = self.flags.numpy()
        self.buffers = [torch.empty(0, dtype=torch.uint8)] * self.SLOTS
        self.generations = [0] * self.SLOTS
        self.name = (os.getpid(), secrets.token_hex(8))  # the pid: for the main process to forget a dead worker

    def take(self, shape: tuple[int, ...]) -> tuple[torch.Tensor, int | None]:
        numel = int(np.prod(shape))
        held = self._flags
        free = [i for i in range(self.SLOTS) if not held[i]]
        if not free:
            return _new_shared(numel).view(shape), None
        i = next((i for i in free if len(self.buffers[i]) >= numel), free[0])
        if len(self.buffers[i]) < numel:
            self.buffers[i] = _new_shared(numel)
            self.generations[i] += 1
        held[i] = 1
        return self.buffers[i][:numel].view(shape), i

    def sent(self, i: int, shape: tuple[int, ...]) -> tuple[Any, ...]:
        """What a batch whose images lie at the start of buffer ``i`` sends for them
        (:func:`_received_images`'s arguments)."""
        flags, generation = self._flags, self.generations[i]
        return (
            self.name, i, generation, shape,
            None if flags[self.SLOTS + i] == generation else self.buffers[i],
            None if flags[-1] else self.flags,
        )


_worker_buffers: _WorkerBuffers | None = None


class _Mapped:
    """A worker's reused buffers as the main process keeps them: ``buffers[i]`` is
    (generation, the buffer's memory); ``flags``: the worker's (:class:`_WorkerBuffers`)."""

    def __init__(self, pid: int, flags: torch.Tensor) -> None:
        self.pid, self.flags = pid, flags.numpy()
        self.slots = (len(self.flags) - 1) // 2
        self.buffers: dict[int, tuple[int, np.ndarray]] = {}


#: The main process's :class:`_Mapped` by worker name; a worker's entry goes when its
#: DataLoader iterator ends its workers (:func:`forget_buffers`) or, failing that, when a new
#: worker is met after it died.
_mapped: dict[str, _Mapped] = {}
_mapped_lock = threading.Lock()


def _received_images(
    name: tuple[int, str], i: int, generation: int, shape: tuple[int, ...],
    buffer: torch.Tensor | None, flags: torch.Tensor | None,
) -> torch.Tensor:
    """A batch's images from the start of worker ``name``'s buffer ``i`` (a tensor over that
    memory, mapped once per buffer): when the last tensor over it is freed, the worker may
    reuse the buffer. Sent on to another process, the tensor is copied into new shared memory
    (it is not shared memory itself)."""
    pid, key = name
    with _mapped_lock:
        mapped = _mapped.get(key)
        if mapped is None:
            if flags is None:
                raise _gone(pid, i, generation)
            _forget({m.pid for m in _mapped.values() if not _alive(m.pid)})
            mapped = _mapped[key] = _Mapped(pid, flags)
            mapped.flags[-1] = 1
        if buffer is not None:
            mapped.buffers[i] = generation, buffer.numpy()
            mapped.flags[mapped.slots + i] = generation
        known, memory = mapped.buffers.get(i, (None, None))
    if known != generation or memory is None:
        raise _gone(pid, i, generation)
    images = torch.from_numpy(memory[: math.prod(shape)]).view(shape)  # a storage of its own, over the buffer
    weakref.finalize(images.untyped_storage(), mapped.flags.__setitem__, i, 0)
    return images


def _gone(pid: int, i: int, generation: int) -> LoaderWorkerError:
    return LoaderWorkerError(
        f"DataLoader worker (pid {pid}): a batch's images lie in its buffer {i} (generation {generation}), which "
        "this process no longer holds: the worker ended, or its loader was shut down, while the batch was on its way",
        None, pid, None, None,
    )


def forget_buffers(pids: Iterable[int]) -> None:
    """The main process lets go of the reused buffers of the workers ``pids`` (ended), but
    for memory a batch still holds; a worker still alive sends its buffers again."""
    with _mapped_lock:
        _forget(set(pids))


def _forget(pids: set[int]) -> None:
    """:func:`forget_buffers`, with the lock held."""
    for key in [key for key, mapped in _mapped.items() if mapped.pid in pids]:
        mapped = _mapped.pop(key)
        mapped.flags[mapped.slots :] = 0


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        pass  # alive, another user's
    return True


def _image_buffer(shape: tuple[int, ...]) -> tuple[torch.Tensor, tuple[torch.Tensor, int] | None]:
    """An uninitialised uint8 tensor for a batch's images; inside a DataLoader worker, in
    shared memory so that sending it to the main process costs no copy, with the release
    flag of the reused buffer it lies in (None: not reused)."""
    global _worker_buffers
    if torch.utils.data.get_worker_info() is None:
        return torch.empty(shape, dtype=torch.uint8), None
    if _worker_buffers is None:
        _worker_buffers = _WorkerBuffers()
    images, i = _worker_buffers.take(shape)
    return images, None if i is None else (_worker_buffers.held, i)


def release_buffer(release: tuple[torch.Tensor, int] | None) -> None:
    """Let the worker reuse the buffer that ``release`` (from :func:`_image_buffer`) names."""
    if release is not None:
        held, i = release
        held[i] = 0


def collate_detection(
    samples: Sequence[Any],
    *,
    pad_to: tuple[int, int] | None = None,
    size_divisor: int = 1,
    fill: int = 0,
) -> Batch:
    """Stack ``samples`` into a :class:`Batch`.

    Args:
        pad_to: fixed (width, height) of the padded images; default: the largest width and
            height in the batch. A larger image is an error.
        size_divisor: round the padded size up to a multiple (e.g. 32 for FPN backbones).
        fill: value of padding pixels.

    Use ``functools.partial(collate_detection, pad_to=(640, 640))`` as a DataLoader's
    ``collate_fn`` (it pickles, so it works with worker processes). A
    :class:`~detloader.dataset.sample.SampleBatch` whose images already lie in a tensor of the
    batch's shape gives that tensor as the images, without a copy.
    """
    if len(samples) == 0:
        raise DetloaderValueError("collate_detection: samples is empty")
    if size_divisor < 1:
        raise DetloaderValueError(f"size_divisor={size_divisor} must be >= 1")
    if not 0 <= fill <= 255:
        raise DetloaderValueError(f"fill={fill} must be in 0..255")
    items = [as_sample(s, p) for p, s in enumerate(samples)]
    ks = {it.landmarks.shape[1] for it in items if len(it.boxes)}
    if len(ks) > 1:
        raise DetloaderValueError(f"collate_detection: samples have different landmark counts K={sorted(ks)}")
    k = ks.pop() if ks else max(it.landmarks.shape[1] for it in items)
    for j, it in enumerate(items):  # an image without objects may come with landmarks of any K
        if not len(it.boxes) and it.landmarks.shape[1] != k:
            items[j] = replace(
                it,
                landmarks=np.zeros((0, k, 2), dtype=np.float32),
                visibility=np.zeros((0, k), dtype=np.uint8),
            )
    sizes = np.array([(it.image.shape[2], it.image.shape[1]) for it in items], dtype=np.int64)
    if pad_to is not None:
        pw, ph = int(pad_to[0]), int(pad_to[1])
        too_big = np.flatnonzero((sizes[:, 0] > pw) | (sizes[:, 1] > ph))
        if len(too_big):
            j = int(too_big[0])
            raise DetloaderValueError(f"samples[{j}]: image {sizes[j, 0]}x{sizes[j, 1]} is larger than pad_to={pad_to}")
    else:
        pw, ph = int(sizes[:, 0].max()), int(sizes[:, 1].max())
    pw, ph = -(-pw // size_divisor) * size_divisor, -(-ph // size_divisor) * size_divisor  # rounded up
    b = len(items)
    placed, placed_release = getattr(samples, "images", None), getattr(samples, "release", None)
    if placed is not None and tuple(placed.shape) == (b, 3, ph, pw):  # a SampleBatch: the images are there
        images, buffer = placed, placed_release
    else:
        images, buffer = _image_buffer((b, 3, ph, pw))
        for j, it in enumerate(items):
            w, h = int(sizes[j, 0]), int(sizes[j, 1])
            images[j, :, :h, :w].copy_(it.image)
            if w < pw:
                images[j, :, :h, w:].fill_(fill)
            if h < ph:
                images[j, :, h:, :].fill_(fill)
        release_buffer(placed_release)  # copied from: the worker may reuse it
    counts = np.array([len(it.boxes) for it in items], dtype=np.int64)
    m = int(counts.sum())

    def cat(arrays: list[np.ndarray], shape: tuple[int, ...], dtype: Any) -> torch.Tensor:
        if m == 0:
            return torch.from_numpy(np.zeros((0, *shape), dtype=dtype))
        return torch.from_numpy(np.concatenate(arrays).astype(dtype, copy=False).reshape(m, *shape))

    batch = Batch(
        images=images,
        image_sizes=torch.from_numpy(sizes),
        orig_sizes=torch.tensor([it.orig_size for it in items], dtype=torch.int64).view(b, 2),
        scale=torch.tensor([it.scale for it in items], dtype=torch.float32).view(b, 2),
        offset=torch.tensor([it.offset for it in items], dtype=torch.float32).view(b, 2),
        image_ids=torch.tensor([it.image_id for it in items], dtype=torch.int64),
        image_labels=torch.tensor([it.image_label for it in items], dtype=torch.int64),
        boxes=cat([it.boxes for it in items], (4,), np.float32),
        batch_index=torch.from_numpy(np.repeat(np.arange(b, dtype=np.int64), counts)),
        labels=cat([it.labels for it in items], (), np.int64),
        landmarks=cat([it.landmarks for it in items], (k, 2), np.float32),
        visibility=cat([it.visibility for it in items], (k,), np.uint8),
        object_ids=cat([it.object_ids for it in items], (), np.int64),
        object_counts=tuple(int(c) for c in counts),
    )
    if buffer is not None:
        object.__setattr__(batch, "_buffer", buffer)  # read by __reduce__ as the batch leaves
    return batch
