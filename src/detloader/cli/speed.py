"""The commands that measure this machine: ``tune`` measures the loader on a dataset,
recommends its settings and says why; ``bench`` measures loader, index and sampler speed as
ratios against baselines measured in the same run (synthetic data without PATH)."""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING

from detloader.cli import _common as common
from detloader.errors import DetloaderValueError

if TYPE_CHECKING:
    from detloader.tune import TuneResult


def add_tune(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "tune", help="measure num_workers / pin_memory / prefetch on this machine and explain the choice"
    )
    common.add_read_arguments(p)
    p.add_argument("--batch-size", type=int, default=32, help="images per batch (default: 32)")
    p.add_argument(
        "--size", type=int, default=640,
        help="letterbox images to SIZE x SIZE, as training would (default: 640; 0: no resize)",
    )
    p.add_argument("--budget", type=float, default=60.0, help="seconds for the whole search (default: 60)")
    p.add_argument("--step-time", type=float, help="seconds per training step: also report whether the loader keeps up")
    p.add_argument("--max-workers", type=int, help="try at most this many workers (default: usable CPUs)")
    p.add_argument(
        "--greedy", action="store_true", help="try up to all usable CPUs even when other processes keep some busy"
    )
    p.add_argument("--refresh", action="store_true", help="measure again even if a result is cached")
    p.add_argument("--plot", metavar="PNG", help="save images/s and memory against num_workers")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(func=_tune)


def _tune(args: argparse.Namespace) -> int:
    from detloader.dataset import DetectionDataset
    from detloader.transforms import Resize
    from detloader.tune import tune_loader

    if args.size < 0:
        raise DetloaderValueError(f"--size={args.size} must be >= 0")
    index = common.read_index(args, reports_problems=False, bar=False)
    common.require_images(index, "tune on")
    # the dataset as training would see it: the index and a letterbox resize
    dataset = DetectionDataset(index, Resize(args.size, mode="letterbox") if args.size else None, seed=0)
    with common.progress_bar("tuning (seconds of budget)", enabled=not args.json) as progress:
        result = tune_loader(
            dataset, batch_size=args.batch_size, budget_s=args.budget, step_time=args.step_time,
            max_workers=args.max_workers, respect_busy=not args.greedy,
            cache="refresh" if args.refresh else True, progress=progress,
        )
    if args.plot:
        result.plot(args.plot)
    if args.json:
        common.print_json(result.to_dict())
        return 0
    print_result(result, plot=args.plot, cached=result.from_cache)
    return 0


def print_result(result: TuneResult, plot: str | None = None, cached: bool = False) -> None:
    """What ``detloader tune`` prints: every measured setting, the recommendation and why."""
    from rich.table import Table
    from rich.text import Text

    from detloader.tune.explain import describe_settings

    out = common.console()
    table = Table("setting", "phase", "img/s", "p50 ms", "p95 ms", "main CPU", "wrk CPU", "USS MiB",
                  "PSS MiB", title="measured settings (wait per batch; CPU in cores; memory per worker)")
    for i, t in enumerate(result.trials):
        label = describe_settings(t.settings) + (" *" if i == result.chosen else "")
        if not t.ok:
            table.add_row(label, t.phase, "failed", Text(t.error or ""), "", "", "", "", "")
            continue
        table.add_row(
            label, t.phase, f"{t.images_per_s:.0f}", f"{t.latency_p50_ms:.1f}", f"{t.latency_p95_ms:.1f}",
            f"{t.main_cpu:.2f}", f"{t.workers_cpu:.2f}",
            f"{t.worker_uss_mib:.0f}" if t.worker_uss_mib is not None else "-",
            f"{t.worker_pss_mib:.0f}" if t.worker_pss_mib is not None else "-",
        )
    common.print_table(out, table)
    if cached:
        out.print(f"[yellow]cached result of {result.created}; --refresh measures again[/yellow]")
    settings = {**result.recommended, "decode_threads": result.decode_threads}
    kwargs = ", ".join(f"{k}={v!r}" for k, v in settings.items())
    out.print(f"[bold]recommended:[/bold] make_loader(..., {kwargs})")
    out.print(result.explanation)
    if plot:
        out.print(f"plot: {plot}")


def add_bench(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "bench", help="loader / index / sampler speed as ratios against baselines measured in the same run"
    )
    p.add_argument("path", nargs="?", help="a data set (default: synthetic, in a temporary folder)")
    p.add_argument("--size", type=int, help="resize images to SIZE x SIZE (default: 384)")
    p.add_argument("--batch-size", type=int, help="images per batch (default: 16)")
    p.add_argument("--batches", type=int, help="batches timed per setting (default: 20)")
    p.add_argument("--repeats", type=int, help="runs per loader setting, round-robin, median kept (default: 2)")
    p.add_argument("--sampler-weights", type=int, help="weights for the sampler section (default: 10,000,000)")
    p.add_argument("--sampler-draws", type=int, help="indices timed from the start of an epoch (default: 1,000,000)")
    p.add_argument("--index-files", type=int, help="synthetic XML files for the index section (default: 5000)")
    p.add_argument(
        "--sections", nargs="+", metavar="SECTION", help="run only these: loader, index, sampler (default: all)"
    )
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    common.add_dataset_arguments(p)
    common.add_cache_arguments(p, bench=True)
    p.add_argument("--quick", action="store_true", help="a tiny run that checks every section (figures mean nothing)")
    p.set_defaults(func=_bench)


def _bench(args: argparse.Namespace) -> int:
    from detloader.tune.bench import BenchSettings, run_bench

    settings = BenchSettings.make(
        args.quick, size=args.size, batch_size=args.batch_size, batches=args.batches, repeats=args.repeats,
        sampler_weights=args.sampler_weights, sampler_draws=args.sampler_draws, index_files=args.index_files,
        sections=args.sections, cache=args.cache,
    )
    progress = None if args.json else (lambda section: print(f"measuring: {section}", file=sys.stderr))
    report = run_bench(args.path, settings, progress, read_options=common.dataset_kwargs(args))
    if args.json:
        common.print_json(report.to_dict())
        return 0
    m = report.machine
    print(
        f"{m['cpu']}, {m['usable_cpus']} usable CPUs, {m['memory_gb']} GB; python {m['python']}, "
        f"torch {m['torch']}, numpy {m['numpy']}; load average {m['load_average_start']:.1f} -> "
        f"{m['load_average_end']:.1f}"
    )
    print(report.table())
    return 0
