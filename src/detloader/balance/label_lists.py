"""Balancing for datasets detloader does not read itself: one array of class ids per image (an
Ultralytics ``YOLODataset``'s labels, or any list) gives a class-only
:class:`~detloader.annotations.index.AnnotationIndex`, and from it the sampler that
``make_loader(balance=...)`` makes; :class:`AutoEpochSampler` draws a new epoch each time it is
iterated, for training loops that never call ``set_epoch``. See docs/ultralytics.md.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import numpy as np
from torch.utils.data import Sampler

from detloader.annotations.fields import pack_strings
from detloader.annotations.index import AnnotationIndex, Vocabulary
from detloader.balance.base import check_int
from detloader.balance.groups import normalize_by
from detloader.balance.weighted import make_balanced_sampler
from detloader.balance.weights import BALANCE_CHOICES, check_strategy
from detloader.errors import DetloaderTypeError, DetloaderValueError, RectBatchError

#: What a class-only index can be balanced by: its objects' classes.
LABEL_KEYS: tuple[str, ...] = ("class",)


def check_balance(balance: Any) -> str | Mapping[Any, float]:
    """``balance`` unchanged if :func:`~detloader.balance.weighted.make_balanced_sampler` takes it
    as a strategy (``"sqrt"``, ``"power:0.3"``, ``"class_aware"``, ...) or a ``{class: weight}``
    mapping; raises DetloaderValueError / DetloaderTypeError naming it otherwise (before any
    data is read)."""
    if isinstance(balance, Mapping):
        return balance
    if not isinstance(balance, str):
        raise DetloaderTypeError(f"balance={balance!r} must be a strategy name {BALANCE_CHOICES} or a "
                                 "{class: weight} mapping")
    check_strategy(balance, weights_as="{class: weight}")
    return balance


def check_label_key(by: Any) -> str:
    """``"class"``: the only key a class-only index has; raises DetloaderValueError naming ``by``."""
    keys = normalize_by(by)
    if keys != LABEL_KEYS:
        raise DetloaderValueError(f"by={by!r}: these labels carry only each object's class; use by='class' "
                                  "(image classes and attributes need a detloader index)")
    return "class"


def labels_index(labels: Sequence[Any], classes: Sequence[str]) -> AnnotationIndex:
    """A class-only index of ``len(labels)`` images: image ``i`` holds one object per entry of
    ``labels[i]`` (class ids, any shape, e.g. Ultralytics' ``(k, 1)`` floats), with ``classes``
    as names (ids beyond them are named by their number). Boxes, sizes and paths are
    placeholders: the index is for the balancing functions, not for loading."""
    per_image = [np.asarray(x).reshape(-1) for x in labels]
    n = len(per_image)
    if n == 0:
        raise DetloaderValueError("labels is empty: no image to balance")
    flat = np.concatenate(per_image)
    if len(flat) and (not np.all(np.isfinite(flat)) or np.any(flat < 0) or np.any(flat != np.round(flat))):
        bad = flat[~np.isfinite(flat) | (flat < 0) | (flat != np.round(flat))][0]
        raise DetloaderValueError(f"labels hold class id {bad!r}: class ids must be integers >= 0")
    ids = flat.astype(np.int32)
    names = [str(c) for c in classes]
    top = int(ids.max()) + 1 if len(ids) else 0
    names += [str(i) for i in range(len(names), top)]
    m = len(ids)
    offsets = np.zeros(n + 1, dtype=np.int64)
    np.cumsum([len(x) for x in per_image], out=offsets[1:])
    blob, path_offsets = pack_strings([""] * n)
    arrays = {
        "width": np.ones(n, dtype=np.int32),
        "height": np.ones(n, dtype=np.int32),
        "image_labels": np.full(n, -1, dtype=np.int32),
        "image_attributes": np.zeros((n, 0), dtype=np.int32),
        "verified": np.zeros(n, dtype=bool),
        "object_offsets": offsets,
        "boxes": np.zeros((m, 4), dtype=np.float32),
        "labels": ids,
        "difficult": np.zeros(m, dtype=bool),
        "truncated": np.zeros(m, dtype=bool),
        "occluded": np.zeros(m, dtype=bool),
        "object_attributes": np.zeros((m, 0), dtype=np.int32),
        "landmarks": np.zeros((m, 0, 2), dtype=np.float32),
        "visibility": np.zeros((m, 0), dtype=np.uint8),
        "image_paths_blob": blob,
        "image_paths_offsets": path_offsets,
        "annotation_paths_blob": blob,
        "annotation_paths_offsets": path_offsets,
    }
    return AnnotationIndex(root=".", arrays=arrays, vocab=Vocabulary(classes=tuple(names)))


class AutoEpochSampler(Sampler[Any]):
    """A detloader sampler that draws a new epoch each time it is iterated: iteration ``k``
    (from ``start_epoch``) is the wrapped sampler's epoch ``start_epoch + k``, so a loop that
    never calls ``set_epoch`` (Ultralytics outside DDP), or whose workers start the next epoch
    before it does (persistent workers), still gets a new draw every epoch.

    ``set_epoch(e)`` makes ``e`` the epoch of the next iteration, unless an iteration of epoch
    ``e`` or later has already started (a late call for an epoch begun early is ignored, so
    no epoch is drawn twice). Rank, world size, seed and length are the wrapped sampler's.
    """

    def __init__(self, sampler: Any, start_epoch: int = 0) -> None:
        if not callable(getattr(sampler, "set_epoch", None)):
            raise DetloaderTypeError(f"sampler={sampler!r} has no set_epoch: AutoEpochSampler needs a sampler whose "
                                     "draw is chosen by its epoch (a detloader sampler)")
        self.sampler = sampler
        self._next = check_int("start_epoch", start_epoch, 0)
        self._started: int | None = None  # the epoch of the last iteration begun

    @property
    def epoch(self) -> int | None:
        """The epoch of the last iteration begun (None before the first)."""
        return self._started

    @property
    def next_epoch(self) -> int:
        """The epoch the next iteration draws."""
        return self._next

    def set_epoch(self, epoch: int) -> None:
        """Draw ``epoch`` next, unless an iteration of ``epoch`` or later has begun."""
        epoch = check_int("epoch", epoch, 0)
        if self._started is None or epoch > self._started:
            self._next = epoch

    def __iter__(self) -> Iterator[Any]:
        epoch = self._next
        self._started, self._next = epoch, epoch + 1
        self.sampler.set_epoch(epoch)
        yield from self.sampler

    def __len__(self) -> int:
        return len(self.sampler)

    def state_dict(self) -> dict[str, Any]:
        """``{"next_epoch", "sampler"}``: plain data (the wrapped sampler's own state inside)."""
        inner = self.sampler.state_dict() if callable(getattr(self.sampler, "state_dict", None)) else None
        return {"next_epoch": self._next, "sampler": inner}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore :meth:`state_dict`: the next iteration draws ``next_epoch``."""
        if "next_epoch" not in state:
            raise DetloaderValueError("AutoEpochSampler.load_state_dict: state lacks 'next_epoch'")
        self._next = check_int("next_epoch", state["next_epoch"], 0)
        self._started = None
        if state.get("sampler") is not None and callable(getattr(self.sampler, "load_state_dict", None)):
            self.sampler.load_state_dict(state["sampler"])


def labels_sampler(
    labels: Sequence[Any],
    classes: Sequence[str],
    balance: str | Mapping[Any, float] = "sqrt",
    *,
    by: str = "class",
    seed: int = 0,
    start_epoch: int = 0,
    rank: int | None = None,
    world_size: int | None = None,
) -> AutoEpochSampler:
    """The sampler ``make_loader(balance=balance, balance_by=by, seed=seed)`` would make for
    images holding ``labels`` (see :func:`labels_index`), drawing a new epoch per iteration
    (:class:`AutoEpochSampler`). ``rank`` / ``world_size`` None: ``torch.distributed``'s global
    ones when it is initialised, else one process; rank ``r`` of ``W`` takes positions
    ``r::W`` of each epoch's one global draw."""
    balance = check_balance(balance)
    by = check_label_key(by)
    index = labels_index(labels, classes)
    inner = make_balanced_sampler(index, balance, by=by, seed=seed, rank=rank, world_size=world_size)
    return AutoEpochSampler(inner, start_epoch)


def check_rect_batches(rect: bool, batch_shapes: Any) -> None:
    """Refuse (RectBatchError) ``rect=True`` when ``batch_shapes`` (one letterbox shape per batch
    of the dataset's own order, Ultralytics' ``dataset.batch_shapes``) are not all the same: a
    reordering sampler would put images of several shapes in one batch, which cannot be stacked."""
    if not rect or batch_shapes is None:
        return
    shapes = np.asarray(batch_shapes).reshape(len(batch_shapes), -1)
    distinct = np.unique(shapes, axis=0) if len(shapes) else shapes
    if len(distinct) > 1:
        listed = ", ".join("x".join(str(int(v)) for v in s) for s in distinct[:4])
        more = f" and {len(distinct) - 4} more" if len(distinct) > 4 else ""
        raise RectBatchError(f"rect=True gives this dataset {len(distinct)} batch shapes ({listed}{more}); a balanced "
                             "sampler reorders the images, so one batch would mix shapes that cannot be stacked. Train "
                             "with rect=False (the default for training), or without the balanced trainer")
