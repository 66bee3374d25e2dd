"""``detloader index PATH``: build (or load) the cached index and print its summary; exit 1
when the read found errors (items dropped), as ``detloader validate`` does."""

from __future__ import annotations

import argparse
import time

from detloader.cli._common import (
    add_read_arguments,
    console,
    print_attribute_counts,
    print_json,
    print_table,
    read_index,
    require_images,
)


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("index", help="build or load the cached index of a dataset; print a summary")
    add_read_arguments(p)
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    start = time.perf_counter()
    index = read_index(args, reports_problems=True, bar=not args.json)
    seconds = time.perf_counter() - start
    require_images(index, "index")
    summary = index.summary()
    if args.json:
        summary["seconds"] = round(seconds, 4)
        summary["cache_file"] = index.source_file
        print_json(summary)
        return 1 if index.problems.errors else 0
    print_summary(summary, seconds)
    if index.problems:
        from rich.markup import escape

        console().print(f"\n[yellow]{escape(index.problems.summary())}[/yellow]")
        console().print("run [bold]detloader validate[/bold] for the full list")
    return 1 if index.problems.errors else 0


def print_summary(summary: dict, seconds: float | None = None) -> None:
    from rich.markup import escape
    from rich.table import Table
    from rich.text import Text

    out = console()
    took = f" in {seconds:.2f} s" if seconds is not None else ""
    out.print(
        f"[bold]{escape(str(summary['root']))}[/bold] ({summary['format']}): {summary['images']} images, "
        f"{summary['objects']} objects, {summary['empty_images']} without objects{took}"
    )
    table = Table("class", "objects", "images", "share", title="object classes")
    total = max(1, summary["objects"])
    for name, count in summary["classes"].items():
        table.add_row(Text(name), str(count), str(summary["images_per_class"][name]), f"{100 * count / total:.1f} %")
    print_table(out, table)
    if summary["image_classes"]:
        t = Table("image class", "images", title="image classes")
        for name, count in summary["image_classes"].items():
            t.add_row(Text(name), str(count))
        print_table(out, t)
    lm = summary["landmarks"]
    if lm["names"]:
        out.print(
            f"landmarks: {len(lm['names'])} ({', '.join(lm['names'][:8])}{'...' if len(lm['names']) > 8 else ''}); "
            f"flip pairs {len(lm['flip_pairs'])}; visible {lm['visible']}, hidden {lm['hidden']}, absent {lm['absent']}"
        )
    print_attribute_counts(out, summary)
    if summary["splits"]:
        out.print("splits: " + ", ".join(f"{k} {v}" for k, v in summary["splits"].items()))
