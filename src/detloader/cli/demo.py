"""``detloader demo``: from a seed to a trained model and its pictures, in a few minutes.

synthesise -> index (cold, then warm from the cache) -> validate -> summary -> balance (objects
per epoch, raw vs balanced) -> pictures of the data (as stored, and augmented) -> tune the
loader for this machine -> one epoch of the balanced loader -> a short balanced training run
(which finds the tuned settings through ``num_workers="auto"``) -> the per-class evaluation
table -> a picture of validation images with the predictions beside the truth. Everything goes under ``--out``.
"""

from __future__ import annotations

import argparse
import time
import warnings
from pathlib import Path
from typing import Any

from detloader.cli._common import console
from detloader.cli.data import print_summary
from detloader.cli.speed import print_result
from detloader.cli.stats import print_balance
from detloader.cli.train import print_metrics
from detloader.errors import DetloaderValueError, TuneWarning


def add_demo(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "demo", help="seed to result on the synthetic dataset: index, stats, tune, train, evaluate, pictures"
    )
    p.add_argument("--out", default="demo", help="folder for the dataset, the run and the pictures (default: demo)")
    p.add_argument("--images", type=int, default=400, help="synthetic images (default: 400)")
    p.add_argument(
        "--epochs", type=int, default=12, help="training epochs (default: 12; about 3 minutes in all on 2 cores)"
    )
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--balance", default="sqrt", help="balancing strategy of the sampler (default: sqrt)")
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--size", type=int, default=128, help="letterbox side of the network input (default: 128)")
    p.add_argument("--tune-budget", type=float, default=12.0, help="seconds for tuning (0: skip)")
    p.set_defaults(func=_demo)


def _demo(args: argparse.Namespace) -> int:
    from detloader.stats import balance_report

    if args.images < 10:
        raise DetloaderValueError(f"--images={args.images} must be >= 10 (a train and a val split)")
    out = console()
    base = Path(args.out)
    root = base / "data"
    began = time.perf_counter()
    index = _synthesise_and_index(out, root, args)

    out.rule("3. validate")
    out.print(index.problems.summary(), markup=False)

    out.rule("4. summary")
    print_summary(index.summary())

    out.rule(f"5. balance ({args.balance}): objects per epoch, raw vs balanced")
    print_balance(balance_report(index, args.balance, seed=args.seed))

    train_index, val_index = index.split("train"), index.split("val")
    dataset = _pictures(out, base, train_index, args)
    if args.tune_budget > 0:
        from detloader import tune_loader

        out.rule(f"7. tune the loader for this machine (budget {args.tune_budget:g} s)")
        # the training run's own dataset, transform and batch size: its num_workers="auto" finds this
        result = tune_loader(dataset, batch_size=args.batch_size, budget_s=args.tune_budget)
        print_result(result, cached=result.from_cache)
    _load_one_epoch(out, dataset, train_index, args)
    config, metrics = _train_run(out, root, base, dataset, args)

    out.rule("10. evaluate on the validation split")
    print_metrics(metrics)
    out.print(f"{config.out}/predictions.png: {min(8, len(val_index))} validation images, "
              "truth (left) beside predictions (right)")
    out.print(f"[bold]done in {time.perf_counter() - began:.0f} s[/bold]")
    return 0


def _synthesise_and_index(out: Any, root: Path, args: argparse.Namespace) -> Any:
    """1. The synthetic dataset in ``root``; 2. its index built cold, then reloaded warm from
    the cache (both timed): the warm index."""
    from detloader import read_annotations
    from detloader.annotations.synth import make_synthetic

    out.rule("1. synthesise")
    t = time.perf_counter()
    make_synthetic(root, args.images, seed=args.seed)
    out.print(
        f"{args.images} images of faces (5 landmarks each, classes ~90/8/2 %) in VOC layout -> "
        f"{root} ({time.perf_counter() - t:.2f} s)"
    )

    out.rule("2. index (cold build, then warm reload from the cache)")
    t = time.perf_counter()
    index = read_annotations(root, cache="rebuild")
    cold = time.perf_counter() - t
    t = time.perf_counter()
    index = read_annotations(root)
    warm = time.perf_counter() - t
    out.print(f"cold {cold * 1000:.0f} ms, warm {warm * 1000:.1f} ms ({cold / max(warm, 1e-9):.0f}x)")
    out.print(f"cache: {index.source_file}")
    return index


