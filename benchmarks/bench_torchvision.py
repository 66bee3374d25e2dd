"""torchvision's ``VOCDetection`` against detloader's best setting, measured where torchvision
loads: its wheels need the torch build they were made for (``operator torchvision::nms does not
exist`` beside the pinned CPU torch), so this runs in ``.venv-integration`` (torch 2.14.1 +
torchvision 0.29.1)::

    make bench-torchvision                                   # builds that environment first
    .venv-integration/bin/python benchmarks/bench_torchvision.py DATA --out benchmarks/results/torchvision.json

``DATA``: a VOC layout (``Annotations/*.xml`` + ``JPEGImages/``). The run is ``detloader bench``'s
loader section (same resize to ``--size`` square, uint8 / float tensors, collate, decode ceiling,
every setting, the median of ``--repeats`` round-robin runs); the JSON is its report with the
date and versions. ``detloader bench`` in the main environment, where torchvision cannot load,
reports that run's best setting / torchvision from the file (``$DETLOADER_TORCHVISION_RESULT``
names another).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from detloader.tune.bench import BenchSettings, run_bench


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("data")
    p.add_argument("--out", default="benchmarks/results/torchvision.json")
    p.add_argument("--size", type=int, default=384)
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--repeats", type=int, default=3)
    args = p.parse_args()
    import torchvision

    settings = BenchSettings.make(sections=["loader"], size=args.size, batch_size=args.batch_size, repeats=args.repeats)
    report = run_bench(args.data, settings, progress=lambda s: print(f"measuring: {s}", file=sys.stderr))
    loader = report.figures["loader"]
    if not loader.get("torchvision"):
        print("torchvision was not measured:\n" + "\n".join(report.notes), file=sys.stderr)
        return 1
    report.settings.update(torchvision=torchvision.__version__, data_path=args.data)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(report.to_dict(), indent=1) + "\n")
    print(report.table())
    ratio = loader['best_setting_rate'] / max(loader['torchvision'].values())
    print(f"best / torchvision: {ratio:.2f}; wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
