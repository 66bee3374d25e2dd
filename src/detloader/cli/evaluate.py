"""``detloader evaluate CKPT PATH``: box mAP, per-class precision / recall / AP, landmark NME
and image-class accuracy of a training checkpoint on a dataset split."""

from __future__ import annotations

import argparse
from typing import Any

from detloader.cli._common import (
    add_read_arguments,
    console,
    dataset_kwargs,
    print_json,
    print_table,
    progress_bar,
)


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("evaluate", help="metrics of a training checkpoint on a dataset (mAP, NME, image class)")
    p.add_argument("checkpoint", help="a *.pt file written by detloader train")
    add_read_arguments(p, path_help="dataset folder or annotation file (any format detloader reads)", build=False)
    p.add_argument("--split", help="a split of the dataset, or 'all' (default: the checkpoint's validation split)")
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--device", default="auto", choices=("auto", "cpu", "cuda"))
    p.add_argument(
        "--score-threshold", type=float, default=0.3, help="operating point of precision / recall (default 0.3)"
    )
    p.add_argument("--backend", default="auto", choices=("auto", "faster_coco_eval", "pycocotools"))
    p.add_argument(
        "--coco-json", metavar="PATH", help="also write the detections there (COCO results: image id = row + 1)"
    )
    p.add_argument("--json", action="store_true", help="print the metrics as one JSON object")
    p.set_defaults(func=run)


def _fmt(value: Any, percent: bool = False) -> str:
    if value is None:
        return "-"
    return f"{100 * value:.1f}" if percent else f"{value:.3f}"


def print_metrics(metrics: dict[str, Any]) -> None:
    """The per-class table and one line per summary figure."""
    from rich.table import Table
    from rich.text import Text

    out = console()
    if "per_class" in metrics:
        table = Table(title=f"boxes (precision / recall at score >= {metrics['score_threshold']:g}, IoU 0.5)")
        for col in ("class", "objects", "precision", "recall", "AP@0.5", "AP@0.5:0.95"):
            table.add_column(col, justify="left" if col == "class" else "right")
        for name, row in metrics["per_class"].items():
            table.add_row(
                Text(name), str(row["objects"]), _fmt(row["precision"]), _fmt(row["recall"]),
                _fmt(row["ap50"]), _fmt(row["ap50_95"]),
            )
        print_table(out, table)
        split = metrics.get("split") or {}
        if split:
            out.print(f"split {split['name']!r}: {split['images']} images ({split['source']})")
        if metrics.get("seen_in_training"):
            out.print(
                f"[yellow]{metrics['seen_in_training']} of the {metrics['images']} images were trained on: "
                "not a held-out estimate[/yellow]"
            )
        out.print(
            f"box mAP@0.5 {_fmt(metrics['map50'])}, mAP@0.5:0.95 {_fmt(metrics['map50_95'])} "
            f"({metrics['images']} images, {metrics['backend']})"
        )
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


def run(args: argparse.Namespace) -> int:
    import os

    from detloader.train import evaluate_checkpoint

    name = "predictions.png" if args.split is None else f"predictions-{args.split}.png"
    picture = os.path.join(os.path.dirname(args.checkpoint), name)
    with progress_bar("evaluate", enabled=not args.json) as progress:
        metrics = evaluate_checkpoint(
            args.checkpoint,
            args.path,
            split=args.split,
            picture=picture,
            read_options=dataset_kwargs(args),
            batch_size=args.batch_size,
            device=args.device,
            score_threshold=args.score_threshold,
            backend=args.backend,
            progress=progress,
            coco_json=args.coco_json,
        )
    if args.json:
        print_json(metrics)
    else:
        print_metrics(metrics)
        if os.path.isfile(picture):
            console().print(f"{picture}: truth (left) beside predictions (right)")
        if args.coco_json:
            console().print(f"{args.coco_json}: the detections as COCO results")
    return 0

