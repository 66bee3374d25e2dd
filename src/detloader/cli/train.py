"""``detloader train [PATH]``: the reference multi-task model on any dataset detloader reads
(no PATH: the embedded synthetic dataset), with class balancing, a tuned loader, checkpoints,
exact ``--resume``, the data-wait share of step time, and a final evaluation.

The same command runs distributed under ``torchrun --nproc_per_node=N`` (see
docs/training.md).
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

from detloader.cli._common import add_read_arguments, console, dataset_kwargs, print_json


def _workers(value: str) -> int | str:
    if value == "auto":
        return value
    try:
        return int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"num-workers={value!r} must be an int >= 0 or 'auto'") from None


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("train", help="train the reference detection + landmark + image-class model")
    add_read_arguments(
        p, path_nargs="?", path_help="dataset folder or annotation file (default: the synthetic dataset)", build=False
    )
    p.add_argument(
        "--balance",
        default=None,
        help="none, inverse, sqrt, power:P, effective[:BETA], repeat_factor[:T], class_aware (default: none)",
    )
    p.add_argument("--balance-by", default="class", help="class (default), image_class, attribute:NAME")
    p.add_argument("--epochs", type=int, help="epochs (default 20)")
    p.add_argument("--size", type=int, help="letterbox side, a multiple of 32 (default 128)")
    p.add_argument("--batch-size", type=int, help="images per step and process (default 16)")
    p.add_argument("--lr", type=float, help="AdamW learning rate")
    p.add_argument("--width", type=int, help="channels of the first backbone stage (default 16)")
    p.add_argument("--num-workers", type=_workers, default="auto", help="loader workers or 'auto' (default)")
    p.add_argument("--device", default="auto", choices=("auto", "cpu", "cuda"))
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--landmark-loss", choices=("l1", "wing"), default="l1")
    p.add_argument("--mosaic", type=float, help="share of training samples that are 4-image mosaics (default 0)")
    p.add_argument("--close-mosaic", type=int, help="no mosaic in the last N epochs (default 2)")
    p.add_argument("--affine", action="store_true", help="random scale and translation of training images")
    p.add_argument("--synthetic-images", type=int, help="images of the synthetic dataset (default 400)")
    p.add_argument("--checkpoint-every", type=int, default=0, help="also save every N steps (default: epoch ends)")
    p.add_argument(
        "--max-steps", type=int, help="stop once the run has made N steps in all, with a checkpoint (as if killed)"
    )
    p.add_argument("--resume", metavar="CKPT", help="continue from this checkpoint (mid-epoch, exactly)")
    p.add_argument("--allow-data-change", action="store_true", help="resume even on data other than the checkpoint's")
    p.add_argument("--out", help="run folder: checkpoints, metrics.json, config.json, predictions.png "
                   "(default: runs/train, or the --resume checkpoint's folder)")
    p.add_argument("--exist-ok", action="store_true", help="write into an --out that holds another run, overwriting it")
    p.add_argument("--no-eval", action="store_true", help="skip the final evaluation")
    p.add_argument("--json", action="store_true", help="print the metrics as one JSON object")
    p.set_defaults(func=run)


def _config(args: argparse.Namespace) -> Any:
    from detloader.train import TrainConfig

    changes: dict[str, Any] = {}
    if args.resume:  # the run's own settings, unless given again
        from detloader.train import load_checkpoint

        saved = dict(load_checkpoint(args.resume)["config"])
        for key in ("resume", "max_steps", "exist_ok", "allow_data_change"):  # this invocation's, not the run's
            saved.pop(key, None)
        changes.update(saved)
    read_options: dict[str, Any] = dict(changes.get("read_options", {}))
    if args.path is not None:
        changes["data"] = args.path
        read_options.update(dataset_kwargs(args))
    changes["read_options"] = read_options
    explicit = {
        "balance": args.balance,
        "epochs": args.epochs,
        "size": args.size,
        "batch_size": args.batch_size,
        "lr": args.lr,
        "width": args.width,
        "synthetic_images": args.synthetic_images,
        "max_steps": args.max_steps,
        "mosaic": args.mosaic,
        "close_mosaic": args.close_mosaic,
        "affine": args.affine or None,
    }
    changes.update({k: v for k, v in explicit.items() if v is not None})
    if not args.resume:
        changes.update(balance_by=tuple(args.balance_by.split(",")) if "," in args.balance_by else args.balance_by,
                       seed=args.seed, landmark_loss=args.landmark_loss)
    out = args.out or ((os.path.dirname(args.resume) or ".") if args.resume else "runs/train")
    changes.update(
        out=out, device=args.device, num_workers=args.num_workers, resume=args.resume,
        checkpoint_every=args.checkpoint_every, evaluate=not args.no_eval, exist_ok=args.exist_ok,
        allow_data_change=args.allow_data_change,
    )
    return TrainConfig.from_dict(changes)


class _Progress:
    """A rich progress bar with the loss parts (stderr, interactive terminals only) and one
    line per epoch with the data-wait share, on rank 0."""

    def __init__(self, enabled: bool) -> None:
        self.out = console()
        self.bar = None
        self.task = None
        if enabled and sys.stderr.isatty():
            from rich.console import Console
            from rich.progress import (
                BarColumn,
                MofNCompleteColumn,
                Progress,
                TextColumn,
                TimeElapsedColumn,
            )

            self.bar = Progress(
                TextColumn("epoch {task.fields[epoch]}"), BarColumn(), MofNCompleteColumn(),
                TimeElapsedColumn(), TextColumn("{task.fields[losses]}"),
                console=Console(stderr=True), transient=True,
            )
        self.enabled = enabled

    def __enter__(self) -> _Progress:
        if self.bar is not None:
            self.bar.__enter__()
            self.task = self.bar.add_task("train", total=None, epoch=0, losses="")
        return self

    def __exit__(self, *exc: Any) -> None:
        if self.bar is not None:
            self.bar.__exit__(*exc)

    def step(self, info: Any) -> None:
        if self.bar is None or info.rank != 0:
            return
        parts = " ".join(f"{k} {v:.3f}" for k, v in info.losses.items())
        self.bar.update(
            self.task, completed=info.step_in_epoch, total=info.steps_in_epoch, epoch=info.epoch, losses=parts
        )

    def start(self, info: Any) -> None:
        if not self.enabled or info.rank != 0:
            return
        t, v = info.train, info.val
        self.out.print(f"training on split {t['name']!r}: {t['images']} images ({t['source']})")
        self.out.print(f"validating on split {v['name']!r}: {v['images']} images ({v['source']})")
        if v["source"].startswith("random"):
            self.out.print("recorded in the checkpoint, which evaluate uses; `detloader split PATH --val 0.2` "
                           "writes splits beside the data for every command and script")
        if info.start_step:
            self.out.print(f"resuming at step {info.start_step} of {info.total_steps}")

    def epoch(self, info: Any) -> None:
        if not self.enabled or info.rank != 0:
            return
        parts = ", ".join(f"{k} {v:.3f}" for k, v in info.losses.items() if k != "total")
        self.out.print(
            f"epoch {info.epoch + 1}/{info.epochs}: loss {info.losses.get('total', 0):.3f} ({parts}); "
            f"data wait {100 * info.data_wait_fraction:.1f} % of step time"
        )


def run(args: argparse.Namespace) -> int:
    import warnings

    from detloader.train import train

    config = _config(args)
    rank0 = int(os.environ.get("RANK", "0")) == 0
    show = rank0 and not args.json
    with warnings.catch_warnings():
        if not show:
            warnings.simplefilter("ignore")
        with _Progress(show) as progress:
            metrics = train(config, on_step=progress.step, on_epoch=progress.epoch, on_start=progress.start)
    import signal

    status = 128 + signal.Signals[metrics["stopped_by"]] if metrics.get("stopped_by") else 0
    if not rank0:
        return status
    if args.json:
        print_json(metrics)
        return status
    from detloader.cli.evaluate import print_metrics

    print_metrics(metrics)
    out = console()
    if metrics.get("stopped_early"):
        why = metrics["stopped_by"] or "--max-steps"
        out.print(f"stopped by {why} after step {metrics['steps']}; continue with --resume {config.out}/last.pt")
    out.print(f"{config.out}/: last.pt, metrics.json, config.json ({metrics['train_seconds']:.0f} s of training)")
    return status

