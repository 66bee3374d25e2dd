"""WeightedSampler vs torch.utils.data.WeightedRandomSampler at several sizes, one process each.

(``detloader bench`` has the one-size, in-process version of this comparison.)

For each size (default 1M, 10M and 100M weights, float64, log-normal), each sampler runs in a
fresh process:

* ``build``   constructing the sampler (torch: wraps the tensor; ours: the alias table);
* ``epoch``   drawing one epoch of ``n`` indices as an array - what WeightedRandomSampler does
              in ``__iter__`` (``torch.multinomial``) before handing out Python ints, and
              ``WeightedSampler.indices()`` for ours; timed for ``--epochs`` epochs (median);
* ``first``   build + the first epoch: what the first epoch costs;
* ``iterate`` one epoch of ``for i in sampler`` (Python ints), up to 10M;
* ``peak``    the largest rise of the process's resident memory over the weights alone while
              building and drawing (sampled every millisecond; psutil), and for ours the
              tracemalloc peak of the same phase.

torch refuses more than 2**24 categories; its error is recorded. The machine may be shared,
so absolute times drift: the ratios (torch / ours) are measured in the same run, and the load
average is printed. Each process first touches and frees ``--warm-gb`` of memory, so that the
cost of a virtual machine's first touch of fresh pages falls on neither side.

``--first N`` measures instead, in one process, the time from constructing a WeightedSampler
over N weights to the ``--draws``-th index out of its iterator, against numpy's inverse CDF
(``np.cumsum`` of the weights + ``np.searchsorted`` of as many uniform draws) timed in turn
with it, ``--runs`` pairs: the medians and the median of the pairwise ratios (ours / numpy).

    python benchmarks/bench_samplers.py                      # 1M, 10M, 100M with replacement
    python benchmarks/bench_samplers.py --sizes 1e6 1e7 --no-replacement
    python benchmarks/bench_samplers.py --first 1e8          # first 1M indices vs numpy
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from typing import Any

from detloader.tune.bench.samplers import PeakRSS

GOAL_SPEEDUP_10M = 3.0
GOAL_100M_SECONDS = 5.0
GOAL_100M_MB = 2048.0
GOAL_FIRST_RATIO = 0.75


def _first(n: int, draws: int, runs: int, warm_gb: float) -> int:
    """Construction + the first ``draws`` indices of a WeightedSampler vs numpy's inverse CDF."""
    import itertools

    import numpy as np

    from detloader.balance import WeightedSampler

    weights = np.random.default_rng(0).lognormal(0.0, 1.0, n)
    if warm_gb > 0:  # touch and free: fresh VM pages are slow on first touch, for both sides
        block = np.ones(int(warm_gb * 2**30) // 8)
        del block

    def numpy_icdf() -> float:
        start = time.perf_counter()
        cdf = np.cumsum(weights)
        u = np.random.default_rng(1).random(draws) * cdf[-1]
        idx = np.searchsorted(cdf, u, side="right")
        assert len(idx) == draws
        return time.perf_counter() - start

    def ours() -> float:
        start = time.perf_counter()
        head = list(itertools.islice(iter(WeightedSampler(weights, n, seed=0)), draws))
        assert len(head) == draws
        return time.perf_counter() - start

    pairs = []
    for _ in range(runs):
        pairs.append((numpy_icdf(), ours()))
        print(f"numpy {pairs[-1][0]:.3f} s, ours {pairs[-1][1]:.3f} s", flush=True)
    ratio = statistics.median(o / b for b, o in pairs)
    verdict = "met" if ratio <= GOAL_FIRST_RATIO else "NOT met"
    print(
        f"{n:,} weights, first {draws:,} indices: numpy inverse CDF {statistics.median(b for b, _ in pairs):.3f} s, "
        f"WeightedSampler {statistics.median(o for _, o in pairs):.3f} s (medians of {runs}); ours / numpy "
        f"{ratio:.2f}x (median of the pairs; goal <= {GOAL_FIRST_RATIO}x: {verdict}); "
        f"load average {os.getloadavg()[0]:.1f}"
    )
    return 0


def _case(impl: str, n: int, replacement: bool, epochs: int, iterate: bool, warm_gb: float) -> dict[str, Any]:
    import gc
    import tracemalloc

    import numpy as np
    import torch

    from detloader.balance import WeightedSampler

    weights = np.random.default_rng(0).lognormal(0.0, 1.0, n)
    if warm_gb > 0:  # touch and free: fresh VM pages are slow on first touch, for both sides
        block = np.ones(int(warm_gb * 2**30) // 8)
        del block
    gc.collect()
    out: dict[str, Any] = {"impl": impl, "n": n, "replacement": replacement, "error": None}
    epoch_times: list[float] = []
    tracemalloc.start()
    with PeakRSS() as mem:
        try:
            t = time.perf_counter()
            if impl == "torch":
                gen = torch.Generator().manual_seed(0)
                sampler: Any = torch.utils.data.WeightedRandomSampler(
                    torch.from_numpy(weights), n, replacement=replacement, generator=gen
                )
            else:
                sampler = WeightedSampler(weights, n, replacement=replacement, seed=0)
            out["build"] = time.perf_counter() - t
            for epoch in range(epochs):
                t = time.perf_counter()
                if impl == "torch":
                    idx = torch.multinomial(sampler.weights, sampler.num_samples, sampler.replacement, generator=gen)
                else:
                    sampler.set_epoch(epoch)
                    idx = sampler.indices()
                epoch_times.append(time.perf_counter() - t)
                assert len(idx) == n
                del idx
        except RuntimeError as err:  # torch: "number of categories cannot exceed 2^24"
            out["error"] = str(err).splitlines()[0]
    out["tracemalloc_mb"] = tracemalloc.get_traced_memory()[1] / 2**20 if impl == "ours" else None
    tracemalloc.stop()
    out["peak_mb"] = mem.rise_mb
    out["epochs"] = epoch_times
    if iterate and out["error"] is None:
        if impl == "ours":
            sampler.set_epoch(epochs)
        with PeakRSS() as mem:
            t = time.perf_counter()
            count = sum(1 for _ in sampler)
            out["iterate"] = time.perf_counter() - t
        out["iterate_peak_mb"] = mem.rise_mb
        assert count == n
    return out


def _spawn(impl: str, n: int, args: argparse.Namespace, replacement: bool) -> dict[str, Any]:
    cmd = [
        sys.executable, __file__, "--case", impl, "--n", str(n), "--epochs", str(args.epochs),
        "--warm-gb", str(args.warm_gb),
    ]
    if not replacement:
        cmd.append("--no-replacement")
    if n <= args.iterate_max:
        cmd.append("--iterate")
    done = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        return {"impl": impl, "n": n, "error": f"process failed: {done.stderr.strip().splitlines()[-1:]}"}
    return json.loads(done.stdout.strip().splitlines()[-1])


def _fmt(x: float | None, unit: str = "s") -> str:
    if x is None:
        return "-"
    return f"{x:.3f} {unit}" if unit == "s" else f"{x:.0f} {unit}"


def _ratio(a: float | None, b: float | None) -> str:
    return "-" if a is None or b is None or b <= 0 else f"{a / b:.1f}x"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sizes", nargs="+", type=float, default=[1e6, 1e7, 1e8])
    p.add_argument("--epochs", type=int, default=3, help="epochs timed per process (median)")
    p.add_argument("--no-replacement", action="store_true", help="draw without replacement")
    p.add_argument("--iterate-max", type=float, default=1e7, help="iterate Python ints up to this n")
    p.add_argument("--warm-gb", type=float, default=3.0, help="memory touched and freed first")
    p.add_argument("--json", help="also write the raw results here")
    p.add_argument("--first", type=float, help="time the first --draws indices of this many weights vs numpy")
    p.add_argument("--draws", type=float, default=1e6, help="indices drawn with --first")
    p.add_argument("--runs", type=int, default=5, help="pairs timed with --first (medians)")
    p.add_argument("--case", choices=("torch", "ours"), help=argparse.SUPPRESS)
    p.add_argument("--n", type=int, help=argparse.SUPPRESS)
    p.add_argument("--iterate", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()
    replacement = not args.no_replacement
    if args.first:
        return _first(int(args.first), int(args.draws), args.runs, args.warm_gb)
    if args.case:
        print(json.dumps(_case(args.case, args.n, replacement, args.epochs, args.iterate, args.warm_gb)))
        return 0

    import numpy
    import torch

    print(
        f"WeightedSampler vs torch WeightedRandomSampler, replacement={replacement}; "
        f"torch {torch.__version__}, numpy {numpy.__version__}, {os.cpu_count()} CPUs, "
        f"load average {os.getloadavg()[0]:.1f} at start"
    )
    header = (
        f"{'n':>12} {'':6} {'build':>9} {'epoch':>9} {'first':>9} {'iterate':>9} {'peak RSS':>10} {'tracemalloc':>11}"
    )
    print(header)
    results = []
    verdicts = []
    for size in args.sizes:
        n = int(size)
        row = {}
        for impl in ("torch", "ours"):
            r = _spawn(impl, n, args, replacement)
            row[impl] = r
            if r.get("error"):
                print(f"{n:>12,} {impl:6} refused: {r['error']}")
                continue
            epoch = statistics.median(r["epochs"])
            r["epoch"] = epoch
            r["first"] = r["build"] + r["epochs"][0]
            print(
                f"{n:>12,} {impl:6} {_fmt(r['build']):>9} {_fmt(epoch):>9} {_fmt(r['first']):>9} "
                f"{_fmt(r.get('iterate')):>9} {_fmt(r['peak_mb'], 'MB'):>10} "
                f"{_fmt(r.get('tracemalloc_mb'), 'MB'):>11}"
            )
        t, o = row["torch"], row["ours"]
        if not t.get("error") and not o.get("error"):
            print(
                f"{'':>12} torch/ours: epoch {_ratio(t['epoch'], o['epoch'])}, first epoch "
                f"{_ratio(t['first'], o['first'])}, iterate {_ratio(t.get('iterate'), o.get('iterate'))}, "
                f"peak memory {_ratio(t['peak_mb'], o['peak_mb'])}"
            )
            if n == 10_000_000 and replacement:
                speedup = t["first"] / o["first"]
                verdicts.append(f"10M: first epoch {speedup:.1f}x faster than torch (goal >= {GOAL_SPEEDUP_10M:.0f}x): "
                                f"{'met' if speedup >= GOAL_SPEEDUP_10M else 'NOT met'}")
        if n == 100_000_000 and replacement and not o.get("error"):
            ok = o["first"] <= GOAL_100M_SECONDS and o["peak_mb"] <= GOAL_100M_MB
            verdicts.append(
                f"100M: build + epoch {o['first']:.2f} s, peak {o['peak_mb']:.0f} MB (goal <= "
                f"{GOAL_100M_SECONDS:.0f} s, <= {GOAL_100M_MB:.0f} MB): {'met' if ok else 'NOT met'}"
            )
        results.append(row)
    print(f"load average {os.getloadavg()[0]:.1f} at end")
    for v in verdicts:
        print(v)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
