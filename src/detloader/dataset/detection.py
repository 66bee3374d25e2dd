"""DetectionDataset: a map-style torch Dataset over an AnnotationIndex.

``dataset[i]`` reads image ``i`` (or takes it from the image store), runs the transform on the
image and its objects together and returns a :class:`Sample`. The dataset holds only the index
arrays and a few parameters, so DataLoader workers share the index pages instead of copying
them. Sample ``i`` of an epoch gets ``default_rng((seed, epoch, i))`` whichever worker or thread
makes it; the epoch lives in shared memory so ``set_epoch`` reaches running workers.
An image that does not decode raises under ``on_decode_error="raise"``; under ``"skip"``
:class:`Substitutes` (below the dataset) keeps the skip flags every worker shares and the order
in which images of the same class group stand in for it. See docs/loader.md, "DetectionDataset
and Sample", and docs/reliability.md, "Decode errors in the loader".
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import operator
import os
import threading
import warnings
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Executor, Future, ThreadPoolExecutor
from typing import Any, Literal

import numpy as np
import torch

from detloader.annotations.index import MISSING, AnnotationIndex
from detloader.annotations.problems import check_choice, check_int
from detloader.annotations.stratify import rarest_class_per_image
from detloader.dataset.sample import Sample, SampleBatch
from detloader.dataset.shards import ShardCache, pack_rows
from detloader.dataset.store import CacheKind, ImageStore, cache_size_from, decode_to_size
from detloader.errors import (
    DetloaderIndexError,
    DetloaderRuntimeWarning,
    DetloaderTypeError,
    DetloaderValueError,
    ImageDecodeError,
)
from detloader.images import ExifPolicy, MinSize, check_exif_policy, read_image
from detloader.transforms.base import Annotated, check_output, draws, min_input_size, mirror_maps
from detloader.transforms.functional import chw_tensor, resize_into
from detloader.transforms.geometric import Resize
from detloader.transforms.mix import MIX_STREAM, MixUp, Mosaic, group_size, mix_choice


class DetectionDataset(torch.utils.data.Dataset):
    """Map-style dataset: ``dataset[i] -> Sample`` for image ``i`` of ``index``.

    Args:
        index: the :class:`AnnotationIndex` (from :func:`detloader.read_annotations`).
        transform: ``transform(data: Annotated, rng) -> Annotated``, e.g. a
            :class:`~detloader.transforms.Compose`; None returns the decoded image as is. When
            the transform starts with a :class:`~detloader.transforms.Resize`, JPEGs it shrinks
            at least 2x are decoded at a reduced size (``reduced_decode``).
        seed: base seed of the per-sample generators; None draws one now.
        exif: EXIF orientation policy, see :mod:`detloader.images`.
        reduced_decode: allow DCT-scaled JPEG decoding (above).
        on_decode_error: ``"raise"`` (an :class:`~detloader.images.ImageDecodeError` naming
            the file and the dataset index) or ``"skip"`` (a substitute of the same image
            class and rarest object class).
        decode_threads: threads that load the images of a batch (:meth:`__getitems__`); 0
            loads them in the calling thread. Batches are the same for any value.
        cache: ``"disk"`` or ``"ram"``: decode every image once into a memory-mapped store
            (:mod:`detloader.dataset.store`), built now under a file lock unless a valid one exists.
            None (default): decode every time.
        cache_size: longer side of the stored images; default: the size the transform's
            first :class:`~detloader.transforms.Resize` gives each image; required when it has
            none. The transform gets the stored pixels as a read-only view of the map
            (detloader's transforms never write into their input).
        flip_pairs: the landmarks' left/right pairs a mirror swaps, by name or slot, in place of
            the index schema's; ``[]`` says the points are symmetric (no pair owed).
        class_flip_pairs: the classes a mirror swaps (``[("redleft", "redright")]``), in place of
            the pairs inferred from the class names (:class:`ClassFlip`); ``[]`` says no class
            has a side.
        storage_options: for an index read from a pack (``read_annotations("s3://...")``), the
            object store's options as given there (endpoint, credentials; default: the
            environment's). Its images are read from their shards (:attr:`shards`, a
            :class:`~detloader.dataset.shards.ShardCache`: each shard downloaded once per node, kept
            under the ``stream_cache_limit``); ``cache`` is refused for a pack.

    A transform that can mirror gets the flip warnings of :func:`~detloader.transforms.base.mirror_maps`
    once, here (docs/loader.md, "Flips: classes and points with a side").

    When the decoded image's size differs from the size the annotation states, annotations
    are scaled to the image (per axis) and a warning is given once per process.
    """

    #: What an index group makes (:meth:`with_mix`); None: that part is off.
    mosaic: Mosaic | None = None
    mixup: MixUp | None = None

    def __init__(
        self,
        index: AnnotationIndex,
        transform: Callable[[Annotated, np.random.Generator], Annotated] | None = None,
        *,
        seed: int | None = None,
        exif: ExifPolicy = "auto",
        reduced_decode: bool = True,
        on_decode_error: OnDecodeError = "raise",
        decode_threads: int = 0,
        cache: CacheKind | None = None,
        cache_size: int | Resize | None = None,
        flip_pairs: Sequence[tuple[str | int, str | int]] | None = None,
        class_flip_pairs: Sequence[tuple[str | int, str | int]] | None = None,
        storage_options: Mapping[str, Any] | None = None,
    ) -> None:
        if not isinstance(index, AnnotationIndex):
            raise DetloaderTypeError(f"index={type(index).__name__}: expected an AnnotationIndex")
        if transform is not None and not callable(transform):
            raise DetloaderTypeError(f"transform={transform!r} is not callable")
        check_exif_policy(exif)
        check_choice("on_decode_error", on_decode_error, DECODE_ERROR_CHOICES)
        check_int("decode_threads", decode_threads, 0)
        self.index = index
        self._root = os.fspath(index.root)
        self.transform = transform
        self._frame: np.ndarray | None = None  # _in_frame
        self.seed = int(np.random.SeedSequence().entropy % 2**63) if seed is None else int(seed)  # type: ignore[operator]
        self.exif: ExifPolicy = exif
        self.reduced_decode = bool(reduced_decode)
        self.decode_threads = int(decode_threads)
        #: ``take(shape) -> (tensor, release)``: where :meth:`__getitems__` copies each image of a
        #: batch as soon as it is made, giving a :class:`~detloader.dataset.sample.SampleBatch`
        #: (a worker of :func:`~detloader.make_loader` sets it on its own copy, so that
        #: ``collate_detection`` need not copy); None: each sample keeps its own memory
        self.batch_buffer: Callable[[tuple[int, ...]], tuple[torch.Tensor, Any]] | None = None
        self._flip_permutation, self.class_flip = mirror_maps(index, transform, flip_pairs, class_flip_pairs)
        # One shared int64: set_epoch in the main process is seen by running workers.
        self._epoch = torch.zeros(1, dtype=torch.int64).share_memory_()
        self._warned: set[str] = set()
        self.on_decode_error: OnDecodeError = on_decode_error
        self._substitutes = Substitutes(index, self.seed, on_decode_error == "skip")
        self.store: ImageStore | None = None
        #: the shards of the pack the index was read from (None: images are files)
        self.shards: ShardCache | None = None
        self._pack_rows = pack_rows(index)
        if self._pack_rows is not None:
            if cache is not None:
                raise DetloaderValueError(
                    f"cache={cache!r}: {index.meta['pack']['url']} is a pack, and the image store is tied to "
                    "image files on disk; leave cache out (the stream cache keeps the shards, stream_cache_limit)"
                )
            self.shards = ShardCache.for_index(index, storage_options=storage_options)
        if cache is not None:
            size = cache_size if cache_size is not None else cache_size_from(transform)
            if size is None:
                raise DetloaderValueError(
                    f"cache={cache!r} needs cache_size=: transform={transform!r} fixes no output size"
                )
            self.store = ImageStore.open(index, cache, size, exif=exif, on_decode_error=on_decode_error)

    # -- epochs -----------------------------------------------------------------------------
    def set_epoch(self, epoch: int) -> None:
        """Set the epoch that seeds the per-sample generators; call it before each epoch."""
        epoch = operator.index(epoch)
        if epoch < 0:
            raise DetloaderValueError(f"epoch={epoch} must be >= 0")
        if epoch != self.epoch:
            self._substitutes.clear()
        self._epoch[0] = epoch

    @property
    def epoch(self) -> int:
        return int(self._epoch[0])

    def generator(self, i: int, epoch: int | None = None) -> np.random.Generator:
        """The generator the transform of sample ``i`` gets in ``epoch`` (default: the
        current one)."""
        return np.random.default_rng((self.seed, self.epoch if epoch is None else epoch, int(i)))

    def with_decode_threads(self, decode_threads: int) -> DetectionDataset:
        """A copy that loads batches on ``decode_threads`` threads; it shares the index, the
        transform and the epoch with this dataset (``set_epoch`` on either reaches both)."""
        check_int("decode_threads", decode_threads, 0)
        if int(decode_threads) == self.decode_threads:
            return self
        return self._twin(decode_threads=int(decode_threads))

    def with_mix(self, mosaic: Mosaic | None = None, mixup: MixUp | None = None) -> DetectionDataset:
        """A copy whose index groups (``dataset[[i, p1, ...]]``, ``group_size(mosaic, mixup)``
        long) are mosaics and mixups; it shares the index, the transform and the epoch."""
        return self._twin(mosaic=mosaic, mixup=mixup)

    def _twin(self, **changes: Any) -> DetectionDataset:
        twin = copy.copy(self)  # shallow: the index, transform, epoch and skip flags are shared
        twin.__dict__.update(changes, _warned=set())
        return twin

    # -- access -----------------------------------------------------------------------------
    def __len__(self) -> int:
        return len(self.index)

    @property
    def classes(self) -> tuple[str, ...]:
        return self.index.classes

    def _warn_once(self, kind: str, message: str) -> None:
        if kind not in self._warned:
            self._warned.add(kind)
            warnings.warn(message + " (warned once per process)", DetloaderRuntimeWarning, stacklevel=3)

    def load(self, i: int) -> Annotated:
        """Image ``i`` decoded, with its objects in decoded-image coordinates, before the
        transform. ``affine`` already holds any decode-time scaling."""
        idx = self.index
        ann_size = (int(idx.width[i]), int(idx.height[i]))
        if self.store is not None:
            return self._load_stored(i, ann_size)
        hint: MinSize = None  # (w, h) -> smallest decode size the transform allows
        if self.reduced_decode and self.transform is not None:
            hint = functools.partial(min_input_size, (self.transform,))
        rel = idx.relative_image_path(i)
        path = os.path.join(self._root, rel)  # a str: no Path built per image
        if self.shards is not None and self._pack_rows is not None:
            decoded = self.shards.read(int(self._pack_rows[i]), expected_size=ann_size, exif=self.exif,
                                       min_size=hint, source=f"{self.shards.url}: {rel}")
        else:
            decoded = read_image(path, expected_size=ann_size, exif=self.exif, min_size=hint)
        if decoded.exif_ignored:
            self._warn_once(
                "exif",
                f"{os.fspath(path)}: EXIF orientation {decoded.orientation} not applied because "
                f"the annotation size {ann_size[0]}x{ann_size[1]} is the stored (unrotated) "
                "size: boxes are taken to be drawn on the raw pixels",
            )
        full_w, full_h = decoded.full_size
        if (full_w, full_h) != ann_size:
            self._warn_once(
                "size",
                f"{os.fspath(path)}: image is {full_w}x{full_h} but its annotation says "
                f"{ann_size[0]}x{ann_size[1]}; annotations are scaled to the image",
            )
        # Annotation frame -> decoded pixels (DCT scale, size mismatch)
        return self._annotated(
            i, decoded.image, decoded.scale * full_w / ann_size[0], decoded.scale * full_h / ann_size[1]
        )

    def _load_stored(self, i: int, ann_size: tuple[int, int]) -> Annotated:
        """:meth:`load` from the image store; an image whose file changed since it was stored
        is decoded from the file to the stored size (never served stale)."""
        assert self.store is not None
        path = self.index.image_path(i)
        image = self.store.get(i, path)  # a read-only view of the map: no copy
        if image is None:
            self._warn_once(
                "stale", f"{os.fspath(path)}: changed since the image store was built; decoded from the file"
            )
            image = decode_to_size(self.index, i, *self.store.size(i), self.exif)
        h, w = image.shape[:2]
        return self._annotated(i, image, w / ann_size[0], h / ann_size[1])

    def _annotated(self, i: int, image: np.ndarray, sx: float, sy: float) -> Annotated:
        """Image ``i``'s pixels with its objects mapped by ``(sx, sy)`` from the annotation
        frame; clips boxes and drops landmarks that lie outside the image."""
        idx = self.index
        lo, hi = int(idx.object_offsets[i]), int(idx.object_offsets[i + 1])
        data = Annotated(
            image=image,
            boxes=np.array(idx.boxes[lo:hi], dtype=np.float32),
            labels=np.array(idx.labels[lo:hi], dtype=np.int64),
            landmarks=np.array(idx.landmarks[lo:hi], dtype=np.float32),
            visibility=np.array(idx.visibility[lo:hi], dtype=np.uint8),
            object_ids=np.arange(lo, hi, dtype=np.int64),
            flip_permutation=self._flip_permutation,
            class_flip=self.class_flip,
        )
        if sx != 1.0 or sy != 1.0 or not self._in_frame()[i]:  # else the clip would change nothing
            data.map_annotations(sx, sy, 0.0, 0.0)
        return data

    def _in_frame(self) -> np.ndarray:
        """bool per image, made once per process: every object of the image lies in its
        annotated frame, so the clip at that size (:meth:`Annotated.map_annotations`) would
        change no value: boxes and visible points in ``[0, W] x [0, H]`` (no -0.0, no NaN),
        absent points at (0, 0). A third of a sample's numpy calls, saved for such images."""
        if self._frame is None:
            idx = self.index
            image = idx.object_image
            w = idx.width[image].astype(np.float32)
            h = idx.height[image].astype(np.float32)
            boxes = np.asarray(idx.boxes, dtype=np.float32)
            ok = ((boxes >= 0) & ~np.signbit(boxes)).all(axis=1)
            ok &= (boxes[:, 0] <= w) & (boxes[:, 2] <= w) & (boxes[:, 1] <= h) & (boxes[:, 3] <= h)
            points = np.asarray(idx.landmarks, dtype=np.float32)
            if points.size:
                x, y = points[..., 0], points[..., 1]
                unsigned = (points >= 0).all(axis=-1) & ~np.signbit(points).any(axis=-1)
                inside = unsigned & (x <= w[:, None]) & (y <= h[:, None])
                ok &= np.where(np.asarray(idx.visibility) > 0, inside, unsigned & (x == 0) & (y == 0)).all(axis=1)
            frame = np.ones(len(idx), dtype=np.bool_)
            frame[image[~ok]] = False
            self._frame = frame
        return self._frame

    # -- decode errors ----------------------------------------------------------------------
    @property
    def skipped(self) -> list[tuple[int, str]]:
        """(dataset index, image path) of the images that failed to decode since the last
        :meth:`set_epoch` (``on_decode_error="skip"``), in index order; DataLoader workers'
        skips included (the flags live in shared memory)."""
        return self._substitutes.skipped()

    def _load_or_substitute(self, i: int, epoch: int) -> tuple[int, Annotated]:
        """``(j, self.load(j))``: ``j == i`` unless image ``i`` does not decode and the policy
        is ``"skip"``, then ``j`` is its substitute in ``epoch``.

        Raises:
            ImageDecodeError: ``"raise"`` policy, naming the file and the dataset index; or no
                substitute tried decodes.
        """
        try:
            return i, self.load(i)
        except ImageDecodeError as err:
            if self.on_decode_error == "raise":
                raise ImageDecodeError(f"{err} (dataset index {i}); {ImageDecodeError.HINT}") from err
            self._skip(i, err)
        group, rest = self._substitutes.order(i, epoch)
        for j in np.concatenate([group, rest])[:MAX_SUBSTITUTE_TRIES]:
            j = int(j)
            try:
                data = self.load(j)
            except ImageDecodeError as err:
                self._skip(j, err)
                continue
            if j not in group:
                self._warn_once(
                    "substitute",
                    f"{os.fspath(self.index.image_path(i))}: no image of the same image class and rarest "
                    f"object class decodes; substituted image {j} of another group",
                )
            return j, data
        raise ImageDecodeError(
            f"{os.fspath(self.index.image_path(i))}: cannot decode image (dataset index {i}) and none of "
            f"{min(len(group) + len(rest), MAX_SUBSTITUTE_TRIES)} substitutes tried decodes either; list every "
            "image that does not decode with detloader validate PATH --decode"
        )

    def _skip(self, i: int, err: ImageDecodeError) -> None:
        self._substitutes.mark(i)
        self._warn_once(f"skip:{i}", f"{err} (dataset index {i}); skipped, a substitute is used")

    def _checked(self, i: int | Sequence[int]) -> Any:
        n = len(self.index)
        if isinstance(i, (list, tuple, np.ndarray)):  # an index group (mosaic, mixup)
            return [int(self._checked(g)) for g in i]
        i = operator.index(i)
        if not -n <= i < n:
            raise DetloaderIndexError(f"index i={i} out of range for {n} images")
        return i % n

    def __getitem__(self, i: int | Sequence[int]) -> Sample:
        return self.load_sample(self._checked(i), self.epoch)

    def __getitems__(self, indices: Sequence[int]) -> list[Sample]:
        """``[dataset[i] for i in indices]``, on ``decode_threads`` threads when set; with a
        :attr:`batch_buffer`, a :class:`~detloader.dataset.sample.SampleBatch` whose images lie
        in one tensor."""
        ids = [self._checked(i) for i in indices]
        epoch = self.epoch  # read once: every sample of the batch sees the same epoch
        placer = None if self.batch_buffer is None else _Placer(self.batch_buffer, len(ids))

        def load(j: int, i: int) -> Sample:
            if placer is None:
                return self.load_sample(i, epoch)
            with resize_into(placer.slot(j)):  # the resize writes into the batch (functional.resize_into)
                return placer.place(j, self.load_sample(i, epoch))

        threads = min(self.decode_threads, len(ids))
        if threads < 2:
            samples = [load(j, i) for j, i in enumerate(ids)]
        else:
            # A pool per batch: starting two threads costs ~0.1 ms (under 1 % of a batch), and no
            # thread outlives the call, so DataLoader workers can still be forked safely and the
            # dataset pickles as before.
            with ThreadPoolExecutor(threads, thread_name_prefix="detloader-decode") as pool:
                samples = [f.result() for f in [pool.submit(load, j, i) for j, i in enumerate(ids)]]
        return samples if placer is None else placer.batch(samples)

    def submit(self, indices: Sequence[int], pool: Executor) -> list[Future[Sample]]:
        """Start loading ``indices`` (checked first) of the current epoch on ``pool``: how a
        ``num_workers=0`` loader from :func:`detloader.make_loader` loads the next batch on the
        decode threads while the loop uses the current one."""
        ids = [self._checked(i) for i in indices]
        epoch = self.epoch
        return [pool.submit(self.load_sample, i, epoch) for i in ids]

    def load_sample(self, i: int | Sequence[int], epoch: int) -> Sample:
        """Sample ``i`` (``0 <= i < len``) of ``epoch``, the function ``__getitem__`` and the
        threads of ``__getitems__`` run. A group ``[i, p1, ...]`` gives its mosaic / mixup
        (image class ``MISSING``, ``image_id`` ``i``), or sample ``i`` when its draw says neither."""
        mixed = None
        if not isinstance(i, (int, np.integer)):
            group, i = [int(g) for g in i], int(i[0])
            mixed = self._mixed(group, epoch)
        if mixed is None:
            j, data = self._load_or_substitute(i, epoch)
            data = self._transformed(data, self._rng(i, epoch))
        else:
            j, data = i, mixed
        a = data.affine
        idx = self.index
        return Sample(
            image=chw_tensor(data.image),  # the store's pages as they are: the batch is the one copy
            boxes=data.boxes,
            labels=data.labels,
            landmarks=data.landmarks,
            visibility=data.visibility,
            image_label=MISSING if mixed is not None else int(idx.image_labels[j]),
            image_id=j,
            orig_size=(int(idx.width[j]), int(idx.height[j])),
            scale=(float(a[0]), float(a[1])),
            offset=(float(a[2]), float(a[3])),
            object_ids=data.object_ids,
        )

    def _rng(self, i: int, epoch: int) -> np.random.Generator | None:
        """:meth:`generator`, or None for a transform that draws nothing (``transforms.base.draws``,
        under a microsecond: told each time, so a replaced transform is told too)."""
        return self.generator(i, epoch) if self.transform is not None and draws(self.transform) else None

    def _transformed(self, data: Annotated, rng: np.random.Generator | None) -> Annotated:
        """``data`` transformed; ``rng`` None for a transform that draws nothing (``draws``)."""
        if self.transform is not None:
            data = self.transform(data, rng)  # type: ignore[arg-type]
            check_output(data, self.transform)
        return data

    def _mixed(self, group: list[int], epoch: int) -> Annotated | None:
        """The mosaic and/or mixup of ``group`` (:mod:`detloader.transforms.mix`: mosaic of the
        decoded images, the transform once, mixup with the transformed partner); None when the
        sample's draw (:func:`~detloader.transforms.mix.mix_choice`) says neither."""
        if len(group) != group_size(self.mosaic, self.mixup):
            raise DetloaderValueError(
                f"index group {group}: {len(group)} indices, but mosaic={self.mosaic!r} and "
                f"mixup={self.mixup!r} take {group_size(self.mosaic, self.mixup)}"
            )
        first = group[0]
        mosaic, mixup, rng = mix_choice(self.mosaic, self.mixup, self.seed, epoch, first)
        if not (mosaic or mixup):
            return None
        load = lambda g: self._load_or_substitute(g, epoch)[1]  # noqa: E731
        if mosaic:
            assert self.mosaic is not None
            size = int(self.index.width[first]), int(self.index.height[first])
            data = self.mosaic([load(g) for g in group[:4]], *size, rng)
        else:
            data = load(first)
        data = self._transformed(data, self.generator(first, epoch))
        if mixup:
            assert self.mixup is not None
            partner = np.random.default_rng((self.seed, epoch, first, MIX_STREAM, 1))
            data = self.mixup(data, self._transformed(load(group[-1]), partner), rng)
        return data

    def __repr__(self) -> str:
        return (
            f"DetectionDataset(images={len(self)}, transform={self.transform!r}, "
            f"seed={self.seed}, exif={self.exif!r}, decode_threads={self.decode_threads}"
            + (f", store={self.store!r})" if self.store is not None else ")")
        )

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_warned"] = set()  # each process warns for itself
        state["_frame"] = None  # each process makes it again when needed
        return state


