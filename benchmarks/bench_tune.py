"""Loader tuning benchmark: the tuner against an exhaustive grid, and on a shared machine.

    python benchmarks/bench_tune.py                       # all parts, a few minutes
    python benchmarks/bench_tune.py --part grid --repeats 2
    python benchmarks/bench_tune.py --part shared
    python benchmarks/bench_tune.py --part model          # search cost on modelled 8..256-CPU machines

Everything is measured in this run, on a synthetic VOC dataset through the real pipeline
(``DetectionDataset`` with a letterbox resize -> ``make_loader`` -> ``collate_detection``).

**grid**: the same candidates for both: ``num_workers`` 0..``--max-workers`` (default 8 x the
usable CPUs: what a grid over a big server's range would try) x ``prefetch_factor`` 2/4, with
the same window per setting. Reported: the tuner's wall time (probe included) as a share of
the grid's, and the throughput of the tuner's choice against the grid's best. Both choices are
measured again, interleaved, ``--confirm`` times each, so that the ratio compares the settings
and not two moments of a shared machine (best windows, as the tuner ranks, and medians);
medians over ``--repeats`` runs. Each run waits (up to 60 s) until other processes keep fewer
than 0.3 CPUs busy, and the load they put on the machine during the grid is printed.

**shared**: the tuner with default settings on the machine as it is, then with as many busy
Python processes as usable CPUs started by this script (a shared server where other jobs run),
alternating, ``--repeats`` times. Reported: busy and free CPUs seen by the probe, the
recommended ``num_workers``, and the explanation of one busy run. A greedy measurement
(``respect_busy=False``) is shown for contrast: on a busy machine more workers still win time
slices from the other jobs, which is why the tuner counts free CPUs instead.

**model**: the search against modelled machines (throughput rising linearly to a knee, then
flat or falling), to show how many settings it measures on 8 to 256 CPUs compared with a grid.
"""

from __future__ import annotations

import argparse
import functools
import statistics
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any

from detloader import read_annotations
from detloader._system import busy_cpus, usable_cpus
from detloader.dataset import DetectionDataset
from detloader.loader import make_loader
from detloader.annotations.synth import make_synthetic
from detloader.transforms import Resize
from detloader.tune import Trial, tune_loader
from detloader.tune.measure import measure_setting
from detloader.tune.search import search_settings
from detloader.tune.tuner import grid_candidates
from detloader.tune.explain import describe_settings

BUSY_LOOP = "import time\nwhile True:\n    pass\n"


def build_dataset(folder: Path, images: int, size: int) -> DetectionDataset:
    root = make_synthetic(folder / "faces", images, seed=0, size=(640, 480))
    index = read_annotations(root)
    return DetectionDataset(index, Resize(size, mode="letterbox"), seed=0)


def factory_for(dataset: DetectionDataset, batch_size: int):
    return functools.partial(make_loader, dataset, batch_size=batch_size, shuffle=True, seed=0)


def wait_quiet(threshold: float = 0.3, timeout_s: float = 60.0) -> float:
    """Wait (up to ``timeout_s``) until other processes keep fewer than ``threshold`` CPUs busy;
    returns the last reading. Other jobs share this machine: a run started in a burst of their
    work measures that burst."""
    end = time.perf_counter() + timeout_s
    busy = busy_cpus(1.0)
    while busy >= threshold and time.perf_counter() < end:
        busy = busy_cpus(1.0)
    return busy


def confirm(factory, a: dict[str, Any], b: dict[str, Any], batch_size: int, rounds: int,
            window_s: float) -> tuple[list[float], list[float]]:
    """Images/s of settings ``a`` and ``b``, measured alternately ``rounds`` times each."""
    ra, rb = [], []
    for _ in range(rounds):
        for settings, out in ((a, ra), (b, rb)):
            t = measure_setting(factory, settings, batch_size=batch_size, window_s=window_s)
            out.append(t.images_per_s)
    return ra, rb


