"""A run's folder (:class:`RunLock`: one training per folder, ``out/.train.lock`` held for the run and
``out/.train.owner.json`` naming the holder), the data it trains on (:func:`prepare_data`, and
:func:`data_record`, what ``--resume`` and ``evaluate`` compare and read back) and the loader that
serves it (:func:`train_loader`). What a user sees: docs/training.md, "Run folders" and "Resume on the
same data".
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import signal
import socket
import time
import warnings
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from detloader._system.files import refuse_link, write_file
from detloader._system.locks import locked
from detloader.balance.weights import NO_BALANCE
from detloader.errors import DetloaderRuntimeWarning, DetloaderValueError, NotRegularFileError, RunDirError
from detloader.train.config import TrainConfig
from detloader.train.distributed import DistEnv, barrier, init_distributed

#: Files whose presence means a folder holds a run.
RUN_FILES: tuple[str, ...] = ("last.pt", "config.json", "metrics.json")
#: Every file the trainer writes in a run folder: each must be a regular file or absent
#: (:meth:`RunLock.__enter__`; a link is refused, never written through).
WRITTEN_FILES: tuple[str, ...] = (
    ".train.lock", ".train.owner.json", *RUN_FILES, "previous.pt", "predictions.png",
)


def _next_free(out: Path) -> Path:
    """``runs/train`` -> ``runs/train2``, ``runs/train3``, ...: the first name not taken."""
    n = 2
    while out.with_name(f"{out.name}{n}").exists():
        n += 1
    return out.with_name(f"{out.name}{n}")


def check_out_dir(out: Path, *, resume: str | None, exist_ok: bool) -> None:
    """:class:`RunDirError` when ``out`` holds a run that this one would overwrite: neither a
    resume of a checkpoint in ``out`` nor ``exist_ok``."""
    found = [name for name in RUN_FILES if (out / name).exists()]
    if not found or exist_ok:
        return
    if resume is not None and Path(resume).resolve().parent == out.resolve():
        return
    raise RunDirError(
        f"out={str(out)!r} holds a run ({', '.join(found)}); continue it with --resume {out / 'last.pt'}, "
        f"write elsewhere (--out {_next_free(out)}), or overwrite it knowingly with --exist-ok "
        "(TrainConfig(resume=...), out=..., exist_ok=True from Python)"
    )


def remove_temporaries(out: Path) -> list[Path]:
    """Remove the temporary files that writes of :data:`WRITTEN_FILES` left in ``out`` when
    their process died (``.last.pt.XXXXXXXX.tmp`` of a checkpoint save killed midway, the
    ``.previous.pt.PID.tmp`` link); the paths removed. Only under the run lock: no other
    training writes there then, so every such file is a dead write's."""
    removed = []
    for name in WRITTEN_FILES:
        for tmp in out.glob(f".{name}.*.tmp"):
            with contextlib.suppress(OSError):
                if tmp.is_file() and not tmp.is_symlink():
                    tmp.unlink()
                    removed.append(tmp)
    return removed


class RunLock:
    """Hold ``out``'s training lock for a ``with`` block (see the module docstring); the lock
    file goes when the block ends (:func:`detloader._system.locks.locked`). Taking it removes
    the temporary files of writes that died (:func:`remove_temporaries`; ``removed``)."""

    def __init__(self, out: Path) -> None:
        self.out = out
        self.owner = out / ".train.owner.json"
        self._held = contextlib.ExitStack()
        self.removed: list[Path] = []

    def __enter__(self) -> RunLock:
        self.out.mkdir(parents=True, exist_ok=True)
        try:  # before the lock: opening .train.lock would create or truncate the file a link points to
            for name in WRITTEN_FILES:
                refuse_link(self.out / name)
        except NotRegularFileError as err:
            raise RunDirError(f"out={str(self.out)!r} is not safe to write: {err}") from None
        if not self._held.enter_context(locked(self.out / ".train.lock", wait=False, remove=True)):
            self._held.close()
            raise RunDirError(
                f"out={str(self.out)!r} is in use by another training ({self._holder()}); "
                "wait for it to end or choose another --out"
            )
        try:
            if self.owner.exists():  # its process ended without releasing: it died
                warnings.warn(
                    f"{self.out}: took over the lock of a training that is no longer running ({self._holder()})",
                    DetloaderRuntimeWarning, stacklevel=3,
                )
            mine = {"pid": os.getpid(), "host": socket.gethostname(), "started": time.strftime("%Y-%m-%d %H:%M:%S")}
            write_file(self.owner, json.dumps(mine), durable=True, no_follow=True)
            self.removed = remove_temporaries(self.out)
        except BaseException:
            self._held.close()
            raise
        return self

    def _holder(self) -> str:
        try:
            who = json.loads(self.owner.read_text(encoding="utf-8"))
            return f"pid {who['pid']} on {who['host']}, since {who['started']}"
        except (OSError, ValueError, KeyError, TypeError):
            return "holder unknown"

    def __exit__(self, *exc: Any) -> None:
        try:
            self.owner.unlink(missing_ok=True)
        finally:
            self._held.close()


