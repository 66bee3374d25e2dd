"""``detloader demo``: the whole pipeline on the embedded synthetic dataset."""

from __future__ import annotations

import argparse
import time
from pathlib import Path


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("demo", help="run the pipeline on the synthetic dataset (no download)")
    p.add_argument("--out", default="demo-data", help="where the synthetic dataset goes (default: demo-data)")
    p.add_argument("--images", type=int, default=200)
    p.add_argument("--seed", type=int, default=0)
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
    out.print(f"{args.images} images with 5 face landmarks each object -> {root} ({time.perf_counter() - t:.2f} s)")

    out.rule("2. index (cold build, then warm reload from the cache)")
    t = time.perf_counter()
    index = read_annotations(root, cache="rebuild")
    cold = time.perf_counter() - t
    t = time.perf_counter()
    index = read_annotations(root)
    warm = time.perf_counter() - t
    out.print(f"cold {cold * 1000:.0f} ms, warm {warm * 1000:.1f} ms ({cold / max(warm, 1e-9):.0f}x) <- {index._source_file}")

    out.rule("3. validate")
    out.print(index.problems.summary())

    out.rule("4. summary")
    print_summary(index.summary())
    return 0