def part_grid(dataset: DetectionDataset, args: argparse.Namespace) -> None:
    factory = factory_for(dataset, args.batch_size)
    grid = grid_candidates(args.max_workers)
    print(f"\n== tuned vs exhaustive grid: {len(grid)} candidates (num_workers 0..{args.max_workers} "
          f"x prefetch 2/4), batch {args.batch_size}, {len(dataset)} images ==")
    rows = []
    for rep in range(args.repeats):
        quiet = wait_quiet()
        tuned = tune_loader(dataset, batch_size=args.batch_size, budget_s=args.budget, loader_factory=factory,
                            max_workers=args.max_workers, cache=False)
        wait_quiet()
        t0 = time.perf_counter()
        full = search_settings(factory, batch_size=args.batch_size, cap=args.max_workers, budget_s=1e9,
                               window_s=tuned.window_s, candidates=grid)
        grid_s = time.perf_counter() - t0
        grid_best = max((t for t in full.trials if t.ok), key=lambda t: t.images_per_s)
        mine = tuned.recommended
        wait_quiet()
        ra, rb = confirm(factory, mine, grid_best.settings, args.batch_size, args.confirm,
                         max(1.0, tuned.window_s))
        rows.append({
            "tuned": describe_settings(mine), "grid_best": describe_settings(grid_best.settings),
            "tuned_trials": len(tuned.trials), "grid_trials": len(full.trials),
            "tuned_s": tuned.spent_s, "grid_s": grid_s, "time_ratio": tuned.spent_s / grid_s,
            "best_ratio": max(ra) / max(rb), "median_ratio": statistics.median(ra) / statistics.median(rb),
            "tuned_rate": max(ra), "best_rate": max(rb), "window_s": tuned.window_s, "quiet": quiet,
            "others": statistics.median(t.others_cpu or 0.0 for t in full.trials),
        })
        r = rows[-1]
        print(f"run {rep + 1}: tuned {r['tuned']:<11} {r['tuned_trials']:>2} windows {r['tuned_s']:5.1f} s | "
              f"grid best {r['grid_best']:<11} {r['grid_trials']:>2} windows {r['grid_s']:6.1f} s | "
              f"time {r['time_ratio'] * 100:3.0f} % | again x{args.confirm}: best {r['tuned_rate']:4.0f} vs "
              f"{r['best_rate']:4.0f} img/s = {r['best_ratio'] * 100:3.0f} %, medians {r['median_ratio'] * 100:3.0f} % "
              f"(window {r['window_s']:.1f} s; others' CPUs at start {r['quiet']:.1f}, during grid {r['others']:.1f})")
        if rep == 0:
            print("  grid (img/s [others' CPUs]):", ", ".join(_trial(t) for t in full.trials))
            print("  tuned:", ", ".join(_trial(t) for t in tuned.trials))
    time_ratio = statistics.median(r["time_ratio"] for r in rows)
    best_ratio = statistics.median(r["best_ratio"] for r in rows)
    median_ratio = statistics.median(r["median_ratio"] for r in rows)
    print(f"median over {len(rows)} runs: tuner time / grid time = {time_ratio * 100:.0f} % (goal <= 30 %); "
          f"tuned / grid best throughput = {best_ratio * 100:.0f} % best windows, {median_ratio * 100:.0f} % "
          f"median windows (goal >= 90 %)")


def _trial(t: Trial) -> str:
    others = f" [{t.others_cpu:.1f}]" if t.others_cpu is not None else ""
    return f"{describe_settings(t.settings)} {t.images_per_s:.0f}{others}"


def start_busy(n: int) -> list[subprocess.Popen]:
    procs = [subprocess.Popen([sys.executable, "-c", BUSY_LOOP]) for _ in range(n)]
    time.sleep(0.5)  # let them reach the loop
    return procs


def stop_busy(procs: list[subprocess.Popen]) -> None:
    for p in procs:
        p.kill()
    for p in procs:
        p.wait()