# -- the data a run was trained on -------------------------------------------------------------
def _digest(*parts: Any) -> str:
    h = hashlib.blake2b(digest_size=8)
    for part in parts:
        h.update(part.encode() if isinstance(part, str) else np.ascontiguousarray(part).tobytes())
    return h.hexdigest()


def _split(index: Any, name: str, source: str) -> dict[str, Any]:
    paths = index.image_paths()
    joined = "\n".join(paths)
    return {"name": name, "images": len(paths), "digest": _digest(joined), "source": source, "paths": joined}


def data_record(index: Any, parts: Mapping[str, tuple[Any, str, str]]) -> dict[str, Any]:
    """What a checkpoint records of its data: ``index`` is the whole dataset, ``parts`` maps a
    role (``"train"``, ``"val"``) to (its index, split name, how it was found or made)."""
    pack = index.meta.get("pack")
    return {
        "root": str(pack["url"] if isinstance(pack, Mapping) else index.root),  # a pack: its URL, not this node's cache
        "format": index.meta.get("format", ""),
        "classes": list(index.classes),
        "image_classes": list(index.image_classes),
        "landmarks": list(index.landmark_schema.names),
        "images": len(index),
        "images_digest": _digest("\n".join(index.image_paths())),
        "annotations_digest": _digest(
            index.object_offsets, index.boxes, index.labels, index.difficult, index.landmarks,
            index.visibility, index.image_labels,
        ),
        "splits": {role: _split(sub, name, how) for role, (sub, name, how) in parts.items()},
    }


def data_changes(saved: Mapping[str, Any], now: Mapping[str, Any]) -> list[str]:
    """What differs between two :func:`data_record` results that matters to a resumed run
    (empty: the same data)."""
    changes = []
    for key, what in (("classes", "classes"), ("image_classes", "image classes"), ("landmarks", "landmark names")):
        if list(saved[key]) != list(now[key]):
            changes.append(f"{what} {list(saved[key])} -> {list(now[key])}")
    a, b = saved["splits"]["train"], now["splits"]["train"]
    if a["digest"] != b["digest"]:
        changes.append(
            f"training images: {a['images']} of split {a['name']!r} (digest {a['digest']}) -> "
            f"{b['images']} of split {b['name']!r} (digest {b['digest']})"
        )
    if saved["annotations_digest"] != now["annotations_digest"]:
        changes.append(f"annotations: digest {saved['annotations_digest']} -> {now['annotations_digest']}")
    return changes


def recorded_rows(index: Any, split: Mapping[str, Any]) -> tuple[np.ndarray, int]:
    """Rows of ``index`` holding the images of a recorded split (by path relative to the
    dataset root), and how many of the recorded images ``index`` lacks."""
    wanted = split["paths"].split("\n") if split["paths"] else []
    row = {p: i for i, p in enumerate(index.image_paths())}
    rows = np.asarray([row[p] for p in wanted if p in row], dtype=np.int64)
    return rows, len(wanted) - len(rows)


#: :func:`detloader.read_annotations` keywords that say how the index is built, not what it holds:
#: never taken from a run's recorded options.
BUILD_OPTIONS: tuple[str, ...] = ("workers", "cache", "verify", "progress")


@dataclass(frozen=True)
class RunReadOptions:
    """How to read a dataset for a recorded run (:func:`run_read_options`)."""

    #: the :func:`detloader.read_annotations` keywords to read with
    options: dict[str, Any]
    #: the run's recorded options among them, those not given
    from_run: dict[str, Any]
    #: ``{name: (run's value, given value)}`` of given options that differ from the run's (None: the run had none)
    changed: dict[str, tuple[Any, Any]]