class _Placer:
    """Copies each image of one batch into a ``[B, 3, H, W]`` tensor as it is made (its pixels
    still in the cache, the image's own memory then freed), taken when the first image is done;
    from a first image of another size on, the others keep their own memory. A batch whose
    load fails keeps its tensor taken (the worker's next batches take other memory)."""

    def __init__(self, take: Callable[[tuple[int, ...]], tuple[torch.Tensor, Any]], n: int) -> None:
        self.take, self.n = take, n
        self.lock = threading.Lock()
        self.images: torch.Tensor | None = None
        self.release: Any = None
        self.same = True

    def slot(self, j: int) -> torch.Tensor | None:
        """Where image ``j`` goes, once the batch's tensor is taken (after the first image)."""
        with self.lock:
            return self.images[j] if self.images is not None and self.same else None

    def place(self, j: int, sample: Sample) -> Sample:
        image = sample.image
        with self.lock:
            if self.images is None and self.same and image.dtype == torch.uint8:
                self.images, self.release = self.take((self.n, *image.shape))
            fits = self.same and self.images is not None and self.images.shape[1:] == image.shape
            self.same = fits
        if not fits:
            return sample
        assert self.images is not None
        slot = self.images[j]
        if image.data_ptr() == slot.data_ptr() and image.stride() == slot.stride():
            return sample  # resized into its place already (a view of the slot)
        if image.untyped_storage().data_ptr() == slot.untyped_storage().data_ptr():
            image = image.clone()  # made from the slot (a view of it after the resize): no overlapping copy
        slot.copy_(image)
        return dataclasses.replace(sample, image=slot)

    def batch(self, samples: list[Sample]) -> SampleBatch:
        out = SampleBatch(samples)
        out.images = self.images if self.same else None
        out.release = self.release
        return out


