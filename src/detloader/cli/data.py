"""The commands about one dataset: ``synth`` writes the synthetic one; ``index`` builds (or
loads) the cached index and prints its summary; ``validate`` lists every problem; ``split``
makes train / val (/ test) splits once; ``convert`` writes another format; ``show`` draws a
grid of images with their annotations.

``index`` and ``validate`` exit 1 when the read found errors (items dropped); repairs (a box
clipped, images found elsewhere) are listed but exit 0, so that CI can gate on them. Not on a
terminal, validate's table is one problem per line (file, where, kind, problem, action,
tab-separated), so that ``detloader validate DS | grep NAME`` finds a file by its name.
"""

from __future__ import annotations

import argparse
import os
import time
import warnings
from collections import Counter
from typing import TYPE_CHECKING, Any

from detloader.cli._class_rows import TOP, add_top_argument, cap_rows, imbalance_line, print_rest
from detloader.cli._common import (
    add_cache_arguments,
    add_read_arguments,
    console,
    count_table,
    dataset_location,
    parse_bytes,
    print_attribute_counts,
    print_counts,
    print_json,
    print_table,
    problems_line,
    progress_bar,
    read_index,
    require_images,
)
from detloader.cli._store import add_store_argument, check_stores, store_lines, stores_damaged
from detloader.errors import DetloaderValueError

if TYPE_CHECKING:
    from detloader.annotations.problems import ProblemReport