def run_read_options(
    recorded: Mapping[str, Any], given: Mapping[str, Any], defaults: Mapping[str, Any] | None = None
) -> RunReadOptions:
    """The read options of a run's checkpoint (``config["read_options"]``, less :data:`BUILD_OPTIONS`)
    with ``given`` in their place where given, and ``defaults`` where neither has one (the CLI's
    ``on_error="warn"``): a run trained with ``images_by="id"`` is evaluated or resumed with it
    unless told otherwise (``detloader evaluate``, ``train --resume``)."""
    kept = {k: v for k, v in recorded.items() if k not in BUILD_OPTIONS}
    return RunReadOptions(
        options={**(defaults or {}), **kept, **given},
        from_run={k: v for k, v in kept.items() if k not in given},
        changed=read_option_changes(kept, {**kept, **given}),
    )


def read_option_changes(run: Mapping[str, Any], now: Mapping[str, Any]) -> dict[str, tuple[Any, Any]]:
    """``{name: (run's value, now)}`` of the read options (less :data:`BUILD_OPTIONS`) that differ
    between a run's recorded ones and ``now``; None where one has no value."""
    names = [k for k in {**run, **now} if k not in BUILD_OPTIONS]
    return {k: (run.get(k), now.get(k)) for k in names if run.get(k) != now.get(k)}


def describe_read_changes(changes: Mapping[str, tuple[Any, Any]]) -> str:
    """``images_by 'id' -> 'name', image_dir not set -> 'imgs'``."""
    def shown(value: Any) -> str:
        return "not set" if value is None else repr(value)

    return ", ".join(f"{k} {shown(run)} -> {shown(now)}" for k, (run, now) in changes.items())


# -- reading it ---------------------------------------------------------------------------------
def _synthetic_root(config: TrainConfig, env: DistEnv) -> Path:
    """The synthetic dataset in ``out/synthetic``, written by rank 0 once per parameters."""
    from detloader.annotations.synth import make_synthetic

    root = config.out_dir / "synthetic"
    stamp = root / "detloader-synthetic.json"
    params = {"images": config.synthetic_images, "seed": config.synthetic_seed}
    if env.is_main:
        current = json.loads(stamp.read_text()) if stamp.is_file() else None
        if current != params:
            make_synthetic(root, config.synthetic_images, seed=config.synthetic_seed)
            write_file(stamp, json.dumps(params), no_follow=True)
    barrier(env)
    return root


@dataclass(frozen=True)
class RunData:
    """A run's training and validation indexes, and what checkpoints record of the data
    (:func:`detloader.train.run_data.data_record`)."""

    train: Any
    val: Any
    record: dict[str, Any]
    #: :func:`detloader.loader.auto.dataset_hash` of the whole dataset: what ``detloader tune`` files it under
    data_hash: str = ""

    def split_info(self, role: str) -> dict[str, Any]:
        """``{"name", "images", "source"}`` of the ``"train"`` or ``"val"`` part."""
        return {k: self.record["splits"][role][k] for k in ("name", "images", "source")}


