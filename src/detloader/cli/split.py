"""``detloader split PATH [--val 0.2] [--test 0.0] [--seed 0] [--force]``: make the dataset's
train / val (/ test) splits once, seeded and stratified by class, and write them where the
layout keeps splits (:func:`detloader.make_splits`)."""

from __future__ import annotations

import argparse

from detloader.cli._common import (
    add_read_arguments,
    console,
    print_json,
    print_table,
    read_index,
    require_images,
)


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "split",
        help="make train/val(/test) splits once (seeded, stratified by class) and write them",
        description="Split PATH into train / val (/ test), every class in each split where it can be, and "
        "write the split where the layout keeps splits: ImageSets/Main/*.txt of a VOC dataset, else "
        "splits.json at the dataset root. Every later read of PATH sees it.",
    )
    add_read_arguments(p)
    p.add_argument("--val", type=float, default=0.2, help="fraction of the images for val (default 0.2)")
    p.add_argument("--test", type=float, default=0.0, help="fraction of the images for test (default 0)")
    p.add_argument("--seed", type=int, default=0, help="seed of the shuffle (default 0)")
    p.add_argument("--force", action="store_true", help="replace the train/val/test splits the dataset has")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from rich.table import Table
    from rich.text import Text

    from detloader.annotations.splits import make_splits

    index = read_index(args, reports_problems=False, bar=not args.json, description="reading")
    require_images(index, "split")
    made = make_splits(index, val=args.val, test=args.test, seed=args.seed, force=args.force)
    parts = {name: made.split(name) for name in made.splits}
    summary = {
        name: {"images": len(part), "objects": part.class_counts(), "written": made.meta["split_sources"][name]}
        for name, part in parts.items()
    }
    if args.json:
        print_json(summary)
        return 0
    table = Table("", *parts, title="images and objects per class")
    table.add_row("images", *(str(len(part)) for part in parts.values()))
    for name in made.classes:
        table.add_row(Text(name), *(str(s["objects"][name]) for s in summary.values()))
    out = console()
    print_table(out, table)
    out.print(f"written in {made.root}:", markup=False)
    for name, s in summary.items():
        out.print(f"  {name}: {s['written']}", markup=False)
    return 0