def add_synth(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("synth", help="write the deterministic synthetic VOC dataset")
    p.add_argument("out", help="output folder (created)")
    p.add_argument("--images", type=int, default=200, help="number of images (default: 200)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--size", default="320x240", help="WIDTHxHEIGHT (default: 320x240)")
    p.add_argument("--max-objects", type=int, default=4)
    p.add_argument("--no-images", action="store_true", help="write only the XML files")
    p.add_argument("--image-pool", type=int, help="distinct images to draw; the rest are hard links")
    p.set_defaults(func=_synth)


def _synth(args: argparse.Namespace) -> int:
    from detloader.annotations.synth import make_synthetic

    try:
        w, h = (int(v) for v in args.size.lower().split("x"))
    except ValueError:
        raise DetloaderValueError(f"--size={args.size!r} is not WIDTHxHEIGHT") from None
    with progress_bar("synthesising") as progress:
        out = make_synthetic(
            args.out, args.images, seed=args.seed, size=(w, h), max_objects=args.max_objects,
            write_images=not args.no_images, image_pool=args.image_pool, progress=progress,
        )
    console().print(f"wrote {args.images} images to {out}")
    return 0


def add_index(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("index", help="build or load the cached index of a dataset; print a summary")
    add_read_arguments(p)
    add_top_argument(p)
    p.add_argument("--json", action="store_true", help="print one JSON object (every class)")
    p.set_defaults(func=_index)


def _index(args: argparse.Namespace) -> int:
    start = time.perf_counter()
    index = read_index(args, reports_problems=True, bar=not args.json)
    seconds = time.perf_counter() - start
    require_images(index, "index")
    summary = index.summary()
    summary["root"] = dataset_location(index)  # a pack's root is the node's cache folder: its URL
    if args.json:
        sources = index.meta.get("split_sources", {})
        print_json({**summary, "split_sources": sources, "seconds": round(seconds, 4), "cache_file": index.source_file})
    else:
        print_summary(summary, seconds, index.meta.get("split_sources"), args.top)
        if "pack" in index.meta:
            print_pack_line(index.meta["pack"])
        else:
            print_cache_line(index.source_file, args.path, args.no_cache)
        if index.problems:
            from rich.markup import escape

            console().print(f"\n[yellow]{escape(index.problems.summary())}[/yellow]")
            console().print("run [bold]detloader validate[/bold] for the full list")
    return 1 if index.problems.errors else 0


def print_pack_line(pack: dict[str, Any]) -> None:
    """Where a pack's index came from and where its shards go: its URL, shards and bytes, the
    node's stream cache folder and its limit (``index.meta["pack"]``)."""
    from rich.markup import escape

    from detloader.cli.cache import size

    shards = pack["manifest"]["shards"]
    total = sum(int(s["bytes"]) for s in shards)
    limit = pack.get("cache_limit")
    console().print(escape(
        f"pack: {pack['url']}, {len(shards)} shards ({size(total)}); stream cache: {pack['cache_dir']} "
        f"(limit {size(limit) if limit else 'none'}; only the manifest and the index are fetched until images are read)"
    ))


def print_cache_line(cache_file: str | None, path: str, no_cache: bool) -> None:
    """Where ``index`` left the index cache of the dataset at ``path``, its size and how to remove
    it (``DATASET/.detloader-cache/`` unless the folder is read-only or ``DETLOADER_CACHE_DIR``
    says otherwise: a command that only reads writes there); why there is none."""
    import shlex

    from rich.markup import escape

    from detloader.cli.cache import size

    if cache_file is None:
        why = "--no-cache" if no_cache else "it could not be written, see the warning above"
        console().print(f"index cache: none ({why})")
        return
    try:
        bytes_ = size(os.path.getsize(cache_file))
    except OSError:
        bytes_ = "size unknown"
    clear = f"detloader cache clear {shlex.quote(path)}"
    console().print(escape(f"index cache: {cache_file} ({bytes_}; `{clear}` removes it)"))


def print_summary(
    summary: dict[str, Any], seconds: float | None = None, split_sources: dict[str, str] | None = None,
    top: int = TOP,
) -> None:
    """What ``detloader index`` prints of :meth:`AnnotationIndex.summary`: the ``top`` largest
    classes (0: all), a line on the rest, the imbalance ratios; each split with where it came
    from when ``split_sources`` (``index.meta["split_sources"]``) names it."""
    from rich.markup import escape

    from detloader.stats.describe import imbalance_ratio

    out = console()
    took = f" in {seconds:.2f} s" if seconds is not None else ""
    out.print(
        f"[bold]{escape(str(summary['root']))}[/bold] ({summary['format']}): {summary['images']} images, "
        f"{summary['objects']} objects, {summary['empty_images']} without objects{took}"
    )
    total = max(1, summary["objects"])
    rows = [
        (name, count, summary["images_per_class"][name], f"{100 * count / total:.1f} %")
        for name, count in summary["classes"].items()
    ]
    capped = cap_rows(rows, list(summary["classes"].values()), top)
    print_table(out, count_table(capped.title("object classes"), ("class", "objects", "images", "share"), capped.rows))
    print_rest(out, capped)
    if len(rows) > 1:
        empty = [name for name, count in summary["classes"].items() if count == 0]
        objects, images = (imbalance_ratio(list(summary[key].values())) for key in ("classes", "images_per_class"))
        out.print(imbalance_line(objects, images, empty), markup=False)
    if summary["image_classes"]:
        print_counts(out, "image classes", ("image class", "images"), summary["image_classes"], top)
    lm = summary["landmarks"]
    if lm["names"]:
        out.print(
            f"landmarks: {len(lm['names'])} ({', '.join(lm['names'][:8])}{'...' if len(lm['names']) > 8 else ''}); "
            f"flip pairs {len(lm['flip_pairs'])}; visible {lm['visible']}, hidden {lm['hidden']}, absent {lm['absent']}"
        )
    flips = summary["class_flips"]
    if flips["pairs"] or flips["one_sided"]:
        swapped = ", ".join(f"{a}<->{b}" for a, b in flips["pairs"]) or "none"
        alone = ", ".join(flips["one_sided"]) or "none"
        out.print(escape(f"classes with a side: a flip swaps {swapped}; never mirrored (no mirror class): {alone}"))
    print_attribute_counts(out, summary, top)
    if summary["splits"]:
        sources = split_sources or {}
        shown = (f"{k} {v}" + (f" ({sources[k]})" if k in sources else "") for k, v in summary["splits"].items())
        out.print("splits: " + escape(", ".join(shown)))


#: ``validate``'s rows per kind of problem on a terminal (``--per-kind``), before one that counts the rest.
PER_KIND = 5


def add_validate(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("validate", help="report every problem in a dataset's annotations")
    add_read_arguments(p, on_error_help="no effect here: validate always reads on and lists every problem")
    p.add_argument("--json", action="store_true", help="print the problems as JSON")
    p.add_argument("--limit", type=int, default=0, help="show at most this many rows (default: all)")
    p.add_argument(
        "--per-kind", type=int,
        help=f"rows of each kind of problem before one that counts the rest (0: all; default {PER_KIND} on a "
        "terminal, all in a pipe, so grep finds every one); --json lists all",
    )
    p.add_argument("--no-images", action="store_true", help="skip the image header checks")
    p.add_argument("--decode", action="store_true", help="also decode every image fully, in parallel")
    add_store_argument(p)
    p.set_defaults(func=_validate)


def _validate(args: argparse.Namespace) -> int:
    from rich.table import Table
    from rich.text import Text

    # on_error="skip": collect everything, then report
    index = read_index(args, reports_problems=True, bar=not args.json, description="validating", on_error="skip")
    report = index.problems
    if not args.no_images:
        from detloader.annotations.image_checks import check_images

        workers = (os.cpu_count() or 1) if args.decode else 1
        with progress_bar("decoding" if args.decode else "image headers", enabled=not args.json) as progress:
            for problem in check_images(
                index, decode=args.decode, workers=workers, progress=progress, reported=list(report)
            ):
                report.add(problem)
    stores = check_stores(index) if args.store else []
    failed = 1 if report.errors or stores_damaged(stores) else 0
    if args.json:
        # every problem, and per kind how many: the whole of them, never a first few
        print_json({"images": len(index), "objects": index.num_objects, "errors": len(report.errors),
                    "repairs": len(report.repairs), "total": len(report), "problems": report.counts(),
                    "items": report.to_list(), **({"stores": stores} if args.store else {})})
        return failed
    out = console()
    for line in store_lines(stores) if args.store else []:
        out.print(line, highlight=False, soft_wrap=True)
    if not report:
        out.print(f"[green]no problems[/green] in {len(index)} images, {index.num_objects} objects")
        return failed
    table = Table(title=f"{len(report)} problems")
    for column in ("file", "where", "kind", "problem", "action"):
        table.add_column(column, overflow="fold")
    per_kind = args.per_kind if args.per_kind is not None else (PER_KIND if out.is_terminal else 0)
    rows = _problem_rows(report, per_kind)
    shown = rows[: args.limit] if args.limit > 0 else rows
    for file, where, kind, problem, action, style in shown:
        table.add_row(Text(file), Text(where), f"[{style}]{kind}[/{style}]", Text(problem), Text(action))
    print_table(out, table)
    if len(shown) < len(rows):
        out.print(f"... {len(rows) - len(shown)} more rows (--limit 0 shows all)")
    out.print(
        problems_line(report)
        if report.errors
        else f"[green]no errors[/green] ({len(report.repairs)} repaired): {report.summary_line()}"
    )
    return failed


def _problem_rows(report: ProblemReport, per_kind: int) -> list[tuple[str, str, str, str, str, str]]:
    """The rows of ``validate``'s table (file, where, kind, problem, action, style), in file
    order: of a kind with more than ``per_kind`` problems (0: no limit) the first ``per_kind``,
    then one row in their place that says how many more there are and the kind's total."""
    counts, seen = report.counts(), Counter[str]()
    rows = []
    for p in report:
        seen[p.kind] += 1
        style = "red" if p.severity == "error" else "yellow"
        if per_kind <= 0 or seen[p.kind] <= per_kind:
            rows.append((p.file, p.element, p.kind, p.message, p.action, style))
        elif seen[p.kind] == per_kind + 1:
            rest, total = counts[p.kind] - per_kind, counts[p.kind]
            rows.append((f"... and {rest} more", "", p.kind, f"{total} in all (--per-kind 0 or --json lists every one)",
                         p.action, style))
    return rows


def add_split(sub: argparse._SubParsersAction) -> None:
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
    p.add_argument(
        "--force", action="store_true",
        help="replace the train/val splits the dataset has, cut from the images outside its test split, which "
        "stays as it is (a new test split only with --test F); says how many images change split",
    )
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(func=_split)


def _split(args: argparse.Namespace) -> int:
    from detloader.annotations.splits import make_splits, split_moves

    index = read_index(args, reports_problems=False, bar=not args.json, description="reading")
    require_images(index, "split")
    made = make_splits(index, val=args.val, test=args.test, seed=args.seed, force=args.force)
    parts = {name: made.split(name) for name in made.splits}
    summary = {
        name: {"images": len(part), "objects": part.class_counts(), "written": made.meta["split_sources"][name]}
        for name, part in parts.items()
    }
    moves = split_moves(index.splits, made.splits, len(index)) if index.splits else None
    if args.json:
        print_json({**summary, **({"moved": moves} if moves is not None else {})})
        return 0
    rows = [("images", *(len(part) for part in parts.values()))]
    rows += [(name, *(s["objects"][name] for s in summary.values())) for name in made.classes]
    out = console()
    print_table(out, count_table("images and objects per class", ("", *parts), rows))
    out.print(f"written in {made.root}:", markup=False)
    for name, s in summary.items():
        out.print(f"  {name}: {s['written']}", markup=False)
    if moves is not None:
        shown = ", ".join(f"{k} {v}" for k, v in moves.items())
        out.print(f"{sum(moves.values())} of {len(index)} images change split" + (f": {shown}" if moves else ""),
                  markup=False)
    return 0


def add_convert(sub: argparse._SubParsersAction) -> None:
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
        "without it and without a val split, data.yaml has no val (a note says so; Ultralytics needs one)",
    )
    p.add_argument("--seed", type=int, default=0, help="seed of --val-fraction (default 0)")
    p.add_argument("--overwrite", action="store_true", help="write into a non-empty OUT")
    p.set_defaults(func=_convert)


def _convert(args: argparse.Namespace) -> int:
    from detloader.annotations.writers import write_annotations
    from detloader.errors import YoloExportWarning

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


def add_pack(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "pack",
        help="pack a dataset (its index and images) into shards for an object store",
        description="Read SRC (any format detloader reads) and write OUT: the index and every image's original "
        "bytes in shards of litdata's chunk format, with a manifest of their sha256. Upload OUT (aws s3 sync OUT "
        "s3://bucket/prefix) and read it from there: detloader index s3://bucket/prefix. Packing the same data "
        "again writes the same bytes. Needs the stream extra (pip install 'detloader[stream]').",
    )
    add_read_arguments(p)
    p.add_argument("out", help="output folder (created; must be empty unless --overwrite)")
    p.add_argument("--shard-size", type=parse_bytes, default="64MB", metavar="BYTES",
                   help="most bytes of one shard: 64MB (default), 256MiB, ...")
    p.add_argument("--overwrite", action="store_true", help="replace what OUT holds")
    p.set_defaults(func=_pack)


def _pack(args: argparse.Namespace) -> int:
    from detloader.annotations.writers.pack import write_pack

    index = read_index(args, reports_problems=True)
    require_images(index, "pack")
    with progress_bar("packing", enabled=True) as progress:
        out = write_pack(index, args.out, args.shard_size, overwrite=args.overwrite, progress=progress)
    from detloader.annotations.pack import MANIFEST_NAME, PackManifest

    manifest = PackManifest.from_json((out / MANIFEST_NAME).read_bytes())
    shown = console()
    shown.print(f"packed {len(index)} images, {index.num_objects} objects in {len(manifest.shards)} shards "
                f"({manifest.total_bytes / 2**20:.1f} MiB) to {out}")
    if index.problems:
        shown.print(f"[yellow]source problems: {problems_line(index.problems)}[/yellow] (packed with the index)")
    return 0


def add_show(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("show", help="draw a grid of images with boxes, class names, landmarks and image classes")
    add_read_arguments(p)
    p.add_argument("--out", default="grid.png", help="picture to write (default: grid.png)")
    p.add_argument("--n", type=int, default=16, help="images in the grid (default: 16)")
    p.add_argument("--split", help="only images of this split (ImageSets/Main/SPLIT.txt or a split file)")
    p.add_argument("--class", dest="class_name", metavar="C", help="only images with an object (or image class) C")
    p.add_argument(
        "--after-transform",
        action="store_true",
        help="show augmented samples (random horizontal flip, then letterbox to --size) instead of the stored images",
    )
    p.add_argument("--size", type=int, default=320, help="letterbox side with --after-transform (default: 320)")
    p.add_argument("--flip", type=float, default=0.5, help="flip probability with --after-transform (default: 0.5)")
    p.add_argument(
        "--affine", action="store_true",
        help="with --after-transform: a random affine first (10 degrees, scale 0.75-1.25, shear 2)",
    )
    p.add_argument(
        "--mosaic", type=float, default=0.0, metavar="P",
        help="with --after-transform: share of mosaics of each image and the next 3 (default: 0)",
    )
    p.add_argument("--tile", type=int, default=256, help="pixels per tile (default: 256)")
    p.add_argument("--seed", type=int, default=0, help="which images, and the augmentation (default: 0)")
    add_cache_arguments(p)
    p.set_defaults(func=_show)


def _show(args: argparse.Namespace) -> int:
    from detloader.dataset import DetectionDataset
    from detloader.stats.show import show_dataset

    index = read_index(args, reports_problems=False, bar=True)
    require_images(index, "show")
    if args.split is not None:
        index = index.split(args.split)
    data = index
    if args.cache and not args.after_transform:
        raise DetloaderValueError(
            "--cache applies with --after-transform (the grid otherwise shows the files as they are)"
        )
    if args.after_transform:
        from detloader.transforms import Compose, Mosaic, RandomAffine, RandomHorizontalFlip, Resize

        if args.size < 1:
            raise DetloaderValueError(f"--size={args.size} must be >= 1")
        affine = [RandomAffine(10, scale=(0.75, 1.25), shear=2)] if args.affine else []
        transform = Compose([*affine, RandomHorizontalFlip(p=args.flip), Resize(args.size, mode="letterbox")])
        data = DetectionDataset(index, transform, seed=args.seed, cache=args.cache, cache_size=args.cache_size)
        if args.mosaic:
            data = data.with_mix(Mosaic(args.mosaic))
    grid = show_dataset(
        data, args.out, n=args.n, class_name=args.class_name, after_transform=args.after_transform,
        seed=args.seed, tile=args.tile,
    )
    w, h = grid.image.size
    console().print(f"{grid.path}: {len(grid.image_ids)} images, {w}x{h} pixels")
    return 0