def _pictures(out: Any, base: Path, train_index: Any, args: argparse.Namespace) -> Any:
    """6. ``data.png`` and ``augmented.png`` under ``base``: the training split as stored and as
    training sees it; the training dataset (with the training transform) that shows it."""
    from detloader import DetectionDataset
    from detloader.stats.show import show_dataset
    from detloader.train.run_data import train_transform

    out.rule("6. look at the data: as stored, and as training sees it (flip, colour, letterbox)")
    dataset = DetectionDataset(train_index, train_transform(args.size), seed=args.seed)
    for name, data, after in (("data.png", train_index, False), ("augmented.png", dataset, True)):
        grid = show_dataset(data, base / name, n=16, after_transform=after, seed=args.seed)
        out.print(f"{grid.path}: {len(grid.image_ids)} images, {grid.image.size[0]}x{grid.image.size[1]} pixels")
    return dataset


def _load_one_epoch(out: Any, dataset: Any, train_index: Any, args: argparse.Namespace) -> None:
    """8. One epoch of the balanced loader with ``num_workers="auto"``: its settings, the first
    batch's shapes, and the rarest class's share of the objects loaded against the data's."""
    from detloader import make_loader

    out.rule("8. load: one epoch of balanced, augmented batches with the tuned settings")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", TuneWarning)  # tuning skipped: the heuristic is fine here
        loader = make_loader(dataset, batch_size=args.batch_size, balance=args.balance, num_workers="auto",
                             seed=args.seed)
    out.print(f"make_loader(num_workers='auto') -> num_workers={loader.num_workers}, "
              f"pin_memory={loader.pin_memory}, sampler={type(loader.sampler).__name__}")
    counts = train_index.class_counts()
    rare_name = min(counts, key=counts.get)
    rare = train_index.classes.index(rare_name)
    t, images, objects, rare_objects = time.perf_counter(), 0, 0, 0
    for step, batch in enumerate(loader):
        images, objects = images + len(batch), objects + len(batch.labels)
        rare_objects += int((batch.labels == rare).sum())
        if step == 0:
            out.print(f"batch 0: images {tuple(batch.images.shape)} uint8, boxes {tuple(batch.boxes.shape)}, "
                      f"landmarks {tuple(batch.landmarks.shape)}, visibility {tuple(batch.visibility.shape)}")
    dt = time.perf_counter() - t
    out.print(f"{images} images, {objects} objects ({100 * rare_objects / max(objects, 1):.1f} % '{rare_name}', "
              f"{100 * counts[rare_name] / max(train_index.num_objects, 1):.1f} % in the data) in {dt:.2f} s "
              f"= {images / max(dt, 1e-9):.0f} images/s")
    del loader


def _train_run(out: Any, root: Path, base: Path, dataset: Any, args: argparse.Namespace) -> tuple[Any, dict[str, Any]]:
    """9. The balanced training run in ``base/run`` (``num_workers="auto"``, said with its
    reason), a line per epoch: its config and metrics."""
    from detloader.train import TrainConfig, train
    from detloader.tune import auto_loader_kwargs

    out.rule(f"9. train: {args.epochs} epochs, balance={args.balance}")
    config = TrainConfig(
        data=str(root), out=str(base / "run"), epochs=args.epochs, balance=args.balance,
        batch_size=args.batch_size, size=args.size, seed=args.seed, num_workers="auto", exist_ok=True,
    )

    def epoch_line(info: Any) -> None:
        out.print(f"epoch {info.epoch + 1}/{info.epochs}: loss {info.losses.get('total', 0):.3f}; "
                  f"data wait {100 * info.data_wait_fraction:.1f} % of step time")

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        _, reason = auto_loader_kwargs(dataset, args.batch_size, warn=False)
        out.print(f"training loader, num_workers='auto': {reason}")
        metrics = train(config, on_epoch=epoch_line)
    out.print(f"{config.out}/: last.pt, metrics.json ({metrics['train_seconds']:.0f} s of training, "
              f"num_workers={metrics.get('num_workers')})")
    return config, metrics
