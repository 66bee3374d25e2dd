"""Pieces shared by the sub-commands: dataset options, progress bars, tables (drawn on a terminal, lines in
a pipe), JSON output."""

from __future__ import annotations

import argparse
import errno
import json
import os
import sys
import warnings
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from detloader.annotations.checks import BOXES_FROM_POINTS
from detloader.annotations.problems import ON_ERROR_CHOICES, ProblemReport, check_choice
from detloader.cli._class_rows import TOP, cap_rows, print_rest
from detloader.errors import AnnotationWarning, DetloaderValueError

if TYPE_CHECKING:
    from rich.console import Console
    from rich.table import Table

    from detloader.annotations.index import AnnotationIndex

#: ``--on-error`` of every command that reads a dataset (README.md: "Exit status and problems").
ON_ERROR_DEFAULT = "warn"


def add_read_arguments(
    parser: argparse.ArgumentParser,
    *,
    path_nargs: str | None = None,
    path_help: str = "dataset folder or annotation file",
    build: bool = True,
    on_error_help: str | None = None,
) -> None:
    """Arguments of :func:`detloader.read_annotations` that the CLI exposes: the dataset
    ``path`` (``path_nargs="?"``: optional), the dataset options of
    :func:`add_dataset_arguments` and, with ``build``, how the index is built (workers, cache)."""
    parser.add_argument("path", nargs=path_nargs, help=path_help)
    add_dataset_arguments(parser, on_error_help)
    if not build:
        return
    group = parser.add_argument_group("index building")
    group.add_argument("--workers", type=int, help="processes for a cold build (default: usable CPUs)")
    group.add_argument("--rebuild", action="store_true", help="ignore the cached index")
    group.add_argument("--no-cache", action="store_true", help="neither read nor write the cache")


def add_dataset_arguments(parser: argparse.ArgumentParser, on_error_help: str | None = None) -> None:
    """How to read the dataset: format, error policy (:data:`ON_ERROR_DEFAULT`; ``on_error_help``
    says what a command does with it otherwise), classes, where the images are."""
    group = parser.add_argument_group("reading the dataset")
    # no argparse defaults here: dataset_kwargs(given_only=True) tells an option given from one left out
    group.add_argument("--format", help="annotation format (default: auto)")
    group.add_argument(
        "--on-error", choices=ON_ERROR_CHOICES,
        help=on_error_help or "a bad annotation: raise stops at the first (exit status 2), warn drops its item and "
        f"sums up the problems, skip drops it quietly (default: {ON_ERROR_DEFAULT})",
    )
    group.add_argument("--classes", help="comma-separated class list, in id order")
    group.add_argument(
        "--class-map", action="append", metavar="NAME=NEW|FILE",
        help="rename (NAME=NEW), merge, or drop (NAME=) a class; repeatable, or a JSON/YAML file "
        "of {name: new name or null}",
    )
    group.add_argument(
        "--image-dir", metavar="DIR",
        help="image folder, relative to the dataset root (default: from the layout, else searched)",
    )
    group.add_argument(
        "--images-by", metavar="name|id", help="CVAT: find images by their name (default) or id (renamed exports)"
    )
    group.add_argument(
        "--boxes-from-points", choices=BOXES_FROM_POINTS,
        help="an object with landmarks and no box gets the points' enclosing box (default), "
        "the whole image, or is skipped",
    )
    group.add_argument("--one-based", action="store_true", help="VOC 1-based pixel indices")
    group.add_argument("--no-check-images", action="store_true", help="do not check image files exist")
    group.add_argument(
        "--allow-outside-images", action="store_true",
        help="follow image names that leave the dataset (../, absolute) and folder links that lead out of it",
    )
    stream = parser.add_argument_group(
        "a pack (PATH an s3://, gs://, azure:// prefix or a folder made by detloader pack)"
    )
    stream.add_argument("--stream-cache", metavar="DIR",
                        help="the node's folder of the pack's shards (default: the user cache folder's stream/)")
    stream.add_argument("--stream-cache-limit", metavar="BYTES", type=parse_bytes,
                        help="bytes the shards may take there: 64MB, 20GB, 20GiB or a number (default: 16 GiB, "
                        "or half the free disk)")


def dataset_location(index: Any) -> str:
    """Where the user's dataset is, as the commands name it: a pack's URL (or folder) for an index
    read from a pack (its ``root`` is the node's stream cache folder), else the index's root."""
    pack = index.meta.get("pack")
    return str(pack["url"]) if isinstance(pack, Mapping) else str(index.root)

#: Units of :func:`parse_bytes`.
_UNITS = {"": 1, "B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12,
          "KIB": 2**10, "MIB": 2**20, "GIB": 2**30, "TIB": 2**40}