def prepare_data(config: TrainConfig, env: DistEnv | None = None) -> RunData:
    """The configured dataset's training and validation parts; rank 0 builds the index
    cache first, the other ranks then read it.

    The dataset's ``train_split`` and ``val_split`` when it has both and the val split has an
    image outside the training part; otherwise a seeded 80/20 split, stratified by each image's
    rarest class, of its ``train_split`` or, without one, of every image outside a ``test``
    split. No image is in both parts and an image of a ``test`` split is never trained on
    (the index keeps its train / val / test splits apart already; this also holds for other
    names, such as ``trainval``): one the training split also lists leaves the validation
    part, a test image leaves the training part, and the source recorded for a part says how
    many did."""
    import detloader
    from detloader.annotations.splits import split_role

    env = env or init_distributed("cpu")
    # a URL (a pack on an object store) stays a string: Path() would fold its '//'
    root = config.data if config.data is not None else _synthetic_root(config, env)
    options = dict(config.read_options)
    if env.is_main:
        index = detloader.read_annotations(root, **options)
    barrier(env)
    if not env.is_main:
        index = detloader.read_annotations(root, **options)
    t, v = config.train_split, config.val_split
    found = index.meta.get("split_sources", {})
    held = [n for n in index.splits if split_role(n) == "test" and n not in (t, v)]
    test_ids = np.unique(np.concatenate([index.splits[n] for n in held])) if held else np.zeros(0, np.int64)
    kept_out = ""
    if t in index.splits:
        train_ids = index.splits[t][~np.isin(index.splits[t], test_ids)]
        dropped = len(index.splits[t]) - len(train_ids)
        kept_out = f"; {dropped} of its images also in split {held[0]!r} left out" if dropped else ""
    both = t in index.splits and v in index.splits
    val_ids = np.setdiff1d(index.splits[v], train_ids) if both else np.zeros(0, np.int64)
    if len(val_ids):
        shared = len(index.splits[v]) - len(val_ids)
        also = f"; {shared} of its images also in split {t!r} left out" if shared else ""
        parts = {
            "train": (index.subset(train_ids), t, found.get(t, "split file") + kept_out),
            "val": (index.subset(val_ids), v, found.get(v, "split file") + also),
        }
    else:
        if t in index.splits:
            never = f"; split {held[0]!r}, {len(test_ids)} images, never trained on" if held else ""
            pool, what = index.subset(train_ids), f"split {t!r} ({found.get(t, 'split file')}{kept_out}{never})"
        else:
            pool, what = index.subset(np.setdiff1d(np.arange(len(index)), test_ids)), "every image"
            what += f" outside split {held[0]!r} ({len(test_ids)} images, never trained on)" if held else ""
        cut = pool.random_split({t: 0.8, v: 0.2}, seed=config.seed, stratify="class")
        why = f"the dataset has no {v!r} split"
        if both:
            why = f"the dataset's {v!r} split has no image outside split {t!r}: {found.get(v, 'split file')}"
        how = f"random 80/20 of {what} (seed {config.seed}, stratified by class; {why})"
        parts = {"train": (cut[t], t, how), "val": (cut[v], v, how)}
    if not len(parts["train"][0]):
        raise DetloaderValueError(f"{root}: no image to train on in split {t!r}: {parts['train'][2]}")
    from detloader.loader.auto import dataset_hash

    return RunData(parts["train"][0], parts["val"][0], data_record(index, parts), dataset_hash(index))


# -- the loader it trains with ------------------------------------------------------------------
def train_transform(size: int, affine: bool = False, hflip: float = 0.5) -> Any:
    """Training augmentation: horizontal flip with probability ``hflip`` (left/right landmarks and
    mirror classes swapped, images of one-sided classes kept as they are; 0: none), colour jitter,
    with ``affine`` a random scale (0.5-1.5) and translation (10 %), letterbox to ``size``."""
    from detloader.transforms import ColorJitter, Compose, RandomAffine, RandomHorizontalFlip, Resize

    flip = [RandomHorizontalFlip(hflip)] if hflip > 0 else []
    geometric = [*flip, *([RandomAffine(translate=0.1, scale=(0.5, 1.5))] if affine else [])]
    return Compose([*geometric, ColorJitter(), Resize(size, mode="letterbox")])


def _ignore_stop_signals(worker_id: int) -> None:
    """``worker_init_fn`` of the training loader: a SIGTERM or SIGINT sent to the whole
    process group (a scheduler, Ctrl-C) leaves the workers to the main process, which
    finishes its step, saves, and then ends them itself."""
    for s in (signal.SIGTERM, signal.SIGINT):
        signal.signal(s, signal.SIG_IGN)


def balanced_loader(
    dataset: Any, *, balance: str = NO_BALANCE, balance_by: Any = "class", seed: int = 0, **loader_kwargs: Any
) -> Any:
    """A :class:`detloader.ResumableLoader` that is distributed (rank and world size from
    ``torch.distributed``) and resumable whatever ``balance`` is: ``"none"`` is a seeded
    shuffle (``DistributedSamplerWrapper(RandomSampler)``), anything else
    ``make_loader(balance=...)``. ``loader_kwargs`` go to :func:`detloader.make_loader`."""
    import detloader

    if balance == NO_BALANCE and loader_kwargs.get("mosaic"):  # a resumable shuffle that mosaic can draw from
        loader = detloader.make_loader(dataset, shuffle=True, seed=seed, **loader_kwargs)
    elif balance == NO_BALANCE:
        from torch.utils.data import RandomSampler

        shuffle = detloader.DistributedSamplerWrapper(RandomSampler(dataset), seed=seed)
        loader = detloader.make_loader(dataset, sampler=shuffle, seed=seed, **loader_kwargs)
    else:
        loader = detloader.make_loader(dataset, balance=balance, balance_by=balance_by, seed=seed, **loader_kwargs)
    return detloader.ResumableLoader(loader)


