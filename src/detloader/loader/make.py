"""make_loader: a ``torch.utils.data.DataLoader`` with detection defaults and checks.

It adds ``collate_detection``, conflicting options refused by name before any worker starts,
one intra-op thread per worker, and a ``seed`` that fixes the shuffle order and worker seeds.
The loader never changes the dataset: ``decode_threads``, ``mosaic`` and ``mixup`` give it a
copy. See docs/loader.md, "make_loader".
"""

from __future__ import annotations

import os
import random
import sys
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import field, fields, make_dataclass, replace
from inspect import signature
from typing import Any, Literal

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset, RandomSampler, Sampler, SequentialSampler

from detloader._system import accelerator_available
from detloader._system.pool import worker_context
from detloader.annotations.problems import check_int
from detloader.balance.shard_order import ShardLocalSampler
from detloader.balance.weighted import WeightedSampler, make_balanced_sampler
from detloader.balance.weights import NO_BALANCE
from detloader.balance.wrappers import AspectRatioBatchSampler, PartnerSampler
from detloader.dataset.shards import pack_rows
from detloader.errors import DetloaderRuntimeWarning, DetloaderValueError
from detloader.loader.auto import auto_loader_kwargs
from detloader.loader.collate import _image_buffer, collate_detection
from detloader.loader.workers import DetectionLoader, watch_parent
from detloader.transforms.mix import MixUp, Mosaic, group_size


class WorkerInit:
    """``worker_init_fn`` of loaders made here (a picklable class, for ``spawn``): the worker
    ends within a second when its parent process is killed (no orphan); one thread for torch,
    OpenCV and OpenMP; ``random`` and ``numpy`` seeded from the worker's torch seed; with
    ``batch_buffer`` (the loader collates with ``collate_detection``), the worker's copy of a
    :class:`~detloader.dataset.DetectionDataset` puts each image into the batch's shared memory
    as it is made (``DetectionDataset.batch_buffer``); then the user's function."""

    def __init__(self, user_fn: Callable[[int], None] | None = None, batch_buffer: bool = False) -> None:
        self.user_fn = user_fn
        self.batch_buffer = batch_buffer

    def __call__(self, worker_id: int) -> None:
        watch_parent()
        torch.set_num_threads(1)
        os.environ["OMP_NUM_THREADS"] = "1"
        cv2 = sys.modules.get("cv2")
        if cv2 is not None:
            cv2.setNumThreads(0)  # 0: no OpenCV thread pool, run in the calling thread
        seed = torch.initial_seed()
        random.seed(seed)
        np.random.seed(seed % 2**32)
        info = torch.utils.data.get_worker_info()
        if self.batch_buffer and info is not None and hasattr(info.dataset, "batch_buffer"):
            info.dataset.batch_buffer = _image_buffer  # this worker's own copy of the dataset
        if self.user_fn is not None:
            self.user_fn(worker_id)


#: What ``make_loader(balance=...)`` takes: a strategy name, ``{group: weight}`` or a sampler.
Balance = str | Mapping[Any, float] | Sampler[Any]


def resolve_balance(
    dataset: Dataset[Any],
    balance: Balance,
    *,
    by: Any,
    seed: int | None,
    shuffle: bool,
    sampler: Any,
    batch_sampler: Any,
    global_draw: bool = False,
) -> Sampler[Any]:
    """The sampler for ``make_loader(balance=...)``: conflicts refused by name, then
    :func:`detloader.balance.make_balanced_sampler` on the dataset's index (all ranks' draw
    with ``global_draw``, for a batch sampler that shares batches out itself)."""
    _refuse_clashes(
        f"balance={_short(balance)} builds the sampler",
        "must be left out (pass your own sampler as balance=, or drop balance)",
        ("shuffle=True", shuffle),
        ("sampler", sampler is not None),
        ("batch_sampler", batch_sampler is not None),
    )
    if isinstance(balance, Sampler):
        return balance
    index = getattr(dataset, "index", None)
    if index is None:
        raise DetloaderValueError(
            f"balance={_short(balance)} needs the dataset's annotation index (dataset.index, as "
            f"DetectionDataset has); {type(dataset).__name__} has none: pass a sampler instead"
        )
    ranks = {"rank": 0, "world_size": 1} if global_draw else {}
    return make_balanced_sampler(index, balance, by=by, seed=_seed(seed), **ranks)