def parse_bytes(text: str) -> int:
    """``64MB``, ``1.5GiB`` or ``4096`` as bytes (argparse type: a bad size is a usage error naming it)."""
    value = text.strip().upper().replace(" ", "")
    number = value.rstrip("KMGTIB")
    unit = value[len(number):]
    try:
        size = float(number) * _UNITS[unit]
    except (KeyError, ValueError):
        raise argparse.ArgumentTypeError(f"{text!r} is not a size: a number with B, KB, MB, GB, TB, KiB, MiB, GiB "
                                         "or TiB (64MB, 20GiB)") from None
    if not 1 <= size < 2**63:
        raise argparse.ArgumentTypeError(f"{text!r} must be at least 1 byte")
    return int(size)


def add_cache_arguments(parser: argparse.ArgumentParser, bench: bool = False) -> None:
    """``--cache disk|ram`` and ``--cache-size S``: the store of decoded images of the commands
    that load images (``DetectionDataset(cache=, cache_size=)``, docs/loader.md)."""
    group = parser.add_argument_group("store of decoded images")
    group.add_argument(
        "--cache", choices=("disk", "ram"),
        help="also time an epoch read from the store of decoded images (built first, beside the index cache or "
        "in /dev/shm)" if bench else "decode each image once into a store beside the index cache (disk) or in "
        "/dev/shm (ram) and read it from there",
    )
    if not bench:  # bench stores at its --size
        group.add_argument(
            "--cache-size", type=int, metavar="S",
            help="longer side of the stored images (default: the size the transform's resize gives each image)",
        )


def parse_class_map(values: list[str] | None) -> dict[str, str | None] | None:
    """``--class-map`` values as ``class_map``: ``NAME=NEW`` pairs (``NAME=`` drops the class)
    and JSON/YAML files of ``{name: new name or null}``, later entries winning."""
    if not values:
        return None
    out: dict[str, str | None] = {}
    for value in values:
        if os.path.isfile(value):
            out.update(_class_map_file(value))
        elif "=" in value:
            name, _, new = value.partition("=")
            if not name.strip():
                raise DetloaderValueError(f"--class-map {value!r}: the class name before '=' is empty")
            out[name.strip()] = new.strip() or None
        else:
            raise DetloaderValueError(f"--class-map {value!r} is neither NAME=NEW nor a JSON/YAML file")
    return out


def _class_map_file(path: str) -> dict[str, str | None]:
    import yaml  # lazy: keeps `detloader --help` fast

    try:
        with open(path, encoding="utf-8") as fh:
            data = json.load(fh) if path.lower().endswith(".json") else yaml.safe_load(fh)
    except (OSError, UnicodeDecodeError, ValueError, yaml.YAMLError) as err:
        raise DetloaderValueError(f"--class-map {path}: not readable JSON/YAML: {err}") from None
    if not isinstance(data, dict):
        what = type(data).__name__
        raise DetloaderValueError(f"--class-map {path}: top level is a {what}, not a mapping of class names")
    out: dict[str, str | None] = {}
    for name, new in data.items():
        if new is not None and not isinstance(new, (str, int)):
            raise DetloaderValueError(f"--class-map {path}: {name!r}: {new!r} is not a class name or null")
        out[str(name)] = str(new) if new is not None else None
    return out


def dataset_kwargs(args: argparse.Namespace, *, given_only: bool = False) -> dict[str, Any]:
    """The options of :func:`add_dataset_arguments` as :func:`detloader.read_annotations`
    takes them: ``format`` and ``on_error`` (``auto`` and :data:`ON_ERROR_DEFAULT` when not
    given), and the others where they differ from its defaults. ``given_only``: only those given
    on the command line (what a run's recorded options give way to,
    :func:`detloader.train.run_data.run_read_options`)."""
    from detloader.annotations.readers import READERS  # lazy: keeps `detloader --help` fast

    kwargs: dict[str, Any] = {}
    if args.format is not None:
        check_choice("--format", args.format, ("auto", *READERS))
        kwargs["format"] = args.format
    if args.on_error is not None:
        kwargs["on_error"] = args.on_error
    if not given_only:
        kwargs = {"format": "auto", "on_error": ON_ERROR_DEFAULT, **kwargs}
    if args.classes:
        kwargs["classes"] = [c.strip() for c in args.classes.split(",")]
    class_map = parse_class_map(args.class_map)
    if class_map is not None:
        kwargs["class_map"] = class_map
    if args.image_dir is not None:
        kwargs["image_dir"] = args.image_dir
    if args.images_by is not None:
        check_choice("--images-by", args.images_by, ("name", "id"))
        kwargs["images_by"] = args.images_by
    if args.boxes_from_points is not None:
        kwargs["boxes_from_points"] = args.boxes_from_points
    for flag, name, value in _SWITCHES:
        if getattr(args, flag):
            kwargs[name] = value
    for name in ("stream_cache", "stream_cache_limit"):  # a pack's: read_annotations ignores them otherwise
        if getattr(args, name, None) is not None:
            kwargs[name] = getattr(args, name)
    return kwargs


