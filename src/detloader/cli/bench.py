"""``detloader bench [PATH]``: loader, index and sampler speed as ratios against baselines
measured in the same run (synthetic data without PATH)."""

from __future__ import annotations

import argparse
import sys

from detloader.cli._common import (
    add_cache_arguments,
    add_dataset_arguments,
    dataset_kwargs,
    print_json,
)


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "bench",
        help="loader / index / sampler speed as ratios against baselines measured in the same run",
    )
    p.add_argument("path", nargs="?", help="a data set (default: synthetic, in a temporary folder)")
    p.add_argument("--size", type=int, help="resize images to SIZE x SIZE (default: 384)")
    p.add_argument("--batch-size", type=int, help="images per batch (default: 16)")
    p.add_argument("--batches", type=int, help="batches timed per setting (default: 20)")
    p.add_argument(
        "--repeats", type=int, help="runs per loader setting, best kept, taken round-robin (default: 2)"
    )
    p.add_argument(
        "--sampler-weights", type=int, help="weights for the sampler section (default: 10,000,000)"
    )
    p.add_argument(
        "--sampler-draws", type=int, help="indices timed from the start of an epoch (default: 1,000,000)"
    )
    p.add_argument(
        "--index-files", type=int, help="synthetic XML files for the index section (default: 5000)"
    )
    p.add_argument(
        "--sections", nargs="+", metavar="SECTION", help="run only these: loader, index, sampler (default: all)"
    )
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    add_dataset_arguments(p)
    add_cache_arguments(p, bench=True)
    p.add_argument(
        "--quick", action="store_true", help="a tiny run that checks every section (figures mean nothing)"
    )
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from detloader.bench import BenchSettings, run_bench

    settings = BenchSettings.make(
        args.quick,
        size=args.size,
        batch_size=args.batch_size,
        batches=args.batches,
        repeats=args.repeats,
        sampler_weights=args.sampler_weights,
        sampler_draws=args.sampler_draws,
        index_files=args.index_files,
        sections=args.sections,
        cache=args.cache,
    )
    progress = None if args.json else (lambda section: print(f"measuring: {section}", file=sys.stderr))
    report = run_bench(args.path, settings, progress, read_options=dataset_kwargs(args))
    if args.json:
        print_json(report.to_dict())
        return 0
    m = report.machine
    print(
        f"{m['cpu']}, {m['usable_cpus']} usable CPUs, {m['memory_gb']} GB; python {m['python']}, "
        f"torch {m['torch']}, numpy {m['numpy']}; load average {m['load_average_start']:.1f} -> "
        f"{m['load_average_end']:.1f}"
    )
    print(report.table())
    return 0