def resolve_shard_order(dataset: Any, sampler: Sampler[Any] | None, *, seed: int | None,
                        global_draw: bool = False) -> Sampler[Any]:
    """For a dataset read from a pack (``dataset.shards``): the loader's draw, the balanced
    ``sampler`` or (None) ``shuffle=True``'s permutation, in a shard-local order
    (:class:`~detloader.balance.shard_order.ShardLocalSampler`: the same multiset, grouped by
    shard into windows of half the stream cache, so a node fetches each shard about once an
    epoch). A balanced draw is shared out to the ranks as the balanced samplers share it; the
    shuffle's permutation is each rank's whole, as without a pack (and so is a ``global_draw``
    that a batch sampler shares out)."""
    shards = dataset.shards
    shard_of = shards.shards_of(pack_rows(dataset.index))
    shard_bytes = np.array([s.bytes for s in shards.manifest.shards], dtype=np.int64)
    ranks: dict[str, int] = {}
    if sampler is None:  # shuffle=True: the seeded permutation make_loader draws without a pack, each rank's whole
        sampler = RandomSampler(dataset, generator=_generators(_seed(seed))[0])  # type: ignore[arg-type]
        ranks = {"rank": 0, "world_size": 1}
    elif global_draw:
        ranks = {"rank": 0, "world_size": 1}
    return ShardLocalSampler(sampler, shard_of, shard_bytes, int(shards.limit), seed=_seed(seed), **ranks)


def _seed(seed: int | None) -> int:
    """``seed``, or a fresh one (like an unseeded shuffle: a new order each run)."""
    return int(torch.randint(0, 2**62, (), dtype=torch.int64)) if seed is None else int(seed)


def resolve_augment_order(
    dataset: Dataset[Any],
    *,
    mosaic: float | Mosaic | None,
    mixup: float | MixUp | None,
    group_by_aspect: bool | Sequence[float],
    sampler: Any,
    shuffle: bool,
    batch_size: int | None,
    drop_last: bool,
    seed: int | None,
) -> tuple[Dataset[Any], Any, Any]:
    """``(dataset, sampler, batch_sampler)`` for ``make_loader(mosaic=, mixup=,
    group_by_aspect=)``: ``shuffle=True`` becomes a seeded uniform
    :class:`~detloader.balance.WeightedSampler` without replacement (resumable); mosaic and
    mixup wrap the order in a :class:`~detloader.balance.PartnerSampler` and give the loader
    ``dataset.with_mix(...)``; ``group_by_aspect`` wraps it in an
    :class:`~detloader.balance.AspectRatioBatchSampler` (None for ``sampler`` then)."""
    if sampler is None and shuffle:
        ranks = {"rank": 0, "world_size": 1} if group_by_aspect else {}
        n = len(dataset)  # type: ignore[arg-type]
        sampler = WeightedSampler(np.ones(n), replacement=False, seed=_seed(seed), **ranks)
    if mosaic is not None or mixup is not None:
        if sampler is None:
            raise DetloaderValueError(
                f"mosaic={mosaic!r}, mixup={mixup!r} draw their partners from the loader's "
                "order: pass shuffle=True, balance= or a sampler"
            )
        mosaic = mosaic if mosaic is None or isinstance(mosaic, Mosaic) else Mosaic(mosaic)
        mixup = mixup if mixup is None or isinstance(mixup, MixUp) else MixUp(mixup)
        make = getattr(dataset, "with_mix", None)
        if not callable(make):
            raise DetloaderValueError(f"mosaic/mixup: {type(dataset).__name__} has no with_mix (DetectionDataset has)")
        dataset, sampler = make(mosaic, mixup), PartnerSampler(sampler, group_size(mosaic, mixup) - 1)
    if not group_by_aspect:
        return dataset, sampler, None
    index = getattr(dataset, "index", None)
    if index is None or batch_size is None:
        raise DetloaderValueError(
            "group_by_aspect needs a batch_size and the dataset's annotation index for the "
            f"image sizes (DetectionDataset has one; {type(dataset).__name__} given)"
        )
    order = sampler if sampler is not None else SequentialSampler(range(len(index)))
    bounds = (1.0,) if group_by_aspect is True else tuple(group_by_aspect)  # type: ignore[arg-type]
    ratios = np.asarray(index.width, dtype=np.float64) / np.asarray(index.height)
    batches = AspectRatioBatchSampler(order, ratios, batch_size, boundaries=bounds, drop_last=drop_last)
    return dataset, None, batches


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _refuse_clashes(cause: str, verdict: str, *options: tuple[str, bool]) -> None:
    """ValueError ``"{cause}, so {names} {verdict}"`` naming the ``(name, given)`` options that
    are given; nothing when none is."""
    names = ", ".join(name for name, given in options if given)
    if names:
        raise DetloaderValueError(f"{cause}, so {names} {verdict}")


