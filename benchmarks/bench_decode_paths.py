"""Loader throughput against the decode ceiling: worker processes, decode threads, both.

One run measures, side by side and interleaved (best of ``--repeats`` rounds, each setting in
a fresh process):

Each setting reports images/s of wall time and images per CPU-second (the process and its
workers); the second tells how much work the loader adds to decode + resize, and is less
disturbed by other jobs on a shared machine than the first.

* **ceiling**: one core reading, decoding (libjpeg-turbo via simplejpeg, full size) and
  bilinear-resizing (torch, to the letterbox content size) every image, nothing else; times the
  usable CPUs, it is what the machine can decode and resize.
* **after**: this tree's ``DetectionDataset(index, Resize(384, mode="letterbox"))`` ->
  ``make_loader(batch_size=16, num_workers=W, decode_threads=T)`` for W in ``--workers`` and T
  in ``--threads``, persistent workers, one warm-up epoch, then ``--epochs`` timed epochs.
* **before** (``--baseline-src DIR``: the ``src`` folder of another checkout): the same loader
  from that tree, ``decode_threads`` 0 only (older trees have no threads).
* ``--tune``: ``tune_loader`` on the same dataset (``--tune-budget`` seconds, all usable CPUs:
  ``respect_busy=False``) and where its choice ranks among the measured settings.
* ``--profile``: cProfile of one epoch of ``__getitem__`` + collate in one process, before and
  after, top entries by own time.

Data: ``--images`` synthetic JPEGs of ``--size`` (default 470x370) and, unless ``--no-bccd``,
../shared/datasets/bccd when present (640x480 photographs), and the folders in ``--data``.

Run: ``python benchmarks/bench_decode_paths.py --baseline-src ../main/src --tune --profile``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
SRC = HERE.parent / "src"
BCCD = HERE.parents[1] / "shared" / "datasets" / "bccd"
SIZE = 384
BATCH = 16


# -- child side: one measurement, in a fresh process ---------------------------------------
def _dataset(root: str) -> Any:
    from detloader import DetectionDataset, read_annotations
    from detloader.transforms import Resize

    index = read_annotations(root, on_error="skip")
    return DetectionDataset(index, Resize(SIZE, mode="letterbox"), seed=0)


def _cpu_s(proc: Any) -> float:
    """CPU seconds of ``proc`` and its live children (the loader's workers)."""
    import psutil

    total = 0.0
    for p in [proc, *proc.children(recursive=True)]:
        try:
            t = p.cpu_times()
        except psutil.Error:
            continue
        total += t.user + t.system
    return total


def _ceiling(root: str, epochs: int) -> dict[str, float]:
    import simplejpeg
    import torch.nn.functional as F
    import torch

    dataset = _dataset(root)
    paths = [dataset.index.image_path(i) for i in range(len(dataset))]

    def one_pass() -> tuple[float, float]:
        t, c = time.perf_counter(), time.thread_time()
        for p in paths:
            with open(p, "rb") as fh:
                image = simplejpeg.decode_jpeg(fh.read(), colorspace="RGB")
            h, w = image.shape[:2]
            s = min(SIZE / w, SIZE / h)
            x = torch.from_numpy(image).permute(2, 0, 1).unsqueeze(0)
            F.interpolate(x, size=(round(h * s), round(w * s)), mode="bilinear", align_corners=False)
        return len(paths) / (time.perf_counter() - t), len(paths) / (time.thread_time() - c)

    one_pass()  # page cache, first-call costs
    runs = [one_pass() for _ in range(epochs)]
    return {"rate": max(r[0] for r in runs), "cpu_rate": max(r[1] for r in runs)}


def _loader_rate(root: str, workers: int, threads: int, epochs: int) -> dict[str, float]:
    """Images per second of wall time, and per CPU second (this process and its workers)."""
    import psutil

    from detloader import make_loader

    dataset = _dataset(root)
    extra: dict[str, Any] = {"persistent_workers": True} if workers else {}
    if threads:
        extra["decode_threads"] = threads
    loader = make_loader(dataset, batch_size=BATCH, num_workers=workers, **extra)
    for _ in loader:  # warm-up epoch: worker start, page cache
        pass
    me = psutil.Process()
    rate = cpu_rate = 0.0
    for _ in range(epochs):
        t, c = time.perf_counter(), _cpu_s(me)
        n = sum(len(batch) for batch in loader)
        rate = max(rate, n / (time.perf_counter() - t))
        cpu_rate = max(cpu_rate, n / (_cpu_s(me) - c))
    return {"rate": rate, "cpu_rate": cpu_rate}


def _tune(root: str, budget: float) -> dict[str, Any]:
    from detloader import tune_loader

    # respect_busy=False: the tuner searches all usable CPUs, as the grid above does, also
    # when other jobs keep some busy
    result = tune_loader(_dataset(root), batch_size=BATCH, budget_s=budget, cache=False, device=None,
                         respect_busy=False)
    rec = result.recommended
    return {"num_workers": rec["num_workers"], "decode_threads": result.decode_threads,
            "prefetch_factor": rec["prefetch_factor"], "summary": result.summary}


def _profile(root: str, top: int) -> str:
    import cProfile
    import io
    import pstats

    from detloader.loader.collate import collate_detection

    dataset = _dataset(root)
    n = len(dataset)

    def epoch() -> None:
        for b in range(0, n, BATCH):
            collate_detection([dataset[i] for i in range(b, min(b + BATCH, n))])

    epoch()
    profiler = cProfile.Profile()
    profiler.enable()
    t = time.perf_counter()
    epoch()
    seconds = time.perf_counter() - t
    profiler.disable()
    out = io.StringIO()
    stats = pstats.Stats(profiler, stream=out)
    stats.sort_stats("tottime").print_stats(top)
    head = f"{n} images in {seconds:.2f} s under cProfile ({n / seconds:.0f} img/s)\n"
    return head + _trim(out.getvalue())


def _trim(text: str) -> str:
    """pstats lines with the folder part of each path removed."""
    lines = []
    for line in text.splitlines():
        if "(" in line and "/" in line:
            head, _, tail = line.rpartition(" ")
            if "/" in tail:
                tail = tail.split("/")[-1]
                if "site-packages" in line:
                    tail = "[lib] " + tail
            line = f"{head} {tail}"
        if line.strip():
            lines.append(line)
    return "\n".join(lines)


def child(spec: dict[str, Any]) -> Any:
    import torch

    torch.set_num_threads(spec.get("torch_threads", 1))  # a training process's loader share
    kind = spec["kind"]
    if kind == "ceiling":
        return _ceiling(spec["root"], spec["epochs"])
    if kind == "loader":
        return _loader_rate(spec["root"], spec["workers"], spec["threads"], spec["epochs"])
    if kind == "tune":
        return _tune(spec["root"], spec["budget"])
    if kind == "profile":
        return _profile(spec["root"], spec["top"])
    raise ValueError(f"kind={kind!r}")


# -- parent side ----------------------------------------------------------------------------
def run_child(spec: dict[str, Any], src: Path, env: dict[str, str]) -> Any:
    env = {**env, "PYTHONPATH": str(src)}
    proc = subprocess.run(
        [sys.executable, __file__, "--child", json.dumps(spec)],
        capture_output=True, text=True, env=env, check=False,
    )
    if proc.returncode != 0:
        raise RuntimeError(f"child {spec} failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def usable_cpus() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def bench(root: Path, name: str, args: argparse.Namespace, env: dict[str, str]) -> dict[str, Any]:
    base = {"root": str(root), "epochs": args.epochs}
    variants: list[tuple[str, Path, dict[str, Any]]] = [("ceiling", SRC, {**base, "kind": "ceiling"})]
    for w in args.workers:
        for t in args.threads:
            variants.append((f"after w={w} t={t}", SRC, {**base, "kind": "loader", "workers": w, "threads": t}))
        if args.baseline_src:
            variants.append((f"before w={w} t=0", args.baseline_src, {**base, "kind": "loader", "workers": w, "threads": 0}))
    best: dict[str, float] = {}
    per_cpu: dict[str, float] = {}
    for r in range(args.repeats):
        for label, src, spec in variants:
            got = run_child(spec, src, env)
            best[label] = max(best.get(label, 0.0), got["rate"])
            per_cpu[label] = max(per_cpu.get(label, 0.0), got["cpu_rate"])
        print(f"  round {r + 1}/{args.repeats} done", file=sys.stderr)
    cpus = usable_cpus()
    single, single_cpu = best.pop("ceiling"), per_cpu.pop("ceiling")
    ceiling = single * cpus
    print(f"\n{name}: ceiling = 1-core decode + resize {single:.0f} img/s x {cpus} CPUs = {ceiling:.0f} img/s "
          f"({single_cpu:.0f} img per CPU-second)")
    print(f"{'setting':>18} {'img/s':>7} {'of ceiling':>11} {'img/CPU-s':>10} {'CPU efficiency':>15}")
    for label, rate in best.items():
        print(f"{label:>18} {rate:>7.0f} {rate / ceiling:>10.0%} {per_cpu[label]:>10.0f} "
              f"{per_cpu[label] / single_cpu:>14.0%}")
    out: dict[str, Any] = {"dataset": name, "cpus": cpus, "single_core": single, "ceiling": ceiling,
                           "single_core_per_cpu_s": single_cpu, "rates": best, "per_cpu_s": per_cpu}
    if args.tune:
        tuned = run_child({**base, "kind": "tune", "budget": args.tune_budget}, SRC, env)
        label = f"after w={tuned['num_workers']} t={tuned['decode_threads']}"
        top = max(v for k, v in best.items() if k.startswith("after"))
        found = best.get(label)
        ratio = f"{found / top:.0%} of the best setting" if found else "not in the grid"
        print(f"tuner: {tuned['summary']}\n  -> {label}: {ratio}")
        out["tuned"] = {**tuned, "label": label, "of_best": found / top if found else None}
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--child", help=argparse.SUPPRESS)
    p.add_argument("--images", type=int, default=400)
    p.add_argument("--size", type=int, nargs=2, default=(470, 370), metavar=("W", "H"))
    p.add_argument("--workers", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--threads", type=int, nargs="+", default=[0, 2])
    p.add_argument("--epochs", type=int, default=2, help="timed epochs per setting, best kept")
    p.add_argument("--repeats", type=int, default=2, help="interleaved rounds, best kept")
    p.add_argument("--baseline-src", type=Path, help="src folder of the tree to compare against")
    p.add_argument("--no-bccd", action="store_true")
    p.add_argument("--data", nargs="*", default=[], help="more dataset folders to measure")
    p.add_argument("--tune", action="store_true")
    p.add_argument("--tune-budget", type=float, default=40.0)
    p.add_argument("--profile", action="store_true")
    p.add_argument("--json", type=Path)
    args = p.parse_args(argv)
    if args.child:
        print(json.dumps(child(json.loads(args.child))))
        return 0

    results: dict[str, Any] = {"results": []}
    with tempfile.TemporaryDirectory() as tmp:
        env = {**os.environ, "DETLOADER_CACHE_DIR": str(Path(tmp) / "cache")}
        os.environ.update(env)
        sys.path.insert(0, str(SRC))
        from detloader.annotations.synth import make_synthetic

        root = make_synthetic(Path(tmp) / "synth", args.images, seed=0, size=tuple(args.size))
        sets = [(root, f"synthetic {args.size[0]}x{args.size[1]} ({args.images} images)")]
        if BCCD.is_dir() and not args.no_bccd:
            sets.append((BCCD, "bccd 640x480"))
        sets += [(Path(d), Path(d).name) for d in args.data]
        print(f"{usable_cpus()} usable CPUs, batch {BATCH}, Resize({SIZE}, mode='letterbox')")
        for path, name in sets:
            results["results"].append(bench(path, name, args, env))
        if args.profile:
            trees = [("after", SRC)] + ([("before", args.baseline_src)] if args.baseline_src else [])
            for label, src in trees:
                text = run_child({"kind": "profile", "root": str(root), "top": 14}, src, env)
                print(f"\ncProfile {label} ({sets[0][1]}): {text}")
                results[f"profile_{label}"] = text
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
