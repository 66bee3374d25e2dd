"""What ``balanced_trainer`` does to the rare class of a real dataset with transformers' ``Trainer``:
a small Conditional DETR built from its config (random weights, no download) trained by
``Trainer`` itself (its uniform draw: ``none``) and by ``balanced_trainer(balance)``, same
budget, arguments and seeds (only the draw differs), scored by
``coco_metrics``: per-class AP@0.5 and AP@0.5:0.95 on the validation split.

    python benchmarks/bench_transformers_balance.py ../shared/datasets/bccd [--balance sqrt]
        [--epochs 30] [--seeds 0 1] [--size 192] [--out runs/bench_transformers_balance]

Prints one table and writes ``OUT/bench_transformers_balance.json``. Figures and discussion:
docs/transformers.md, "What the balance does on a real dataset".
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")


def _model(names: dict[int, str]):
    from transformers import ConditionalDetrConfig, ConditionalDetrForObjectDetection, ResNetConfig

    backbone = ResNetConfig(embedding_size=16, hidden_sizes=[16, 32, 64, 128], depths=[1, 1, 1, 1],
                            out_features=["stage4"])
    config = ConditionalDetrConfig(
        use_timm_backbone=False, use_pretrained_backbone=False, backbone_config=backbone, d_model=64,
        encoder_layers=2, decoder_layers=2, encoder_attention_heads=4, decoder_attention_heads=4,
        encoder_ffn_dim=128, decoder_ffn_dim=128, num_queries=60, num_labels=len(names), id2label=names,
        label2id={v: k for k, v in names.items()},
    )
    return ConditionalDetrForObjectDetection(config)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("data")
    parser.add_argument("--balance", default="sqrt")
    parser.add_argument("--epochs", type=int, default=30)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    parser.add_argument("--size", type=int, default=192, help="the processor's longest edge (default 192)")
    parser.add_argument("--out", default="runs/bench_transformers_balance")
    args = parser.parse_args()

    from rich.console import Console
    from rich.table import Table
    from transformers import ConditionalDetrImageProcessorPil, Trainer, TrainingArguments

    from detloader import read_annotations
    from detloader.transformers import balanced_trainer, coco_metrics, detection_dataset, id2label

    index = read_annotations(args.data, on_error="warn")
    processor = ConditionalDetrImageProcessorPil(size={"shortest_edge": args.size * 3 // 4, "longest_edge": args.size})
    train, val = detection_dataset(index.split("train"), processor), detection_dataset(index.split("val"), processor)
    names = id2label(train)
    out = Path(args.out)
    console = Console(width=max(Console().width, 120))
    console.print(f"{args.data}: {len(train)} training, {len(val)} validation images; {args.epochs} epochs at "
                  f"{args.size} px, seeds {args.seeds}; {os.cpu_count()} CPUs, load {os.getloadavg()[0]:.1f}")
    runs: dict[str, list[dict]] = {}
    for balance in ("none", args.balance):
        for seed in args.seeds:
            t = time.perf_counter()
            training = TrainingArguments(
                str(out / f"{balance}_{seed}"), num_train_epochs=args.epochs, per_device_train_batch_size=8,
                per_device_eval_batch_size=8, learning_rate=2e-4, weight_decay=1e-4, lr_scheduler_type="cosine",
                warmup_steps=0.05, max_grad_norm=0.1, use_cpu=True, report_to=[], remove_unused_columns=False,
                save_strategy="no", logging_strategy="no", disable_tqdm=True, seed=seed,
                eval_do_concat_batches=False)
            kind = Trainer if balance == "none" else balanced_trainer(balance, seed=seed)
            trainer = kind(model=_model(names), args=training, train_dataset=train, eval_dataset=val,
                           data_collator=train.collate, compute_metrics=coco_metrics(val, processor))
            trainer.train()
            m = trainer.evaluate()
            row = {"seed": seed, "seconds": time.perf_counter() - t, "map50": m["eval_map50"],
                   "map50_95": m["eval_map50_95"],
                   **{f"ap50/{c}": m.get(f"eval_ap50/{c}") for c in names.values()},
                   **{f"ap50_95/{c}": m.get(f"eval_ap50_95/{c}") for c in names.values()}}
            runs.setdefault(balance, []).append(row)
            console.print(f"balance={balance} seed {seed}: mAP50 {row['map50']:.3f}, "
                          + ", ".join(f"{c} {row[f'ap50/{c}']:.3f}" for c in names.values())
                          + f" ({row['seconds']:.0f} s)")
    keys = ["map50", "map50_95", *(f"ap50/{c}" for c in names.values())]
    table = Table(title=f"mean ± sd over seeds {args.seeds} (AP@0.5 per class, validation split)")
    for col in ("balance", *keys):
        table.add_column(col)
    for balance, rows in runs.items():
        cells = []
        for k in keys:
            values = [r[k] for r in rows if r[k] is not None]
            sd = statistics.stdev(values) if len(values) > 1 else 0.0
            cells.append(f"{statistics.fmean(values):.3f} ± {sd:.3f}" if values else "-")
        table.add_row(balance, *cells)
    console.print(table)
    out.mkdir(parents=True, exist_ok=True)
    result = {"args": vars(args), "runs": runs}
    (out / "bench_transformers_balance.json").write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
