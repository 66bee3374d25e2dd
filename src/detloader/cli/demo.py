"""``detloader demo``: the whole pipeline on the embedded synthetic dataset.

synthesise -> index (cold, then warm from the cache) -> validate -> summary -> balance (raw vs
balanced per epoch) -> tune the loader for this machine -> load a few balanced, augmented
batches with the tuned settings.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

__all__ = ["register", "run"]


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("demo", help="run the pipeline on the synthetic dataset (no download)")
    p.add_argument("--out", default="demo-data", help="where the synthetic dataset goes (default: demo-data)")
    p.add_argument("--images", type=int, default=200, help="synthetic images (default: 200)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--balance", default="inverse", help="balancing strategy (default: inverse)")
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--size", type=int, default=256, help="letterbox side of the batches (default: 256)")
    p.add_argument("--tune-budget", type=float, default=12.0, help="seconds for tuning (0: skip)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from detloader import read_annotations
    from detloader.cli._common import console
    from detloader.cli.index import print_summary
    from detloader.synth import make_synthetic

    out = console()
    root = Path(args.out)
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
    out.print(f"cache: {index._source_file}")

    out.rule("3. validate")
    out.print(index.problems.summary())

    out.rule("4. summary")
    print_summary(index.summary())

    out.rule(f"5. balance ({args.balance}): objects per epoch, raw vs balanced")
    from detloader.cli.stats import print_balance
    from detloader.stats import balance_report

    print_balance(balance_report(index, args.balance, seed=args.seed))

    from detloader import DetectionDataset
    from detloader.transforms import ColorJitter, Compose, RandomHorizontalFlip, Resize

    transform = Compose([RandomHorizontalFlip(), ColorJitter(), Resize(args.size, mode="letterbox")])
    dataset = DetectionDataset(index.split("train"), transform, seed=args.seed)

    if args.tune_budget > 0:
        out.rule(f"6. tune the loader for this machine (budget {args.tune_budget:g} s)")
        from detloader import tune_loader
        from detloader.cli.tune import print_result

        result = tune_loader(dataset, batch_size=args.batch_size, budget_s=args.tune_budget)
        print_result(result)

    out.rule("7. load: balanced, augmented batches with the tuned settings")
    import warnings

    from detloader import make_loader, set_epoch
    from detloader.tune import TuneWarning

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", TuneWarning)  # step 6 skipped: the heuristic is fine here
        loader = make_loader(
            dataset,
            batch_size=args.batch_size,
            balance=args.balance,
            num_workers="auto",
            seed=args.seed,
        )
    out.print(
        f"make_loader(num_workers='auto') -> num_workers={loader.num_workers}, "
        f"pin_memory={loader.pin_memory}, sampler={type(loader.sampler).__name__}"
    )
    counts = index.class_counts()
    rare_name = min(counts, key=counts.get)
    rare = index.classes.index(rare_name)
    for epoch in range(2):
        set_epoch(loader, epoch)
        t, images, objects, rare_objects = time.perf_counter(), 0, 0, 0
        for step, batch in enumerate(loader):
            images += len(batch)
            objects += len(batch.labels)
            rare_objects += int((batch.labels == rare).sum())
            if epoch == 0 and step < 2:
                out.print(
                    f"batch {step}: images {tuple(batch.images.shape)} {str(batch.images.dtype).replace('torch.', '')}, "
                    f"boxes {tuple(batch.boxes.shape)}, landmarks {tuple(batch.landmarks.shape)}, "
                    f"visibility {tuple(batch.visibility.shape)}, image labels {batch.image_labels.tolist()[:6]}..."
                )
        dt = time.perf_counter() - t
        out.print(
            f"epoch {epoch}: {images} images, {objects} objects ({100 * rare_objects / max(objects, 1):.1f} % "
            f"'{rare_name}', {100 * counts[rare_name] / max(index.num_objects, 1):.1f} % "
            f"in the data) in {dt:.2f} s = {images / dt:.0f} images/s"
        )
    return 0
