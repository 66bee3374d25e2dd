"""``detloader cache list|clear``: the index caches and stores of decoded images detloader made
(:mod:`detloader.dataset.caches`), listed with their size, dataset and last use, and removed by
dataset and kind without a question (scripts and CI have no stdin). Given a dataset, both find
everything in its cache folders, recorded or not, and the leftovers of writes that died."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING, Any

from detloader.cli import _common as common

if TYPE_CHECKING:
    from detloader.dataset.caches import MadeFile


def add_cache(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("cache", help="list or remove the index caches and image stores detloader made")
    actions = p.add_subparsers(dest="action", metavar="ACTION", required=True)
    listing = actions.add_parser("list", help="every index cache and store: path, kind, size, dataset, last use")
    listing.add_argument(
        "dataset", nargs="?", metavar="DATASET",
        help="only this dataset's (its folder or annotation file), with what its cache folders hold unrecorded",
    )
    listing.add_argument("--kind", choices=("index", "store", "all"), default="all", help="only these (default: all)")
    listing.add_argument("--json", action="store_true", help="print one JSON object")
    listing.set_defaults(func=_list)
    clearing = actions.add_parser(
        "clear", help="remove the caches and stores of DATASET, recorded or not, and the leftovers of writes that "
        "died (of every dataset without it); never one in use",
    )
    clearing.add_argument("dataset", nargs="?", metavar="DATASET", help="the dataset's folder or annotation file")
    clearing.add_argument(
        "--kind", choices=("index", "store", "all"), default="all",
        help="index caches, stores of decoded images, or both (default: all)",
    )
    clearing.add_argument("--dry-run", action="store_true", help="name what would be removed, remove nothing")
    clearing.add_argument("--json", action="store_true", help="print one JSON object")
    clearing.set_defaults(func=_clear)


def size(n: int) -> str:
    """``n`` bytes for people: ``812 B``, ``41.5 KiB``, ``280.3 MiB``, ``1.2 GiB``."""
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n} B"


def _total(made: list[MadeFile]) -> str:
    index = sum(m.bytes for m in made if m.kind.startswith("index"))
    stores = sum(m.bytes for m in made if m.kind.startswith("store"))
    files = f"{len(made)} file" + ("" if len(made) == 1 else "s")
    return f"{files}, {size(index + stores)} (index caches {size(index)}, stores {size(stores)})"


def _list(args: argparse.Namespace) -> int:
    from rich.markup import escape
    from rich.table import Table
    from rich.text import Text

    from detloader.dataset.caches import find_made

    made = find_made(args.kind, args.dataset)
    if args.json:
        common.print_json({"files": [m.to_dict() for m in made], "bytes": sum(m.bytes for m in made)})
        return 0
    out = common.console()
    if not made:
        of = f" of {escape(args.dataset)}" if args.dataset else ""
        out.print(f"no index cache or store{of} (reading a dataset makes its index cache; cache=disk|ram a store)")
        return 0
    table = Table("path", "kind", "size", "dataset", "last use", "in use", title="index caches and stores")
    for m in made:
        table.add_row(Text(m.path), m.kind, size(m.bytes), Text(m.root or "?"), m.last_use.replace("T", " "),
                      "yes" if m.in_use else "")
    common.print_table(out, table)
    out.print(f"total: {_total(made)}")
    return 0


def _clear(args: argparse.Namespace) -> int:
    from rich.markup import escape

    from detloader.dataset.caches import clear

    removed, busy = clear(args.dataset, args.kind, dry_run=args.dry_run)
    if args.json:
        data: dict[str, Any] = {"dry_run": args.dry_run, "removed": [m.to_dict() for m in removed],
                                "bytes": sum(m.bytes for m in removed), "in_use": [m.to_dict() for m in busy]}
        common.print_json(data)
        return 0
    out = common.console()
    verb = "would remove" if args.dry_run else "removed"
    for m in removed:
        out.print(f"{verb} {escape(m.path)} ({m.kind}, {size(m.bytes)})")
    for m in busy:
        out.print(f"kept {escape(m.path)} ({m.kind}, {size(m.bytes)}): in use by another process; "
                  "clear it again once that process ends")
    of = f" of {escape(args.dataset)}" if args.dataset else ""
    what = {"index": "index caches", "store": "stores", "all": "index caches and stores"}[args.kind]
    if not removed and not busy:
        out.print(f"nothing to remove: no {what}{of}")
    else:
        kept = f"; {len(busy)} in use kept" if busy else ""
        out.print(f"{verb} {what}{of}: {_total(removed)}{kept}")
    return 0