def resolve_auto_workers(dataset: Dataset[Any], o: LoaderOptions, batch_size: int) -> LoaderOptions:
    """``num_workers="auto"``: the tuned (or heuristic) settings of :mod:`detloader.tune`,
    applied to the other options the caller left at their defaults."""
    # the warning (heuristic, not measured) points at the caller of make_loader
    rec, _reason = auto_loader_kwargs(dataset, batch_size, stacklevel=4, decode_threads=True)
    workers = int(rec.get("num_workers", 0))
    changes: dict[str, Any] = {"num_workers": workers}
    if o.decode_threads is None and hasattr(dataset, "with_decode_threads"):
        changes["decode_threads"] = int(rec.get("decode_threads", 0))
    if not o.pin_memory:
        changes["pin_memory"] = bool(rec.get("pin_memory", False))
    if workers > 0:
        if o.prefetch_factor is None and rec.get("prefetch_factor") is not None:
            changes["prefetch_factor"] = int(rec["prefetch_factor"])
        if not o.persistent_workers:
            changes["persistent_workers"] = bool(rec.get("persistent_workers", False))
    else:
        changes.update(prefetch_factor=None, persistent_workers=False)
    return replace(o, **changes)


def set_epoch(loader: DataLoader[Any], epoch: int) -> None:
    """Tell every epoch-aware part of ``loader`` that epoch ``epoch`` begins: the dataset
    (augmentation seeds), the sampler and the batch sampler (draws). Call it before each
    epoch; without it, seeded samplers and augmentations repeat the same epoch."""
    seen: set[int] = set()
    for part in (
        loader.dataset,
        loader.sampler,
        loader.batch_sampler,
        getattr(loader.batch_sampler, "sampler", None),
    ):
        fn = getattr(part, "set_epoch", None)
        if callable(fn) and id(part) not in seen:
            seen.add(id(part))
            fn(epoch)


