"""Pieces shared by the sub-commands: reading options, progress bars, JSON output."""

from __future__ import annotations

import argparse
import errno
import json
import os
import sys
import warnings
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, Callable, Iterator

from detloader.annotations.problems import ON_ERROR_CHOICES, AnnotationWarning

if TYPE_CHECKING:
    from rich.console import Console
    from rich.table import Table

    from detloader.annotations.index import AnnotationIndex

__all__ = [
    "add_read_arguments",
    "console",
    "print_attribute_counts",
    "print_json",
    "print_table",
    "progress_bar",
    "read_index",
    "read_kwargs",
    "table_lines",
]


def add_read_arguments(parser: argparse.ArgumentParser, on_error: str = "warn") -> None:
    """Arguments of :func:`detloader.read_annotations` that the CLI exposes."""
    parser.add_argument("path", help="dataset folder or annotation file")
    parser.add_argument("--format", default="auto", help="annotation format (default: auto)")
    parser.add_argument(
        "--on-error",
        choices=ON_ERROR_CHOICES,
        default=on_error,
        help=f"what bad annotations do (default: {on_error})",
    )
    parser.add_argument("--classes", help="comma-separated class list, in id order")
    parser.add_argument("--one-based", action="store_true", help="VOC 1-based pixel indices")
    parser.add_argument("--no-check-images", action="store_true", help="do not check image files exist")
    parser.add_argument(
        "--allow-outside-images", action="store_true", help="follow image names that leave the dataset (../, absolute)"
    )
    parser.add_argument("--workers", type=int, help="processes for a cold build (default: usable CPUs)")
    parser.add_argument("--rebuild", action="store_true", help="ignore the cached index")
    parser.add_argument("--no-cache", action="store_true", help="neither read nor write the cache")


def read_kwargs(args: argparse.Namespace) -> dict[str, Any]:
    """The options of :func:`add_read_arguments` as :func:`detloader.read_annotations` takes them."""
    return {
        "format": args.format,
        "on_error": args.on_error,
        "classes": [c.strip() for c in args.classes.split(",")] if args.classes else None,
        "one_based": args.one_based,
        "check_images": not args.no_check_images,
        "allow_outside_images": args.allow_outside_images,
        "workers": args.workers,
        "cache": False if args.no_cache else ("rebuild" if args.rebuild else True),
    }


def read_index(args: argparse.Namespace, *, hide_warnings: bool, bar: bool = True) -> "AnnotationIndex":
    """The index that :func:`add_read_arguments`' options describe, with an "indexing" progress
    bar when ``bar``; ``hide_warnings``: annotation warnings are silenced (the command reports
    the problems itself)."""
    from detloader import read_annotations  # lazy: keeps `detloader --help` fast

    with warnings.catch_warnings():
        if hide_warnings:
            warnings.simplefilter("ignore", AnnotationWarning)
        with progress_bar("indexing", enabled=bar) as progress:
            return read_annotations(args.path, progress=progress, **read_kwargs(args))


@contextmanager
def progress_bar(description: str, enabled: bool = True) -> Iterator[Callable[[int, int], None] | None]:
    """A rich progress bar on stderr, as a ``progress(done, total)`` callback."""
    if not enabled or not sys.stderr.isatty():
        yield None
        return
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeElapsedColumn

    with Progress(
        "[progress.description]{task.description}",
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        transient=True,
        console=_stderr_console(),
    ) as bar:
        task = bar.add_task(description, total=None)

        def update(done: int, total: int) -> None:
            bar.update(task, completed=done, total=total)

        yield update


def _stderr_console() -> "Console":
    from rich.console import Console

    return Console(stderr=True)


def print_json(data: Any) -> None:
    json.dump(data, sys.stdout, indent=2, ensure_ascii=False)
    sys.stdout.write("\n")


def print_attribute_counts(out: Any, summary: dict[str, Any]) -> None:
    """One line per object and image attribute: value counts (``summary`` as
    :meth:`AnnotationIndex.summary` or :func:`detloader.stats.dataset_stats` give it)."""
    for level in ("object_attributes", "image_attributes"):
        for name, values in summary[level].items():
            out.print(f"{level.split('_')[0]} attribute {name}: " + ", ".join(f"{v} {c}" for v, c in values.items()))


# --- stdout: rich tables on a terminal, one line per row in a pipe -------------------------
#
# On a terminal the sub-commands print rich tables. Anywhere else (a pipe, a file) rich would
# wrap everything at 80 columns and fold long names over several lines, so that
# `detloader validate DS | grep NAME` misses them: there, text is never wrapped and a table is
# ``# title``, then a header line, then one line per row, cells separated by tabs, as written
# (no markup, nothing cut).

#: Width a console not on a terminal assumes: wide enough that rich never wraps a line.
PIPE_WIDTH = 1 << 16


def console() -> "Console":
    """A rich console on stdout, without syntax highlighting of numbers and paths; not on a
    terminal, one that never wraps (see :func:`print_table` for its tables)."""
    from rich.console import Console

    out = Console(highlight=False)
    # a closed pipe: rich would exit with status 1; let the error reach the entry point instead
    out.on_broken_pipe = _closed_pipe  # type: ignore[method-assign]
    if not out.is_terminal:
        out.soft_wrap = True
        out.width = PIPE_WIDTH
    return out


def _closed_pipe() -> None:
    raise BrokenPipeError(errno.EPIPE, os.strerror(errno.EPIPE))


def _plain(cell: Any) -> str:
    """The text of a table cell (markup resolved), on one line."""
    from rich.text import Text

    if isinstance(cell, str):
        cell = Text.from_markup(cell, emoji=False)
    text = cell.plain if isinstance(cell, Text) else str(cell)
    return " ".join(text.replace("\t", " ").splitlines()) if text else ""


def table_lines(table: "Table") -> list[str]:
    """``table`` as plain lines: ``# title`` (when it has one), the column headers, then one
    line per row; cells tab-separated, each on one line."""
    lines = [f"# {_plain(table.title)}"] if table.title else []
    columns = [list(column.cells) for column in table.columns]
    lines.append("\t".join(_plain(column.header) for column in table.columns))
    lines.extend("\t".join(_plain(column[i]) for column in columns) for i in range(table.row_count))
    return lines


def print_table(out: "Console", table: "Table") -> None:
    """``table`` on ``out``: drawn on a terminal, as :func:`table_lines` anywhere else."""
    if out.is_terminal:
        out.print(table)
        return
    out.file.write("".join(line + "\n" for line in table_lines(table)))  # rich would expand the tabs
