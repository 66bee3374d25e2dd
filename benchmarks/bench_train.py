"""Training evidence on the synthetic dataset, same seed and budget for every contender.

1. balancing: ``balance=none`` vs a balancing strategy (default ``sqrt``) by object class and
   by image class: per-class recall / AP (minority classes ``masked`` ~8 %, ``sunglasses``
   ~2 %), image-class accuracy and the recall of the rare image class ``night`` (~5 %).
2. loading: ``data_wait_fraction`` with ``num_workers=0`` vs ``num_workers="auto"`` (a short
   run each, no evaluation).

    python benchmarks/bench_train.py [--epochs 20] [--balance sqrt] [--out runs/bench_train]

Prints one table per part and writes ``OUT/bench_train.json``. Figures and discussion:
docs/training.md.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path


def _row(name: str, m: dict) -> dict:
    pc = m["per_class"]
    return {
        "run": name,
        "map50": m["map50"],
        "map50_95": m["map50_95"],
        **{f"{c}_{k}": pc[c][k] for c in pc for k in ("recall", "ap50")},
        "image_class_accuracy": m["image_class_accuracy"],
        "image_class_recall": m["image_class_recall"],
        "nme": m["nme"],
        "data_wait_fraction": m["data_wait_fraction"],
        "train_seconds": m["train_seconds"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--epochs", type=int, default=None, help="default: TrainConfig's")
    parser.add_argument("--balance", default="sqrt", help="strategy compared with none (default sqrt)")
    parser.add_argument("--wait-epochs", type=int, default=2, help="epochs of each data-wait run")
    parser.add_argument("--out", default="runs/bench_train")
    parser.add_argument("--skip-balance", action="store_true")
    args = parser.parse_args()

    from rich.console import Console
    from rich.table import Table

    from detloader.train import TrainConfig, train

    out = Path(args.out)
    base = TrainConfig(out=str(out / "data"))
    if args.epochs:
        base = base.replace(epochs=args.epochs)
    console = Console(width=max(Console().width, 120))
    console.print(f"{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f}; config: size {base.size}, "
                  f"{base.epochs} epochs, batch {base.batch_size}, {base.synthetic_images} images, seed {base.seed}")
    result: dict = {"config": base.to_dict(), "balance": [], "data_wait": []}

    if not args.skip_balance:
        for balance, by in (("none", "class"), (args.balance, "class"), (args.balance, "image_class")):
            t = time.perf_counter()
            name = f"{balance.replace(':', '_')}_{by}"
            m = train(base.replace(balance=balance, balance_by=by, out=str(out / f"balance_{name}")))
            row = _row(f"balance={balance}" + (f" by {by}" if balance != "none" else ""), m)
            row["wall_seconds"] = time.perf_counter() - t
            result["balance"].append(row)
        table = Table(title="balancing: same seed, same budget (val split)")
        for col in ("run", "mAP@.5", "mAP@.5:.95", "masked R / AP50", "sunglasses R / AP50", "image acc", "night recall"):
            table.add_column(col)
        for r in result["balance"]:
            table.add_row(
                r["run"], f"{r['map50']:.3f}", f"{r['map50_95']:.3f}",
                f"{r['masked_recall']:.2f} / {r['masked_ap50']:.3f}",
                f"{r['sunglasses_recall']:.2f} / {r['sunglasses_ap50']:.3f}",
                f"{r['image_class_accuracy']:.3f}", str(r["image_class_recall"].get("night")),
            )
        console.print(table)

    for workers in (0, "auto"):
        m = train(base.replace(num_workers=workers, epochs=args.wait_epochs, evaluate=False, out=str(out / f"wait_{workers}")))
        result["data_wait"].append(
            {"num_workers": workers, "resolved": m["num_workers"], "data_wait_fraction": m["data_wait_fraction"],
             "per_epoch": [e["data_wait_fraction"] for e in m["epochs"]], "train_seconds": m["train_seconds"]}
        )
    table = Table(title=f"data wait share of step time ({args.wait_epochs} epochs each)")
    for col in ("num_workers", "resolved to", "data wait", "per epoch", "train s"):
        table.add_column(col)
    for r in result["data_wait"]:
        table.add_row(str(r["num_workers"]), str(r["resolved"]), f"{100 * r['data_wait_fraction']:.1f} %",
                      ", ".join(f"{100 * f:.1f} %" for f in r["per_epoch"]), f"{r['train_seconds']:.1f}")
    console.print(table)
    out.mkdir(parents=True, exist_ok=True)
    (out / "bench_train.json").write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
