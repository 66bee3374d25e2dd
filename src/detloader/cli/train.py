"""``detloader train [PATH]``: the reference multi-task model on any dataset detloader reads
(no PATH: the embedded synthetic dataset), with class balancing, a tuned loader, checkpoints,
exact ``--resume``, the data-wait share of step time, each step's progress (:class:`StepProgress`),
and a final evaluation; under ``torchrun --nproc_per_node=N`` it runs distributed (docs/training.md).

``detloader evaluate CKPT PATH``: box mAP, per-class precision / recall / AP, landmark NME and
image-class accuracy of a training checkpoint on a dataset split.

Both read the dataset of a checkpoint's run (``evaluate``, ``--resume``) with the read options the run
recorded, unless given, and say which in one line (:func:`read_option_lines`).
"""

from __future__ import annotations

import argparse
import os
import signal
import time
import warnings
from collections.abc import Callable, Mapping
from contextlib import nullcontext
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from detloader.cli._common import (
    ON_ERROR_DEFAULT,
    add_read_arguments,
    console,
    count_table,
    dataset_kwargs,
    print_json,
    print_table,
    progress_bar,
    read_option_flags,
)

if TYPE_CHECKING:
    from rich.console import Console

    from detloader.train import StepInfo
    from detloader.train.run_data import RunReadOptions

#: Not on a terminal, a progress line at least this often (seconds), whatever ``--log-every``.
LOG_SECONDS = 30.0
#: ``--log-every``'s default: a progress line every this many steps (not on a terminal).
LOG_EVERY = 50


def _workers(value: str) -> int | str:
    """``--num-workers`` as typed: an int where it is one, else the text (``"auto"``); TrainConfig checks it."""
    try:
        return int(value)
    except ValueError:
        return value


def _pairs(value: str) -> list[tuple[str, str]]:
    """``A=B,C=D`` as name pairs; ``none`` as no pair."""
    if value.strip().lower() == "none":
        return []
    pairs = [item.partition("=") for item in value.split(",") if item.strip()]
    if not pairs or any(not a.strip() or not sep or not b.strip() for a, sep, b in pairs):
        raise argparse.ArgumentTypeError(f"{value!r} is not A=B[,C=D...] or 'none'")
    return [(a.strip(), b.strip()) for a, _, b in pairs]