def part_shared(dataset: DetectionDataset, args: argparse.Namespace) -> None:
    factory = factory_for(dataset, args.batch_size)
    n_busy = args.busy if args.busy is not None else usable_cpus()
    print(f"\n== shared machine: {n_busy} busy Python processes started by this script ==")
    rows: dict[str, list[tuple[float, float, int, int]]] = {"idle": [], "busy": []}
    busy_text = ""
    for rep in range(args.repeats):
        for state in ("idle", "busy"):
            if state == "idle":
                wait_quiet()
            procs = start_busy(n_busy) if state == "busy" else []
            try:
                fair = tune_loader(dataset, batch_size=args.batch_size, budget_s=args.budget, loader_factory=factory,
                                   cache=False)
                greedy = tune_loader(dataset, batch_size=args.batch_size, budget_s=args.budget,
                                     loader_factory=factory, cache=False, respect_busy=False)
            finally:
                stop_busy(procs)
            rows[state].append((fair.machine.busy_cpus, fair.machine.free_cpus, fair.recommended["num_workers"],
                                greedy.recommended["num_workers"]))
            print(f"run {rep + 1} {state:<4}: busy {fair.machine.busy_cpus:4.1f}, free {fair.machine.free_cpus:4.1f} "
                  f"of {fair.machine.usable_cpus} -> num_workers={fair.recommended['num_workers']} "
                  f"({fair.chosen_trial.images_per_s:.0f} img/s); greedy: num_workers="
                  f"{greedy.recommended['num_workers']} ({greedy.chosen_trial.images_per_s:.0f} img/s)")
            if state == "busy" and not busy_text:
                busy_text = fair.explanation
    for state, values in rows.items():
        med = [statistics.median(v[i] for v in values) for i in range(4)]
        print(f"median {state:<4}: busy CPUs {med[0]:.1f}, free {med[1]:.1f}, recommended num_workers "
              f"{med[2]:.0f}, greedy {med[3]:.0f}")
    print("\nexplanation (busy run):\n" + busy_text)


def part_model(args: argparse.Namespace) -> None:
    print("\n== search cost on modelled machines (no measurement: throughput from a formula) ==")
    print(f"{'CPUs':>5} {'knee':>5} {'shape':<8} {'settings':>8} {'windows':>8} {'grid':>5} {'chosen':>7} {'grid choice*':>12}")
    for cpus, knee_at, fall in ((8, 6, 0.0), (32, 12, 0.0), (64, 12, 0.0), (64, 40, 15.0), (128, 48, 0.0), (256, 100, 5.0)):
        def rate(s: dict[str, Any], k: int = knee_at, f: float = fall) -> float:
            w = s["num_workers"]
            return 90.0 if w == 0 else 100.0 * min(w, k) - f * max(0, w - k)

        def fake(factory: Any, settings: dict[str, Any], **kw: Any) -> Trial:
            r = rate(settings)
            return Trial(dict(settings), r, int(r), 1, 1.0, 0.1, 1.0, 2.0, 0.1, 1.0, settings["num_workers"], 100.0,
                         150.0, 300.0, phase=kw.get("phase", ""))

        out = search_settings(None, batch_size=32, cap=cpus, budget_s=1e9, measure_fn=fake)
        grid = grid_candidates(cpus)
        g = search_settings(None, batch_size=32, cap=cpus, budget_s=1e9, measure_fn=fake, candidates=grid)
        distinct = len({tuple(sorted(t.settings.items())) for t in out.trials})
        print(f"{cpus:>5} {knee_at:>5} {'falling' if fall else 'flat':<8} {distinct:>8} {len(out.trials):>8} "
              f"{len(grid):>5} {out.chosen_trial.num_workers:>7} {g.chosen_trial.num_workers:>12}")
    print("* the grid's choice under the same rule: fewest workers within the 4 % tolerance of the best")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--part", choices=("all", "grid", "shared", "model"), default="all")
    parser.add_argument("--images", type=int, default=300)
    parser.add_argument("--size", type=int, default=512, help="letterbox size (default 512)")
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--budget", type=float, default=20.0, help="tuner budget per run, seconds")
    parser.add_argument("--max-workers", type=int, default=None, help="grid range (default 8 x usable CPUs)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--confirm", type=int, default=4, help="interleaved re-measurements of both choices")
    parser.add_argument("--busy", type=int, default=None, help="busy processes (default: usable CPUs)")
    args = parser.parse_args()
    # the grid deliberately asks for more workers than CPUs; torch warns about each such loader
    warnings.filterwarnings("ignore", message="This DataLoader will create")
    if args.max_workers is None:
        args.max_workers = 8 * usable_cpus()
    print(f"usable CPUs: {usable_cpus()}")
    if args.part in ("all", "model"):
        part_model(args)
    if args.part == "model":
        return
    with tempfile.TemporaryDirectory() as tmp:
        dataset = build_dataset(Path(tmp), args.images, args.size)
        if args.part in ("all", "grid"):
            part_grid(dataset, args)
        if args.part in ("all", "shared"):
            part_shared(dataset, args)


if __name__ == "__main__":
    main()