OnDecodeError = Literal["raise", "skip"]
DECODE_ERROR_CHOICES: tuple[str, ...] = ("raise", "skip")
#: Images tried as substitutes of one undecodable image before giving up.
MAX_SUBSTITUTE_TRIES = 32


class Substitutes:
    """The skip flags and substitute order of one dataset (``enabled``: the ``"skip"`` policy;
    otherwise no flags are kept)."""

    def __init__(self, index: AnnotationIndex, seed: int, enabled: bool) -> None:
        self.index, self.seed = index, seed
        self.flags = torch.zeros(len(index) if enabled else 0, dtype=torch.uint8).share_memory_()
        self._rarest: np.ndarray | None = None

    def clear(self) -> None:
        self.flags.zero_()

    def mark(self, i: int) -> None:
        """Image ``i`` failed to decode in this epoch."""
        self.flags[i] = 1

    def skipped(self) -> list[tuple[int, str]]:
        """(index, image path) of the images marked since :meth:`clear`, in index order."""
        return [(int(i), os.fspath(self.index.image_path(int(i)))) for i in torch.nonzero(self.flags).flatten()]

    def order(self, i: int, epoch: int) -> tuple[np.ndarray, np.ndarray]:
        """Substitute candidates of image ``i`` in the order they are tried: the other images of
        its group (same image class, same rarest object class), then the rest, each in the
        order of ``default_rng((seed, epoch, i, 1))``."""
        idx = self.index
        if self._rarest is None:
            self._rarest = rarest_class_per_image(idx.labels, idx.object_image, len(idx), len(idx.classes))
        same = (self._rarest == self._rarest[i]) & (idx.image_labels == idx.image_labels[i])
        same[i] = False
        others = ~same
        others[i] = False
        rng = np.random.default_rng((self.seed, epoch, i, 1))
        return rng.permutation(np.flatnonzero(same)), rng.permutation(np.flatnonzero(others))

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_rarest": None}  # each process computes it again when needed
