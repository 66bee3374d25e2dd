"""``detloader stats PATH``: class distributions, imbalance, and what a balancing strategy does.

Without ``--balance``: objects and images per class, image classes, attributes, landmark
visibility, box-size quantiles, imbalance ratios. With ``--balance STRATEGY``: the raw
per-epoch distribution beside the expected one after balancing (from the weights) and one real
draw, and a warning when one image would be drawn over 10 times per epoch in expectation.
``--json``: one object with ``raw`` and ``balanced`` (group -> count per epoch).
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from detloader.annotations.problems import check_choice
from detloader.cli import _class_rows as class_rows
from detloader.cli import _common as common
from detloader.errors import DetloaderValueError


def add_stats(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("stats", help="class distributions and imbalance, raw and after a balancing strategy")
    common.add_read_arguments(p)
    p.add_argument(
        "--by", default="class",
        help="group by: class (default), image_class (or image), attribute:NAME, "
        "image_attribute:NAME, or a comma-separated product (class,image_class)",
    )
    p.add_argument(
        "--unit", choices=("objects", "images"),
        help="count objects (default for object keys) or images containing the group",
    )
    p.add_argument(
        "--balance", metavar="STRATEGY", help="inverse, sqrt, power:P, effective[:BETA], repeat_factor[:T], class_aware"
    )
    p.add_argument("--num-samples", type=int, help="draws per epoch (default: number of images)")
    p.add_argument(
        "--split", metavar="NAME",
        help="only the images of this split (train of a data.yaml: what detloader.ultralytics balances)",
    )
    p.add_argument("--seed", type=int, default=0, help="seed of the checking draw (default 0)")
    p.add_argument("--plot", metavar="OUT.png", help="write raw vs balanced bars to this PNG")
    p.add_argument(
        "--log", nargs="?", const="on", default="auto", choices=("auto", "on", "off"),
        help="log y axis of --plot: on (bare --log), off, or auto (default: when the largest "
        "bar is over 20 times the smallest)",
    )
    class_rows.add_top_argument(p)
    p.add_argument("--json", action="store_true", help="print one JSON object (every class)")
    p.set_defaults(func=_stats)


def _by(value: str) -> tuple[str, ...]:
    """``--by`` as keys, each checked (``did you mean``) before the dataset is read."""
    parts = tuple("image_class" if p == "image" else p for p in (p.strip() for p in value.split(",")))
    for part in parts:
        if not part.startswith(("attribute:", "image_attribute:")):
            check_choice("--by", part, ("class", "image_class", "image", "attribute:NAME", "image_attribute:NAME"))
    return parts


def _stats(args: argparse.Namespace) -> int:
    from detloader.balance.weights import check_strategy
    from detloader.stats import balance_report, dataset_stats, plot_balance, training_frequency

    by = _by(args.by)
    if args.balance:
        check_strategy(args.balance, setting="--balance")
    index = common.read_index(args, reports_problems=True, bar=not args.json)
    frequency = training_frequency(index)  # from the whole dataset's train split, before --split
    if args.split:
        index = index.split(args.split)
    common.require_images(index, "describe")
    if "image_class" in by and not index.image_classes:
        raise DetloaderValueError(f"--by image_class: {common.dataset_location(index)} has no image classes (an "
                                  "image attribute 'class', a CVAT tag); --by class groups by object class")
    stats = dataset_stats(index, frequency)
    report = None
    if args.balance:
        report = balance_report(
            index, args.balance, by=by, unit=args.unit, seed=args.seed, num_samples=args.num_samples,
            frequency=frequency[0],
        )
    body = report.to_dict() if report is not None else _raw_only(index, by, args.unit)  # what --json prints
    if args.plot:
        if report is None:
            raise DetloaderValueError("--plot needs --balance STRATEGY (the plot is raw vs balanced)")
        try:
            plot_balance(report, args.plot, log=_log(args.log), top=args.top)
        except ImportError as err:
            print(f"detloader stats: error: {err}", file=sys.stderr)
            return 2
    if args.json:
        problems = index.problems.counts()
        common.print_json({"path": common.dataset_location(index), "by": list(by), **body, "stats": stats,
                           "problems": problems})
        return 0
    print_stats(index, stats, args.top)
    if report is not None:
        print_balance(report, args.top)
        if args.plot:
            from detloader.stats import use_log_scale

            log_scale = use_log_scale(report, _log(args.log))
            common.console().print(f"plot: {args.plot}" + (" (log scale)" if log_scale else ""))
    if index.problems:
        line = common.problems_line(index.problems)
        common.console().print(f"\n[yellow]{line}[/yellow] (detloader validate lists them)")
    return 0


def _log(value: str) -> bool | str:
    """``--log`` as :func:`detloader.stats.plot_balance` takes it."""
    return {"on": True, "off": False}.get(value, "auto")


def _raw_only(index: Any, by: tuple[str, ...], unit: str | None) -> dict[str, Any]:
    import numpy as np

    from detloader.balance.groups import balance_groups
    from detloader.stats import default_unit, group_totals

    groups = balance_groups(index, by)
    unit = unit or default_unit(groups)
    raw = group_totals(groups, np.ones(len(index)), unit)  # type: ignore[arg-type]
    return {"unit": unit, "raw": {n: int(round(float(v))) for n, v in zip(groups.names, raw)}, "balanced": None}


def print_stats(index: Any, stats: dict[str, Any], top: int = class_rows.TOP) -> None:
    """What ``detloader stats`` prints of :func:`detloader.stats.dataset_stats`: the ``top``
    largest classes (0: all), a line on the rest, the imbalance ratios."""
    from rich.markup import escape

    out = common.console()
    out.print(
        f"[bold]{escape(common.dataset_location(index))}[/bold]: {stats['images']} images, {stats['objects']} objects "
        f"({stats['objects_per_image']['mean']:.2f} per image, max {stats['objects_per_image']['max']}), "
        f"{stats['empty_images']} without objects"
    )
    total = max(1, stats["objects"])
    medians = stats["box_sqrt_area_median"]
    rows = [
        (name, c["objects"], f"{100 * c['objects'] / total:.1f} %", c["images"],
         "-" if medians[name] is None else f"{medians[name]:.0f}")
        for name, c in stats["classes"].items()
    ]
    counts = [c["objects"] for c in stats["classes"].values()]
    capped = class_rows.cap_rows(rows, counts, top)
    columns = ("class", "objects", "share", "images", "median box (px)")
    common.print_table(out, common.count_table(capped.title("object classes"), columns, capped.rows))
    class_rows.print_rest(out, capped)
    ratio = stats["imbalance_ratio"]
    out.print(class_rows.imbalance_line(ratio["objects"], ratio["images"], stats["empty_classes"]), markup=False)
    print_frequency_groups(out, stats["frequency_groups"])
    if stats["image_classes"]:
        common.print_counts(out, "image classes", ("image class", "images"), stats["image_classes"], top)
        out.print(
            f"image-class imbalance ratio {class_rows.ratio_text(stats['image_class_imbalance_ratio'])}; "
            f"{stats['images_without_image_class']} images without an image class"
        )
    common.print_attribute_counts(out, stats, top)
    if stats["landmarks"]:
        rows = [(name, v["visible"], v["hidden"], v["absent"]) for name, v in stats["landmarks"].items()]
        columns = ("landmark", "visible", "hidden", "absent")
        common.print_table(out, common.count_table("landmark visibility", columns, rows))
    box = stats["box_size"]
    if box["width"]:
        rows = [(key, *(f"{v:.0f}" for v in box[key])) for key in ("width", "height", "sqrt_area")]
        rows.append(("sqrt_area / image", *(f"{v:.3f}" for v in box["relative_sqrt_area"])))
        header = ("box size", *(f"q{q:g}" for q in box["quantiles"]))
        common.print_table(out, common.count_table("box sizes (pixels)", header, rows))


def print_frequency_groups(out: Any, groups: dict[str, Any]) -> None:
    """The LVIS frequency groups of :func:`detloader.stats.frequency_summary`: a table of
    classes, images and objects per group, and the classes in none."""
    from detloader.stats import COMMON_MAX_IMAGES, FREQUENCIES, RARE_MAX_IMAGES
    from detloader.stats.describe import FREQUENCY_FIELD

    rows = [(name, groups[name]["classes"], groups[name]["images"], groups[name]["objects"])
            for name in FREQUENCIES.values()]
    given = groups["source"] == FREQUENCY_FIELD
    title = (f"frequency groups by training images (rare 1-{RARE_MAX_IMAGES}, common "
             f"{RARE_MAX_IMAGES + 1}-{COMMON_MAX_IMAGES}, frequent over {COMMON_MAX_IMAGES}; "
             f"from {groups['source']})") if not given else f"frequency groups (from {FREQUENCY_FIELD})"
    common.print_table(out, common.count_table(title, ("group", "classes", "images", "objects"), rows))
    none = groups["without_training_images"]
    if none:
        why = "no frequency given" if given else "no training image"
        out.print(f"{len(none):,} classes in no group ({why}): {class_rows.named(none)}", markup=False)


def print_balance(report: Any, top: int = class_rows.TOP) -> None:
    """What ``detloader stats --balance`` prints of a :class:`detloader.stats.BalanceReport`:
    the ``top`` groups largest raw (0: all), a line on the rest, the imbalance ratios."""
    from rich.markup import escape

    from detloader.stats import summary_rows

    out = common.console()
    data = report.to_dict()
    rows = [
        (row["name"], f"{row['raw']:.0f}", f"{100 * row['raw_share']:.1f}", f"{row['expected']:.1f}",
         f"{100 * row['expected_share']:.1f}", "-" if row["drawn"] is None else f"{row['drawn']:.0f}",
         "-" if row["factor"] is None else f"{row['factor']:.2f}")
        for row in summary_rows(report)
    ]
    capped = class_rows.cap_rows(rows, report.raw.tolist(), top, unit=report.unit, noun="groups")
    title = (
        f"balance {report.strategy} by {','.join(report.by)}: {report.unit} per epoch "
        "(expected from the weights; one real draw beside)"
    )
    header = ("group", "raw / epoch", "raw %", "balanced / epoch", "balanced %", f"drawn (seed {report.seed})", "x")
    common.print_table(out, common.count_table(capped.title(title, "; ", " groups"), header, capped.rows))
    class_rows.print_rest(out, capped)
    if capped.rest:
        shown = {row[0] for row in capped.rows}
        hidden = [i for i, name in enumerate(report.names) if name not in shown]
        raw_share = float(report.raw[hidden].sum()) / (float(report.raw.sum()) or 1.0)
        balanced_share = float(report.expected[hidden].sum()) / (float(report.expected.sum()) or 1.0)
        out.print(f"those {len(hidden):,} groups together: raw {100 * raw_share:.1f} %, "
                  f"balanced {100 * balanced_share:.1f} %")
    length = data["epoch_length"]
    ratio = data["imbalance_ratio"]
    dev = data["max_drawn_deviation"]
    out.print(
        f"images per epoch: raw {length['raw']:.0f}, balanced {length['balanced']:.1f} (expected); "
        f"imbalance ratio {class_rows.ratio_text(ratio['raw'])} -> {class_rows.ratio_text(ratio['balanced'])}"
        + ("" if dev is None else f"; the draw is within {100 * dev:.1f} % of the expectation")
    )
    if len(report.frequency_names):
        shares = ", ".join(f"{name} {100 * r:.1f} % -> {100 * e:.1f} %" for name, r, e in
                           zip(report.frequency_names, report.frequency_raw, report.frequency_expected))
        out.print(f"share of an epoch's {report.unit} by frequency group, raw -> balanced: {shares}", markup=False)
    for note in report.notes:
        out.print(f"[yellow]note:[/yellow] {escape(note)}")
    for warning in report.warnings:
        out.print(f"[bold yellow]warning:[/bold yellow] {escape(warning)}")
