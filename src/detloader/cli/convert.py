"""``detloader convert SRC --to voc|coco|yolo OUT``: read any format, write another."""

from __future__ import annotations

import argparse
import warnings

from detloader.cli._common import (
    add_read_arguments,
    console,
    problems_line,
    read_index,
    require_images,
)


def register(sub: argparse._SubParsersAction) -> None:
    from detloader.annotations.writers import EXPORT_FORMATS, IMAGE_MODES

    p = sub.add_parser(
        "convert",
        help="convert a dataset to Pascal VOC, COCO JSON or YOLO",
        description="Read SRC (any format detloader reads) and write it to the folder OUT.",
    )
    add_read_arguments(p)
    p.add_argument("--to", required=True, choices=EXPORT_FORMATS, help="format to write")
    p.add_argument("out", help="output folder (created; must be empty unless --overwrite)")
    p.add_argument(
        "--images", choices=IMAGE_MODES, default="link",
        help="how images reach OUT: hard link (copy where refused), copy, symlink, or none "
        "(annotations name the original files; not for YOLO). Default: link",
    )
    p.add_argument("--split", help="write only this split of SRC")
    p.add_argument(
        "--val-fraction", type=float, metavar="F",
        help="YOLO: hold out this fraction of the training images as val (seeded by --seed); "
        "without it and without a val split, data.yaml's val names the training images",
    )
    p.add_argument("--seed", type=int, default=0, help="seed of --val-fraction (default 0)")
    p.add_argument("--overwrite", action="store_true", help="write into a non-empty OUT")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from detloader.annotations.writers import YoloExportWarning, write_annotations

    index = read_index(args, reports_problems=True)  # summed up below
    require_images(index, "convert")
    with warnings.catch_warnings(record=True) as notes:
        warnings.simplefilter("always", YoloExportWarning)
        written = write_annotations(
            index, args.out, args.to, images=args.images, split=args.split, overwrite=args.overwrite,
            val_fraction=args.val_fraction, seed=args.seed,
        )
    part = index.split(args.split) if args.split else index
    out = console()
    out.print(
        f"wrote {len(part)} images, {part.num_objects} objects, {len(part.classes)} classes "
        f"({index.meta.get('format', '?')} -> {args.to}) to {written}"
    )
    for note in notes:
        if issubclass(note.category, YoloExportWarning):
            out.print(f"[yellow]note: {note.message}[/yellow]")
        else:  # not ours to hold back
            warnings.showwarning(note.message, note.category, note.filename, note.lineno)
    if index.problems:
        out.print(f"[yellow]source problems: {problems_line(index.problems)}[/yellow]")
        out.print("run [bold]detloader validate[/bold] on the source for the full list")
    return 0