def check_num_workers(num_workers: Any) -> int | Literal["auto"]:
    """``num_workers`` as :func:`make_loader` takes it, an int >= 0 or ``"auto"``; else a ValueError
    naming it. The one check of the setting: ``TrainConfig``, the Lightning DataModule and
    ``detloader train --num-workers`` pass it down here unchecked.

    At most 4 workers per usable CPU (at least 32 in all), and no more than the open-file limit
    allows (``ulimit -n``, 8 descriptors a worker: torch's queues take 4, tensors in flight
    more): beyond either, workers only wait for each other, and torch's DataLoader forks them
    until the descriptors run out, then hangs."""
    if isinstance(num_workers, str) and num_workers == "auto":
        return "auto"
    if isinstance(num_workers, bool) or not isinstance(num_workers, (int, np.integer)) or num_workers < 0:
        raise DetloaderValueError(f"num_workers={num_workers!r} must be an int >= 0 or 'auto'")
    from detloader._system.cpus import usable_cpus

    cpus = usable_cpus()
    cap, why = max(32, 4 * cpus), f"4 per usable CPU, {cpus} here, at least 32"
    try:
        import resource  # POSIX only
    except ImportError:
        files = -1
    else:
        files = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    if files > 0 and files // 8 < cap:
        cap, why = max(1, files // 8), f"the open-file limit, ulimit -n {files}, at 8 descriptors per worker"
    if num_workers > cap:
        raise DetloaderValueError(
            f"num_workers={num_workers!r} is over the cap of {cap} ({why}): more workers only wait for "
            "each other; use fewer, or num_workers='auto' (--num-workers auto)"
        )
    return int(num_workers)


def check_options(o: LoaderOptions) -> None:
    """Refuse conflicting or invalid options, naming them (ValueError); ``num_workers`` is
    :func:`check_num_workers`'s, before ``"auto"`` is resolved."""
    if o.batch_sampler is not None:
        _refuse_clashes(
            "batch_sampler is given",
            "must be left out: the batch sampler decides the batch size, order, sampling and last batch",
            (f"batch_size={o.batch_size}", o.batch_size != 1),
            ("shuffle=True", bool(o.shuffle)),
            ("sampler", o.sampler is not None),
            ("drop_last=True", bool(o.drop_last)),
        )
    elif o.batch_size is not None and (not isinstance(o.batch_size, int) or o.batch_size < 1):
        raise DetloaderValueError(f"batch_size={o.batch_size!r} must be a positive int")
    if o.batch_size is None and o.batch_sampler is None and o.collate_fn is collate_detection:
        raise DetloaderValueError(
            "batch_size=None turns batching off, but collate_fn=collate_detection makes "
            "batches: pass a batch_size or your own collate_fn"
        )
    if o.sampler is not None and o.shuffle:
        raise DetloaderValueError(
            "shuffle=True and sampler are exclusive: the sampler decides the order "
            "(shuffle inside the sampler, or pass shuffle=True without a sampler)"
        )
    if o.timeout < 0:
        raise DetloaderValueError(f"timeout={o.timeout!r} must be >= 0")
    if o.num_workers == 0:
        _refuse_clashes(
            "num_workers=0 loads in the main process",
            "cannot apply: use num_workers >= 1 or leave them out",
            (f"prefetch_factor={o.prefetch_factor}", o.prefetch_factor is not None),
            ("persistent_workers=True", bool(o.persistent_workers)),
            (f"timeout={o.timeout}", o.timeout > 0),
            (f"multiprocessing_context={o.multiprocessing_context!r}", o.multiprocessing_context is not None),
        )
    if o.prefetch_factor is not None and (not isinstance(o.prefetch_factor, int) or o.prefetch_factor < 1):
        raise DetloaderValueError(f"prefetch_factor={o.prefetch_factor!r} must be a positive int")
    if o.seed is not None and not isinstance(o.seed, (int, np.integer)):
        raise DetloaderValueError(f"seed={o.seed!r} must be an int or None")
    if o.decode_threads is not None:
        check_int("decode_threads", o.decode_threads, 0)


def with_decode_threads(dataset: Dataset[Any], decode_threads: int | None) -> Dataset[Any]:
    """``dataset`` loading batches on ``decode_threads`` threads: a copy from its
    ``with_decode_threads`` (:class:`~detloader.dataset.DetectionDataset`), the dataset itself
    when None or 0 is asked of one without threads; ValueError for threads it cannot use."""
    if decode_threads is None:
        return dataset
    make = getattr(dataset, "with_decode_threads", None)
    if callable(make):
        return make(decode_threads)  # type: ignore[no-any-return]
    if decode_threads:
        raise DetloaderValueError(
            f"decode_threads={decode_threads}: {type(dataset).__name__} has no "
            "with_decode_threads (DetectionDataset has); give your dataset a __getitems__ "
            "that loads a batch on threads, or leave decode_threads out"
        )
    return dataset


def dataloader_kwargs(dataset: Dataset[Any], o: LoaderOptions) -> dict[str, Any]:
    """Checked options -> keyword arguments of ``torch.utils.data.DataLoader(dataset, ...)``."""
    check_options(o)
    pin = bool(o.pin_memory)
    if pin and not accelerator_available():
        warnings.warn(
            "pin_memory=True ignored: no accelerator is available (pinning would only cost time)",
            DetloaderRuntimeWarning,
            stacklevel=3,
        )
        pin = False
    kwargs = {name: getattr(o, name) for name in _DATALOADER_OPTIONS}
    kwargs["pin_memory"] = pin
    if o.num_workers > 0:
        collate = getattr(o.collate_fn, "func", o.collate_fn)  # functools.partial(collate_detection, ...)
        kwargs["worker_init_fn"] = WorkerInit(o.worker_init_fn, batch_buffer=collate is collate_detection)
        if o.multiprocessing_context is None:  # workers that never import the caller's script
            kwargs["multiprocessing_context"] = worker_context()
    if o.batch_sampler is not None:  # DataLoader wants its defaults here
        kwargs.update(batch_size=1, shuffle=None, sampler=None, drop_last=False)
    if o.prefetch_factor is None:  # left out: DataLoader's own default applies
        del kwargs["prefetch_factor"]
    if o.seed is not None:
        # Two streams from one seed: the shuffle order from the sampler's own generator (so
        # it does not depend on how many worker seeds the loader drew before, which differs
        # with persistent_workers), the worker base seeds from the loader's.
        order, workers = _generators(int(o.seed))
        if o.shuffle:
            kwargs.update(shuffle=False, sampler=RandomSampler(dataset, generator=order))  # type: ignore[arg-type]
        kwargs["generator"] = workers
    return kwargs


def _generators(seed: int) -> tuple[torch.Generator, torch.Generator]:
    """The shuffle order's and the worker seeds' generators, two streams of one seed."""
    order, workers = np.random.SeedSequence(seed).generate_state(2, np.uint64)
    return (torch.Generator().manual_seed(int(order) & (2**63 - 1)),
            torch.Generator().manual_seed(int(workers) & (2**63 - 1)))


def make_loader(
    dataset: Dataset[Any],
    *,
    batch_size: int | None = 1,
    shuffle: bool = False,
    sampler: Sampler[Any] | Sequence[int] | None = None,
    batch_sampler: Sampler[list[int]] | Sequence[Sequence[int]] | None = None,
    num_workers: int | Literal["auto"] = 0,
    collate_fn: Callable[[list[Any]], Any] | None = collate_detection,
    pin_memory: bool = False,
    drop_last: bool = False,
    timeout: float = 0,
    worker_init_fn: Callable[[int], None] | None = None,
    multiprocessing_context: Any = None,
    prefetch_factor: int | None = None,
    persistent_workers: bool = False,
    seed: int | None = None,
    decode_threads: int | None = None,
    balance: Balance | None = None,
    balance_by: Any = "class",
    mosaic: float | Mosaic | None = None,
    mixup: float | MixUp | None = None,
    group_by_aspect: bool | Sequence[float] = False,
) -> DataLoader[Any]:
    """A ``torch.utils.data.DataLoader`` over ``dataset``; the parameters are DataLoader's,
    plus (docs/loader.md, "make_loader"):

    * ``seed``: an int seeds the shuffle order, the worker seeds and the balanced sampler.
    * ``decode_threads``: threads that load each batch's images (a copy of the
      :class:`~detloader.dataset.DetectionDataset`; None: the dataset's own).
    * ``num_workers="auto"``: the settings :func:`detloader.tune_loader` measured, else a
      default from the usable CPUs (a ``TuneWarning`` says so); nothing is measured here.
    * ``balance``, ``balance_by``: a strategy name, a ``{group: weight}`` mapping or a
      sampler, and the grouping (:func:`detloader.balance.make_balanced_sampler`); ``None``
      or ``"none"``: no balancing.
    * ``mosaic``, ``mixup``: a probability or a :class:`~detloader.transforms.Mosaic` /
      :class:`~detloader.transforms.MixUp`, partners drawn from the loader's own order, so
      ``shuffle=True``, ``balance`` or a ``sampler`` is needed.
    * ``group_by_aspect``: batches of similar aspect ratio (True, or ratio boundaries).

    Raises:
        ValueError: conflicting options (shuffle with a sampler; batch_sampler with
            batch_size/shuffle/sampler/drop_last; worker options with ``num_workers=0``;
            balance with shuffle/sampler/batch_sampler; mosaic, mixup or group_by_aspect
            with batch_sampler) or invalid values, named in the message.

    While iterating with workers, every worker is ended before either of these is raised:
        DetloaderError: one a worker raised (``ImageDecodeError``), its own message.
        LoaderWorkerError: a worker died (killed by a signal: out of memory?), named.
    """
    if mosaic is not None or mixup is not None or group_by_aspect:
        _refuse_clashes(
            "mosaic, mixup and group_by_aspect read the loader's order from its sampler",
            "cannot be combined with them",
            ("batch_sampler", batch_sampler is not None),
        )
    balanced = balance is not None and not (isinstance(balance, str) and balance == NO_BALANCE)
    if balanced:
        sampler = resolve_balance(
            dataset, balance, by=balance_by, seed=seed, shuffle=shuffle, sampler=sampler, batch_sampler=batch_sampler,
            global_draw=bool(group_by_aspect),
        )
    if getattr(dataset, "shards", None) is not None and (balanced or (shuffle and sampler is None)):
        sampler = resolve_shard_order(dataset, sampler, seed=seed, global_draw=bool(group_by_aspect))
        shuffle = False
    if mosaic is not None or mixup is not None or group_by_aspect:
        dataset, sampler, batch_sampler = resolve_augment_order(
            dataset, mosaic=mosaic, mixup=mixup, group_by_aspect=group_by_aspect, sampler=sampler,
            shuffle=shuffle, batch_size=batch_size, drop_last=drop_last, seed=seed,
        )
        shuffle = False
        if batch_sampler is not None:
            batch_size, drop_last = 1, False
    auto = check_num_workers(num_workers) == "auto"
    if auto:
        num_workers = 0  # until resolve_auto_workers below
    given = locals()
    options = LoaderOptions(**{f.name: given[f.name] for f in fields(LoaderOptions)})
    if auto:
        size = batch_size if batch_sampler is None else getattr(batch_sampler, "batch_size", 1)
        options = resolve_auto_workers(dataset, options, int(size or 1))
    kwargs = dataloader_kwargs(dataset, options)
    return DetectionLoader(with_decode_threads(dataset, options.decode_threads), **kwargs)


#: make_loader's parameters that decide the order and the dataset (resolved first); every other
#: keyword is an option of the loader itself.
_ORDER_PARAMETERS = ("balance", "balance_by", "mosaic", "mixup", "group_by_aspect")
#: The resolved options of :func:`make_loader`, one field per keyword of its signature (same
#: name, annotation and default) but those of the order. All but ``seed`` and
#: ``decode_threads`` are ``DataLoader`` keyword arguments of the same name.
LoaderOptions = make_dataclass(
    "LoaderOptions",
    [(p.name, p.annotation, field(default=p.default)) for p in signature(make_loader).parameters.values()
     if p.kind is p.KEYWORD_ONLY and p.name not in _ORDER_PARAMETERS],
    frozen=True,
)
LoaderOptions.__module__ = __name__
_DATALOADER_OPTIONS = tuple(f.name for f in fields(LoaderOptions) if f.name in signature(DataLoader).parameters)
