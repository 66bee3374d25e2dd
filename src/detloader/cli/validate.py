"""``detloader validate PATH``: every problem in the annotations, as a table; exit 1 if errors.

Repairs (a box clipped, images found elsewhere) are listed but exit 0, so that CI can gate on it.
Not on a terminal, the table is one problem per line (file, where, kind, problem, action,
tab-separated), so that ``detloader validate DS | grep NAME`` finds a file by its name."""

from __future__ import annotations

import argparse

from detloader.cli._common import (
    add_read_arguments,
    console,
    print_json,
    print_table,
    problems_line,
    progress_bar,
    read_index,
)


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("validate", help="report every problem in a dataset's annotations")
    add_read_arguments(p, on_error_help="no effect here: validate always reads on and lists every problem")
    p.add_argument("--json", action="store_true", help="print the problems as JSON")
    p.add_argument("--limit", type=int, default=0, help="show at most this many rows (default: all)")
    p.add_argument("--no-images", action="store_true", help="skip the image header checks")
    p.add_argument("--decode", action="store_true", help="also decode every image fully, in parallel")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from rich.table import Table
    from rich.text import Text

    # on_error="skip": collect everything, then report
    index = read_index(args, reports_problems=True, bar=not args.json, description="validating", on_error="skip")
    report = index.problems
    if not args.no_images:
        import os

        from detloader.validate_images import check_images

        workers = (os.cpu_count() or 1) if args.decode else 1
        with progress_bar("decoding" if args.decode else "image headers", enabled=not args.json) as progress:
            for problem in check_images(
                index, decode=args.decode, workers=workers, progress=progress, reported=list(report)
            ):
                report.add(problem)
    if args.json:
        print_json({"images": len(index), "objects": index.num_objects, "errors": len(report.errors),
                    "repairs": len(report.repairs), "problems": report.counts(), "items": report.to_list()})
        return 1 if report.errors else 0
    out = console()
    if not report:
        out.print(f"[green]no problems[/green] in {len(index)} images, {index.num_objects} objects")
        return 0
    table = Table(title=f"{len(report)} problems")
    for column in ("file", "where", "kind", "problem", "action"):
        table.add_column(column, overflow="fold")
    rows = list(report)
    shown = rows[: args.limit] if args.limit > 0 else rows
    for p in shown:
        style = "red" if p.severity == "error" else "yellow"
        kind = f"[{style}]{p.kind}[/{style}]"
        table.add_row(Text(p.file), Text(p.element), kind, Text(p.message), Text(p.action))
    print_table(out, table)
    if len(shown) < len(rows):
        out.print(f"... {len(rows) - len(shown)} more (--limit 0 shows all)")
    out.print(
        problems_line(report)
        if report.errors
        else f"[green]no errors[/green] ({len(report.repairs)} repaired): {report.summary_line()}"
    )
    return 1 if report.errors else 0