def add_train(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("train", help="train the reference detection + landmark + image-class model")
    add_read_arguments(
        p, path_nargs="?", path_help="dataset folder or annotation file (default: the synthetic dataset)", build=False
    )
    p.add_argument(
        "--balance",
        help="none, inverse, sqrt, power:P, effective[:BETA], repeat_factor[:T], class_aware (default: none)",
    )
    p.add_argument("--balance-by", default="class", help="class (default), image_class, attribute:NAME")
    p.add_argument("--epochs", type=int, help="epochs (default 20)")
    p.add_argument("--size", type=int, help="letterbox side, a multiple of 32 (default 128)")
    p.add_argument("--batch-size", type=int, help="images per step and process (default 16)")
    p.add_argument("--lr", type=float, help="AdamW learning rate")
    p.add_argument("--warmup-steps", type=int, help="steps of linear learning-rate warm-up (default 50)")
    p.add_argument("--no-amp", action="store_true", help="no mixed precision on CUDA (float32 throughout)")
    p.add_argument("--width", type=int, help="channels of the first backbone stage (default 16)")
    p.add_argument("--num-workers", type=_workers, default="auto", help="loader workers or 'auto' (default)")
    p.add_argument(
        "--cache", choices=("disk", "ram"),
        help="decode each training image once into a store beside the index cache (disk) or in /dev/shm (ram) "
        "and read later epochs from it (`detloader cache list` shows the stores, `cache clear` removes them)",
    )
    p.add_argument("--device", default="auto", choices=("auto", "cpu", "cuda"))
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--landmark-loss", choices=("l1", "wing"), default="l1")
    p.add_argument("--mosaic", type=float, help="share of training samples that are 4-image mosaics (default 0)")
    p.add_argument("--close-mosaic", type=int, help="no mosaic in the last N epochs (default 2)")
    p.add_argument("--affine", action="store_true", help="random scale and translation of training images")
    p.add_argument(
        "--hflip", type=float, metavar="P",
        help="horizontal flip probability (default 0.5; 0 turns flipping off): left/right landmarks and "
        "mirror classes swap, images of a one-sided class (redleft without redright) are never mirrored",
    )
    p.add_argument(
        "--flip-pairs", type=_pairs, metavar="A=B,...|none",
        help="landmark pairs a flip swaps, by name, in place of the dataset's; 'none': the points are symmetric",
    )
    p.add_argument(
        "--class-flip-pairs", type=_pairs, metavar="A=B,...|none",
        help="classes a flip swaps (redleft=redright), in place of those found in the class names; "
        "'none': no class has a side",
    )
    p.add_argument("--synthetic-images", type=int, help="images of the synthetic dataset (default 400)")
    p.add_argument(
        "--on-decode-error", choices=("raise", "skip"),
        help="an image that does not decode: stop with its name (raise, the default) or train on a substitute of "
        "the same classes (skip)",
    )
    p.add_argument("--checkpoint-every", type=int, default=0, help="also save every N steps (default: epoch ends)")
    p.add_argument(
        "--max-steps", type=int, help="stop once the run has made N steps in all, with a checkpoint (as if killed)"
    )
    p.add_argument("--resume", metavar="CKPT", help="continue from this checkpoint (mid-epoch, exactly)")
    p.add_argument("--allow-data-change", action="store_true", help="resume even on data other than the checkpoint's")
    p.add_argument(
        "--allow-setting-change", action="store_true",
        help="resume with settings that change the run (batch size, size, seed, balance, augmentation, AMP, loss), "
        "applied from the checkpoint's step on; --lr, --epochs, --warmup-steps are applied without it",
    )
    p.add_argument("--out", help="run folder: checkpoints, metrics.json, config.json, predictions.png "
                   "(default: runs/train, or the --resume checkpoint's folder)")
    p.add_argument("--exist-ok", action="store_true", help="write into an --out that holds another run, overwriting it")
    p.add_argument("--no-eval", action="store_true", help="skip the final evaluation")
    p.add_argument(
        "--log-every", type=int, default=LOG_EVERY, metavar="N",
        help=f"when stdout is not a terminal, a progress line every N steps and at least every {LOG_SECONDS:.0f} s "
        f"(default {LOG_EVERY}); on a terminal a live bar",
    )
    p.add_argument("--json", action="store_true", help="print the metrics as one JSON object")
    p.set_defaults(func=_train)


def _resumed(args: argparse.Namespace) -> tuple[dict[str, Any], RunReadOptions]:
    """The settings the ``--resume`` checkpoint's run recorded (less this call's own) and the
    :class:`~detloader.train.run_data.RunReadOptions` it reads with."""
    from detloader.train import load_checkpoint
    from detloader.train.run_data import run_read_options

    saved = dict(load_checkpoint(args.resume)["config"])
    for key in ("resume", "max_steps", "exist_ok", "allow_data_change", "allow_setting_change"):  # this call's
        saved.pop(key, None)
    return saved, run_read_options(saved.get("read_options", {}), dataset_kwargs(args, given_only=True), _READ_DEFAULTS)


def _config(args: argparse.Namespace, resumed: tuple[dict[str, Any], RunReadOptions] | None = None) -> Any:
    """The run's :class:`TrainConfig`; with ``--resume``, the run's own settings and read options
    (``resumed``: :func:`_resumed`'s, read here when None) unless given again."""
    from detloader.train import TrainConfig

    changes: dict[str, Any] = {}
    if args.resume:
        saved, read = resumed or _resumed(args)
        changes.update(saved, read_options=read.options)
    elif args.path is not None:
        changes["read_options"] = dataset_kwargs(args)
    if args.path is not None:
        changes["data"] = args.path
    explicit = {
        "balance": args.balance, "epochs": args.epochs, "size": args.size, "batch_size": args.batch_size,
        "lr": args.lr, "width": args.width, "synthetic_images": args.synthetic_images, "max_steps": args.max_steps,
        "mosaic": args.mosaic, "close_mosaic": args.close_mosaic, "affine": args.affine or None,
        "hflip": args.hflip, "flip_pairs": args.flip_pairs, "class_flip_pairs": args.class_flip_pairs,
        "warmup_steps": args.warmup_steps, "amp": False if args.no_amp else None,
        "on_decode_error": args.on_decode_error, "cache": args.cache,
    }
    changes.update({k: v for k, v in explicit.items() if v is not None})
    if not args.resume:
        changes.update(balance_by=tuple(args.balance_by.split(",")) if "," in args.balance_by else args.balance_by,
                       seed=args.seed, landmark_loss=args.landmark_loss)
    out = args.out or ((os.path.dirname(args.resume) or ".") if args.resume else "runs/train")
    changes.update(
        out=out, device=args.device, num_workers=args.num_workers, resume=args.resume,
        checkpoint_every=args.checkpoint_every, evaluate=not args.no_eval, exist_ok=args.exist_ok,
        allow_data_change=args.allow_data_change, allow_setting_change=args.allow_setting_change,
    )
    return TrainConfig.from_dict(changes)


#: What the CLI reads with when neither told nor the run recorded one; a run's value equal to it is not worth a line.
_READ_DEFAULTS: dict[str, Any] = {"format": "auto", "on_error": ON_ERROR_DEFAULT}


def read_option_lines(from_run: Mapping[str, Any], changed: Mapping[str, Any]) -> list[str]:
    """The lines ``evaluate`` and ``train --resume`` print about a run's recorded read options
    (:class:`~detloader.train.run_data.RunReadOptions`): those applied (less the CLI's defaults) and
    those given that differ from the run's."""
    applied = {k: v for k, v in from_run.items() if k not in _READ_DEFAULTS or _READ_DEFAULTS[k] != v}
    lines = [f"read options from the run: {read_option_flags(applied)}"] if applied else []
    if changed:
        differ = "; ".join(
            f"{read_option_flags({k: now})} (the run: {read_option_flags({k: run}) if run is not None else 'not set'})"
            for k, (run, now) in changed.items()
        )
        lines.append(f"read options given that differ from the run's: {differ}")
    return lines


def _duration(seconds: float) -> str:
    """``45s``, ``3m10s``, ``2h05m``."""
    s = max(int(round(seconds)), 0)
    if s < 60:
        return f"{s}s"
    m, s = divmod(s, 60)
    return f"{m}m{s:02d}s" if m < 60 else f"{m // 60}h{m % 60:02d}m"


@dataclass(frozen=True)
class StepFigures:
    """The epoch in progress, as the CLI shows it: ``epoch`` counted from 1; ``images_per_s`` over all
    ranks, ``data_share`` (the data wait's share of step time) and ``loss`` (mean total loss) since
    the epoch began (in this process); ``eta_s``: the rest of the epoch at that pace."""

    epoch: int
    epochs: int
    step: int
    steps: int
    images_per_s: float
    data_share: float
    loss: float
    eta_s: float

    def detail(self) -> str:
        """``21.3 img/s data 12% loss 2.341 eta 3m10s``."""
        return (
            f"{self.images_per_s:.1f} img/s data {100 * self.data_share:.0f}% loss {self.loss:.3f} "
            f"eta {_duration(self.eta_s)}"
        )

    def line(self) -> str:
        """``epoch 1/12 step 40/107 37% 21.3 img/s data 12% loss 2.341 eta 3m10s``."""
        done = 100 * self.step / max(self.steps, 1)
        return f"epoch {self.epoch}/{self.epochs} step {self.step}/{self.steps} {done:.0f}% {self.detail()}"


class StepProgress:
    """``detloader train``'s ``on_step``: :class:`StepFigures` of each step, shown on ``out``: a
    live bar per epoch on a terminal; elsewhere (a file, a pipe) a :meth:`StepFigures.line`
    every ``log_every`` steps of an epoch and at least every :data:`LOG_SECONDS`. Use it as a
    context manager (the bar's lifetime); :meth:`epoch_end` hides the bar until the next step."""

    def __init__(
        self, out: Console, epochs: int, log_every: int = LOG_EVERY, world_size: int = 1,
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        self.out, self.epochs, self.log_every, self.world_size, self.clock = out, epochs, log_every, world_size, clock
        self._epoch = -1
        self._sums: dict[str, float] = {}
        self._last_line = clock()
        self._bar: Any = None
        self._task: Any = None

    def __enter__(self) -> StepProgress:
        if self.out.is_terminal:
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn

            self._bar = Progress(
                "[progress.description]{task.description}", BarColumn(), MofNCompleteColumn(),
                TextColumn("{task.fields[detail]}"), console=self.out, transient=True,
            )
            self._bar.start()
            self._task = self._bar.add_task("", total=None, detail="", visible=False)
        return self

    def __exit__(self, *exc: Any) -> None:
        if self._bar is not None:
            self._bar.stop()

    def figures(self, info: StepInfo) -> StepFigures:
        """This step's figures, the epoch's sums updated."""
        now = self.clock()
        if info.epoch != self._epoch:  # the epoch began when its first step here began
            self._epoch = info.epoch
            self._sums = {"began": now - info.wait_s - info.compute_s, "steps": 0, "images": 0, "wait": 0.0,
                          "compute": 0.0, "loss": 0.0}
        sums = self._sums
        sums["steps"] += 1
        sums["images"] += len(info.image_ids) * self.world_size
        sums["wait"] += info.wait_s
        sums["compute"] += info.compute_s
        sums["loss"] += info.losses.get("total", 0.0)
        elapsed = max(now - sums["began"], 1e-9)
        return StepFigures(
            info.epoch + 1, self.epochs, info.step_in_epoch, info.steps_in_epoch, sums["images"] / elapsed,
            sums["wait"] / max(sums["wait"] + sums["compute"], 1e-12), sums["loss"] / sums["steps"],
            (info.steps_in_epoch - info.step_in_epoch) * elapsed / sums["steps"],
        )

    def __call__(self, info: StepInfo) -> None:
        figures = self.figures(info)
        if self._bar is not None:
            self._bar.update(
                self._task, completed=figures.step, total=figures.steps, visible=True,
                description=f"epoch {figures.epoch}/{figures.epochs}", detail=figures.detail(),
            )
            return
        now = self.clock()
        if figures.step % max(self.log_every, 1) == 0 or now - self._last_line >= LOG_SECONDS:
            self.out.print(figures.line(), markup=False)
            self._last_line = now

    def epoch_end(self) -> None:
        if self._bar is not None:
            self._bar.update(self._task, visible=False)
            self._bar.refresh()  # gone before the epoch's line is printed


def _train(args: argparse.Namespace) -> int:
    from detloader.annotations.problems import check_int
    from detloader.train import train

    check_int("--log-every", args.log_every, 1)
    resumed = _resumed(args) if args.resume else None
    config = _config(args, resumed)
    rank0 = int(os.environ.get("RANK", "0")) == 0
    show = rank0 and not args.json  # rank 0 prints its split lines, the steps' progress and a line per epoch
    out = console()
    if show and resumed is not None:
        for line in read_option_lines(resumed[1].from_run, resumed[1].changed):
            out.print(line, markup=False)
    progress = StepProgress(out, config.epochs, args.log_every, int(os.environ.get("WORLD_SIZE", "1")))

    def start(info: Any) -> None:
        t, v = info.train, info.val
        out.print(f"training on split {t['name']!r}: {t['images']} images ({t['source']})")
        out.print(f"validating on split {v['name']!r}: {v['images']} images ({v['source']})")
        if v["source"].startswith("random"):
            out.print("recorded in the checkpoint, which evaluate uses; `detloader split PATH --val 0.2` "
                      "writes splits beside the data for every command and script")
        if info.start_step:
            out.print(f"resuming at step {info.start_step} of {info.total_steps}")
        if info.loader:
            from rich.markup import escape

            out.print(escape(info.loader))

    def epoch(info: Any) -> None:
        progress.epoch_end()
        parts = ", ".join(f"{k} {v:.3f}" for k, v in info.losses.items() if k != "total")
        out.print(
            f"epoch {info.epoch + 1}/{info.epochs}: loss {info.losses.get('total', 0):.3f} ({parts}); "
            f"data wait {100 * info.data_wait_fraction:.1f} % of step time"
        )

    with warnings.catch_warnings(), progress if show else nullcontext():
        if not show:
            warnings.simplefilter("ignore")
        metrics = train(config, **({"on_step": progress, "on_epoch": epoch, "on_start": start} if show else {}))
    status = 128 + signal.Signals[metrics["stopped_by"]] if metrics.get("stopped_by") else 0
    if not rank0:
        return status
    if args.json:
        print_json(metrics)
        return status
    print_metrics(metrics)
    if metrics.get("stopped_early"):
        why = metrics["stopped_by"] or "--max-steps"
        out.print(f"stopped by {why} after step {metrics['steps']}; continue with --resume {config.out}/last.pt")
    out.print(f"{config.out}/: last.pt, metrics.json, config.json ({metrics['train_seconds']:.0f} s of training)")
    return status


def add_evaluate(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("evaluate", help="metrics of a training checkpoint on a dataset (mAP, NME, image class)")
    p.add_argument("checkpoint", help="a *.pt file written by detloader train")
    add_read_arguments(p, path_help="dataset folder or annotation file (any format detloader reads)", build=False)
    p.add_argument("--split", help="a split of the dataset, or 'all' (default: the checkpoint's validation split)")
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--device", default="auto", choices=("auto", "cpu", "cuda"))
    p.add_argument(
        "--score-threshold", type=float, default=0.3,
        help="operating point: TP / FP / FN counted at score >= this and IoU 0.5 (default 0.3)",
    )
    p.add_argument("--backend", default="auto", choices=("auto", "faster_coco_eval", "pycocotools"))
    p.add_argument(
        "--protocol", default="auto", choices=("auto", "coco", "lvis", "openimages"),
        help="how boxes are scored: lvis (federated: at most 300 detections per image, classes checked per image), "
        "openimages (the challenge's AP@0.5: class hierarchy, verified labels, group-of boxes) or coco; auto: "
        "the one the annotations are made for",
    )
    p.add_argument(
        "--coco-json", metavar="PATH",
        help="also write the detections there as COCO results, with the dataset's own image and category ids",
    )
    p.add_argument("--json", action="store_true", help="print the metrics as one JSON object")
    p.set_defaults(func=_evaluate)


def _evaluate(args: argparse.Namespace) -> int:
    from detloader.train import evaluate_checkpoint

    name = "predictions.png" if args.split is None else f"predictions-{args.split}.png"
    picture = os.path.join(os.path.dirname(args.checkpoint), name)
    with progress_bar("evaluate", enabled=not args.json) as progress:
        metrics = evaluate_checkpoint(
            args.checkpoint, args.path, split=args.split, picture=picture,
            read_options=dataset_kwargs(args, given_only=True), read_defaults=_READ_DEFAULTS,  # beneath the run's
            batch_size=args.batch_size, device=args.device, score_threshold=args.score_threshold,
            backend=args.backend, progress=progress, coco_json=args.coco_json, protocol=args.protocol,
        )
    if args.json:
        print_json(metrics)
        return 0
    read = metrics.get("read_options", {})
    for line in read_option_lines(read.get("from_run", {}), read.get("changed", {})):
        console().print(line, markup=False)
    print_metrics(metrics)
    if os.path.isfile(picture):
        console().print(f"{picture}: truth (left) beside predictions (right)")
    if args.coco_json:
        console().print(f"{args.coco_json}: the detections as COCO results")
    return 0


def _fmt(value: Any, percent: bool = False) -> str:
    if value is None:
        return "-"
    return f"{100 * value:.1f}" if percent else f"{value:.3f}"


def print_metrics(metrics: dict[str, Any]) -> None:
    """The per-class table and one line per summary figure."""
    out = console()
    if "per_class" in metrics:
        table = count_table(
            f"boxes (TP / FP / FN and precision / recall counted at score >= {metrics['score_threshold']:g}, "
            "IoU 0.5; crowd and difficult objects ignored)",
            ("class", "objects", "ignored", "TP", "FP", "FN", "precision", "recall", "AP@0.5", "AP@0.5:0.95"),
            [
                (name, row["objects"], row.get("ignored", 0), row.get("tp", "-"), row.get("fp", "-"),
                 row.get("fn", "-"), *(_fmt(row[k]) for k in ("precision", "recall", "ap50", "ap50_95")))
                for name, row in metrics["per_class"].items()
            ],
            justify="right",
        )
        print_table(out, table)
        if "tp" in metrics:
            out.print(
                f"all classes: TP {metrics['tp']}, FP {metrics['fp']}, FN {metrics['fn']}, precision "
                f"{_fmt(metrics['precision'])}, recall {_fmt(metrics['recall'])} (score >= "
                f"{metrics['score_threshold']:g}, IoU 0.5)"
            )
        split = metrics.get("split") or {}
        if split:
            out.print(f"split {split['name']!r}: {split['images']} images ({split['source']})")
        if metrics.get("seen_in_training"):
            out.print(
                f"[yellow]{metrics['seen_in_training']} of the {metrics['images']} images were trained on: "
                "not a held-out estimate[/yellow]"
            )
        areas = ", ".join(f"{a} {_fmt(metrics.get('map_' + a))}" for a in ("small", "medium", "large"))
        out.print(
            f"box mAP@0.5 {_fmt(metrics['map50'])}, mAP@0.5:0.95 {_fmt(metrics['map50_95'])}, mAP@0.75 "
            f"{_fmt(metrics.get('map75'))}; by size {areas} ({metrics['images']} images, "
            f"{metrics.get('images_with_predictions', metrics['images'])} with predictions, "
            f"{metrics.get('protocol', 'coco')} protocol, {metrics['backend']})"
        )
        if "frequency_groups" in metrics:
            groups = metrics["frequency_groups"]
            parts = [f"AP{letter} {_fmt(metrics['ap' + letter])} ({groups[name]['scored']} of "
                     f"{groups[name]['classes']} {name} classes)"
                     for letter, name in (("r", "rare"), ("c", "common"), ("f", "frequent"))]
            unranked = groups["without_training_images"]
            out.print(", ".join(parts) + f"; groups from {groups['source']}"
                      + (f", {unranked} classes in none (no training image)" if unranked else ""), markup=False)
        if metrics.get("protocol") == "openimages":
            out.print(f"Open Images protocol: AP@0.5 over the boxes expanded up the class hierarchy, group-of boxes "
                      f"counted once; {metrics['ignored_detections']} detections of classes not verified in their "
                      "image ignored", markup=False)
        if metrics.get("nme") is not None:
            out.print(
                f"landmark NME {_fmt(metrics['nme'])} (normalised by {metrics['nme_normaliser']}, "
                f"{metrics['nme_objects']} matched objects)"
            )
        if metrics.get("image_class_accuracy") is not None:
            recall = ", ".join(f"{k} {_fmt(v)}" for k, v in metrics["image_class_recall"].items())
            out.print(f"image class accuracy {_fmt(metrics['image_class_accuracy'])} (recall: {recall})")
    if "data_wait_fraction" in metrics:
        out.print(
            f"data wait {_fmt(metrics['data_wait_fraction'], percent=True)} % of step time "
            f"(num_workers={metrics.get('num_workers')})"
        )
    if "samples_per_rank" in metrics and metrics.get("world_size", 1) > 1:
        out.print(
            "training samples per rank: "
            + ", ".join(f"rank {r}: {n}" for r, n in enumerate(metrics["samples_per_rank"]))
        )
