"""What balancing does to the rare classes: the reference model trained with ``balance=none``,
``sqrt`` and ``repeat_factor`` (the LVIS paper's sampler, threshold 0.001), same budget, several
seeds each, scored as the long-tail papers report it: overall AP@0.5:0.95 and APr / APc / APf
(classes grouped by their number of training images: 1-10 rare, 11-100 common, over 100
frequent), as mean and spread over the seeds.

Datasets: ``zipf30``, a synthetic set of 30 classes whose shares follow a Zipf law (exponent
1.5; class k > 2 wears a hat of its own colour), and any folder given with ``--data NAME=PATH``
(e.g. ``bccd=../shared/datasets/bccd``; skipped when absent). Objects the reader cannot take
(BCCD: 2 empty boxes) are left out with a warning that counts them.

    python benchmarks/bench_balance_effect.py [--seeds 0 1 2] [--epochs 10] [--images 600] [--size 96]
        [--data bccd=../shared/datasets/bccd] [--data-size 192] [--out runs/bench_balance_effect]

Prints one table per dataset and writes ``OUT/bench_balance_effect.json``. Figures and
discussion: docs/training.md, "What balancing does to the rare classes".
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from pathlib import Path

FIGURES = ("map50_95", "apr", "apc", "apf")
ZIPF_CLASSES = 30
ZIPF_EXPONENT = 1.5


def zipf_set(root: Path, images: int) -> Path:
    """The synthetic long-tail set (written once per size)."""
    from detloader.synth import make_synthetic

    out = root / f"zipf30_{images}"
    if not (out / "Annotations").is_dir():
        shares = [k ** -ZIPF_EXPONENT for k in range(1, ZIPF_CLASSES + 1)]
        total = sum(shares)
        make_synthetic(out, images, seed=0, size=(160, 120), classes=[f"c{k:02d}" for k in range(ZIPF_CLASSES)],
                       class_frequencies=[s / total for s in shares])
    return out


def _spread(values: list[float | None]) -> dict:
    known = [v for v in values if v is not None]
    if not known:
        return {"mean": None, "sd": None, "values": values}
    return {"mean": statistics.fmean(known), "sd": statistics.stdev(known) if len(known) > 1 else 0.0,
            "values": values}


def _cell(s: dict) -> str:
    return "-" if s["mean"] is None else f"{s['mean']:.3f} ± {s['sd']:.3f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--balances", nargs="+", default=["none", "sqrt", "repeat_factor:0.001"])
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--size", type=int, default=96, help="training image size of zipf30 (default 96)")
    parser.add_argument("--images", type=int, default=600, help="images of the zipf30 set (default 600)")
    parser.add_argument("--data", action="append", default=[], metavar="NAME=PATH", help="another dataset")
    parser.add_argument("--data-size", type=int, default=192, help="training image size of those (default 192)")
    parser.add_argument("--no-zipf", action="store_true", help="only the datasets given with --data")
    parser.add_argument("--out", default="runs/bench_balance_effect")
    args = parser.parse_args()

    from rich.console import Console
    from rich.table import Table

    from detloader.train import TrainConfig, train

    out = Path(args.out)
    datasets = {} if args.no_zipf else {"zipf30": (zipf_set(out, args.images), args.size)}
    for item in args.data:
        name, _, path = item.partition("=")
        if Path(path).is_dir():
            datasets[name] = (Path(path), args.data_size)
        else:
            print(f"skipped {name}: {path} is not a folder")
    console = Console(width=max(Console().width, 120))
    console.print(f"{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f}; {args.epochs} epochs, "
                  f"seeds {args.seeds}")
    result: dict = {"epochs": args.epochs, "seeds": args.seeds, "datasets": {}, "sizes": {}}
    for name, (root, size) in datasets.items():
        result["sizes"][name] = size
        rows = []
        for balance in args.balances:
            runs = []
            for seed in args.seeds:
                t = time.perf_counter()
                config = TrainConfig(data=str(root), out=str(out / name / f"{balance.replace(':', '_')}_{seed}"),
                                     balance=balance, seed=seed, epochs=args.epochs, size=size,
                                     exist_ok=True, amp=False, read_options={"on_error": "warn"})
                m = train(config)
                runs.append({"seed": seed, **{k: m[k] for k in FIGURES}, "seconds": time.perf_counter() - t,
                             "groups": {g: v["classes"] for g, v in m["frequency_groups"].items()
                                        if isinstance(v, dict)},
                             "per_class": {c: r["ap50_95"] for c, r in m["per_class"].items()}})
                console.print(f"{name} balance={balance} seed {seed}: AP {m['map50_95']:.3f}, "
                              f"APr {m['apr']}, APc {m['apc']}, APf {m['apf']} ({runs[-1]['seconds']:.0f} s)")
            rows.append({"balance": balance, "runs": runs, **{k: _spread([r[k] for r in runs]) for k in FIGURES}})
        result["datasets"][name] = rows
        groups = rows[0]["runs"][0]["groups"]
        table = Table(title=f"{name}: mean ± sd over {len(args.seeds)} seeds (classes: {groups.get('rare', 0)} rare, "
                            f"{groups.get('common', 0)} common, {groups.get('frequent', 0)} frequent)")
        for col in ("balance", "AP", "APr", "APc", "APf"):
            table.add_column(col)
        for r in rows:
            table.add_row(r["balance"], *(_cell(r[k]) for k in FIGURES))
        console.print(table)
    out.mkdir(parents=True, exist_ok=True)
    (out / "bench_balance_effect.json").write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