def train_loader(config: TrainConfig, index: Any, env: DistEnv, data_hash: str = "") -> Any:
    """The training loader of a run: its dataset (:func:`train_transform`, mosaic, the store of
    ``config.cache``) behind :func:`balanced_loader`, full batches on every rank, workers that leave stop
    signals to the loop, with the settings of :func:`~detloader.train.run_data.choose_loader`
    (``data_hash``: :attr:`RunData.data_hash`); what was chosen and why is its ``choice``."""
    import detloader
    from detloader.dataset.store import cache_size_from
    from detloader.train.run_data import choose_loader

    transform = train_transform(config.size, config.affine, config.hflip)
    # the store holds each image at the letterbox's content size; past a random affine, at the longer side --size
    size = None
    if config.cache is not None:  # decided here once: the dataset takes it as given
        fixed = cache_size_from(transform)
        size = fixed if fixed is not None else config.size
    dataset = detloader.DetectionDataset(
        index, transform, seed=config.seed, on_decode_error=config.on_decode_error,  # type: ignore[arg-type]
        flip_pairs=config.flip_pairs, class_flip_pairs=config.class_flip_pairs,
        cache=config.cache, cache_size=size,  # type: ignore[arg-type]
    )
    mix: dict[str, Any] = {}
    if config.mosaic:  # partners from the sampler's own stream; off for the last close_mosaic epochs
        from detloader.transforms import Mosaic

        mix["mosaic"] = Mosaic(config.mosaic, epochs=max(config.epochs - config.close_mosaic, 0))
    pin = env.device.type == "cuda"
    choice = choose_loader(dataset, data_hash, config.num_workers, config.batch_size, pin, config.data)
    loader = balanced_loader(
        dataset, balance=config.balance, balance_by=config.balance_by, seed=config.seed, batch_size=config.batch_size,
        **mix, **choice.kwargs, pin_memory=pin,
        drop_last=True,  # equal, full steps on every rank
        worker_init_fn=_ignore_stop_signals,
    )
    loader.choice = choice
    return loader


@dataclass(frozen=True)
class LoaderChoice:
    """``kwargs`` for ``make_loader`` (``num_workers``, ``decode_threads`` and, with workers,
    ``prefetch_factor`` and ``persistent_workers``; ``pin_memory`` is the run's device's) and
    ``line``: what was chosen and why, in one line (``"loader: num_workers=2, ...: ..."``)."""

    kwargs: dict[str, Any]
    line: str


def _settings(kwargs: dict[str, Any], pin: bool) -> str:
    threads = kwargs.get("decode_threads") or 0
    return (f"loader: num_workers={kwargs['num_workers']}" + (f", decode_threads={threads}" if threads else "")
            + f", pin_memory={pin}")


def choose_loader(dataset: Any, data_hash: str, num_workers: int | str, batch_size: int, pin: bool,
                  data: str | None = None) -> LoaderChoice:
    """The loader settings of a run training on ``dataset`` (its training part) at ``batch_size``;
    ``data_hash``: :func:`detloader.loader.auto.dataset_hash` of the whole dataset (what ``detloader
    tune`` files its result under); ``num_workers``: the run's setting (an int is taken as it is;
    ``"auto"`` is :func:`detloader.loader.auto.auto_settings`'s, as ``make_loader``'s is); ``pin``:
    whether batches are pinned; ``data``: the dataset path the line names."""
    from detloader.loader.auto import auto_settings

    if num_workers != "auto":
        kwargs: dict[str, Any] = {"num_workers": int(num_workers)}
        return LoaderChoice(kwargs, f"{_settings(kwargs, pin)}: set by num_workers={num_workers}")
    auto = auto_settings(dataset, batch_size, data_hash=data_hash)
    kwargs = dict(auto.kwargs)
    kwargs.pop("pin_memory", None)
    result, check = auto.result, auto.load
    if result is not None and check is not None:
        kwargs["decode_threads"] = kwargs["decode_threads"] if kwargs["num_workers"] == 0 else 0
        rate = result.images_per_s
        when = f" of {result.created[:10]}" if result.created else ""
        why = (f"the saved tune result{when} for this machine and dataset ({rate:.0f} img/s at batch size "
               f"{result.batch_size})")
        if check.busier and kwargs["num_workers"] != result.recommended.get("num_workers"):
            why += f", capped to the free CPUs: {check.describe()}"
        return LoaderChoice(kwargs, f"{_settings(kwargs, pin)}: {why}")
    usable = _usable()
    where = data if data is not None else "DATA"
    return LoaderChoice(kwargs, f"{_settings(kwargs, pin)}: untuned default for {usable} usable CPUs "
                                f"(`detloader tune {where}` measures this machine)")


def _usable() -> int:
    from detloader import _system

    return _system.usable_cpus()