#: The on/off options of :func:`add_dataset_arguments`: (flag's attribute, keyword, value when given).
_SWITCHES: tuple[tuple[str, str, bool], ...] = (
    ("one_based", "one_based", True), ("no_check_images", "check_images", False),
    ("allow_outside_images", "allow_outside_images", True),
)


def read_option_flags(options: Mapping[str, Any]) -> str:
    """``options`` (:func:`detloader.read_annotations` keywords, as :func:`dataset_kwargs` gives
    them) in command-line words: ``--images-by id --class-map a=b --no-check-images``; a
    keyword without a flag as ``name=value``."""
    words = []
    for name, value in options.items():
        switch = next((flag for flag, key, on in _SWITCHES if key == name and value == on), None)
        if switch is not None:
            words.append("--" + switch.replace("_", "-"))
        elif name == "class_map" and isinstance(value, Mapping):
            words.extend(f"--class-map {old}={new or ''}" for old, new in value.items())
        elif name == "classes" and isinstance(value, (list, tuple)):
            words.append(f"--classes {','.join(map(str, value))}")
        elif name in ("format", "on_error", "image_dir", "images_by", "boxes_from_points", "stream_cache",
                      "stream_cache_limit"):
            words.append(f"--{name.replace('_', '-')} {value}")
        else:
            words.append(f"{name}={value!r}")
    return " ".join(words)


def read_index(
    args: argparse.Namespace,
    *,
    reports_problems: bool,
    bar: bool = True,
    description: str = "indexing",
    on_error: str | None = None,
) -> AnnotationIndex:
    """The index that :func:`add_read_arguments`' options describe, with a progress bar
    (``description``) when ``bar``; ``on_error`` overrides ``--on-error``. Unless the command
    ``reports_problems`` itself, ``--on-error warn`` sums them up in one line on stderr. When the
    images were found in another folder than the layout's, one line on stderr says which."""
    from detloader import read_annotations  # lazy: keeps `detloader --help` fast
    from detloader.errors import ImageFolderWarning

    cache = False if args.no_cache else ("rebuild" if args.rebuild else True)
    kwargs = {**dataset_kwargs(args), "workers": args.workers, "cache": cache}
    if on_error is not None:
        kwargs["on_error"] = on_error
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ImageFolderWarning)  # said below, in CLI words
        warnings.simplefilter("ignore", AnnotationWarning)  # likewise
        with progress_bar(description, enabled=bar) as progress:
            index = read_annotations(args.path, progress=progress, **kwargs)
    if index.problems and kwargs["on_error"] == "warn" and not reports_problems:
        print(
            f"detloader {args.command}: {problems_line(index.problems)} (detloader validate lists them)",
            file=sys.stderr,
        )
    found = index.meta.get("image_search")
    if found is not None:
        from detloader.annotations.image_search import search_message

        print(
            f"detloader {args.command}: {search_message(found)}; read from there (--image-dir chooses)", file=sys.stderr
        )
    return index


def problems_line(report: ProblemReport) -> str:
    """``2 errors, 1 repaired: empty_box: 2, box_clipped: 1``."""
    return f"{len(report.errors)} errors, {len(report.repairs)} repaired: {report.summary_line()}"


def require_images(index: AnnotationIndex, what: str) -> None:
    """ValueError (exit status 2, one line) when ``index`` holds no images: why, and what to
    try (``--image-dir``, ``--images-by id``, ``detloader validate``)."""
    if len(index):
        return
    errors = ProblemReport(index.problems.errors)
    reason = f"every image was dropped ({errors.summary_line()})" if errors else "the annotations name no images"
    hints = []
    if "missing_image" in errors.counts():
        hints.append("if the images are elsewhere, pass --image-dir DIR (relative to the dataset root)")
        if index.meta.get("format") == "cvat":
            hints.append("if they were renamed to their CVAT id, --images-by id")
    if "outside_dataset" in errors.counts() or "link_outside_dataset" in errors.counts():
        hints.append("--allow-outside-images follows image names and folder links that leave the dataset")
    if errors:
        hints.append("detloader validate lists every problem")
    tail = f"; {'; '.join(hints)}" if hints else ""
    raise DetloaderValueError(f"{dataset_location(index)}: no images to {what}: {reason}{tail}")


@contextmanager
def progress_bar(
    description: str, enabled: bool = True, *, detail: bool = False
) -> Iterator[Callable[..., None] | None]:
    """A rich progress bar on stderr (interactive terminals only), as a ``progress(done, total)``
    callback; it also takes ``description=`` and, with ``detail``, the text after the bar (``detail=``)."""
    if not enabled or not sys.stderr.isatty():
        yield None
        return
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    columns = ["[progress.description]{task.description}", BarColumn(), MofNCompleteColumn(), TimeElapsedColumn()]
    with Progress(
        *columns, *([TextColumn("{task.fields[detail]}")] if detail else []),
        transient=True, console=Console(stderr=True),
    ) as bar:
        task = bar.add_task(description, total=None, detail="")

        def update(done: int, total: int, **fields: Any) -> None:
            bar.update(task, completed=done, total=total, **fields)

        yield update


def print_json(data: Any) -> None:
    json.dump(data, sys.stdout, indent=2, ensure_ascii=False)
    sys.stdout.write("\n")


def count_table(title: str, header: Sequence[str], rows: Iterable[Sequence[Any]], justify: str = "left") -> Table:
    """A table of rows that start with a name (never read as markup); the other cells as
    ``str`` gives them, aligned by ``justify``."""
    from rich.table import Table
    from rich.text import Text

    table = Table(title=title)
    for i, column in enumerate(header):
        table.add_column(column, justify="left" if i == 0 else justify)  # type: ignore[arg-type]
    for name, *cells in rows:
        table.add_row(Text(str(name)), *(str(cell) for cell in cells))
    return table


def print_attribute_counts(out: Any, summary: dict[str, Any], top: int = TOP) -> None:
    """One line per object and image attribute: value counts (``summary`` as
    :meth:`AnnotationIndex.summary` or :func:`detloader.stats.dataset_stats` give it); an
    attribute with more than ``top + 1`` values (0: no limit) shows its ``top`` commonest and
    how many more."""
    for level in ("object_attributes", "image_attributes"):
        for name, values in summary[level].items():
            items = list(values.items())
            if 0 < top < len(items) - 1:
                shown = sorted(items, key=lambda vc: -vc[1])[:top]
                more = f", and {len(items) - top:,} more values (--top 0 lists all)"
            else:
                shown, more = items, ""
            line = ", ".join(f"{v} {c}" for v, c in shown)
            out.print(f"{level.split('_')[0]} attribute {name}: {line}{more}", markup=False)


def print_counts(out: Any, title: str, columns: tuple[str, str], counts: dict[str, int], top: int = TOP, *,
                 unit: str = "images", noun: str = "image classes") -> None:
    """A two-column table of ``counts`` (name -> count), capped as
    :func:`~detloader.cli._class_rows.cap_rows` does, with its line on the rest."""
    rows = list(counts.items())
    capped = cap_rows(rows, [c for _, c in rows], top, unit=unit, noun=noun)
    print_table(out, count_table(capped.title(title), columns, capped.rows))
    print_rest(out, capped)


# --- stdout: rich tables on a terminal, one line per row in a pipe -------------------------
#
# On a terminal the sub-commands print rich tables. Anywhere else (a pipe, a file) rich would
# wrap everything at 80 columns and fold long names over several lines, so that
# `detloader validate DS | grep NAME` misses them: there, text is never wrapped and a table is
# ``# title``, then a header line, then one line per row, cells separated by tabs, as written
# (no markup, nothing cut).

#: Width a console not on a terminal assumes: wide enough that rich never wraps a line.
PIPE_WIDTH = 1 << 16


def console() -> Console:
    """A rich console on stdout, without syntax highlighting of numbers and paths; not on a
    terminal, one that never wraps (see :func:`print_table` for its tables)."""
    from rich.console import Console

    out = Console(highlight=False)
    # a closed pipe: rich would exit with status 1; let the error reach the entry point instead
    out.on_broken_pipe = _closed_pipe  # type: ignore[method-assign]
    if not out.is_terminal:
        out.soft_wrap = True
        out.width = PIPE_WIDTH
        # a rule spans the console's width, which is PIPE_WIDTH here: a short heading instead
        out.rule = lambda title="", *args, **kwargs: out.print(f"== {title} ==" if title else "==")  # type: ignore[method-assign]
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


def table_lines(table: Table) -> list[str]:
    """``table`` as plain lines: ``# title`` (when it has one), the column headers, then one
    line per row; cells tab-separated, each on one line."""
    lines = [f"# {_plain(table.title)}"] if table.title else []
    columns = [list(column.cells) for column in table.columns]
    lines.append("\t".join(_plain(column.header) for column in table.columns))
    lines.extend("\t".join(_plain(column[i]) for column in columns) for i in range(table.row_count))
    return lines


def print_table(out: Console, table: Table) -> None:
    """``table`` on ``out``: drawn on a terminal, as :func:`table_lines` anywhere else."""
    if out.is_terminal:
        out.print(table)
        return
    out.file.write("".join(line + "\n" for line in table_lines(table)))  # rich would expand the tabs
