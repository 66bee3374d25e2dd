"""Incremental refresh of a cached VOC index against a full rebuild, measured in the same run.

    python benchmarks/bench_index_refresh.py                  # 20k XML files, 5 rounds
    python benchmarks/bench_index_refresh.py --files 100000 --rounds 3

Synthetic VOC files (1-4 objects of 20 classes each, empty image files beside them: the image
check looks for them, no pixel is read). Each round, each in a fresh process, alternating:
a full rebuild (``cache="rebuild"``), then one annotation file edited, one added and one removed,
each followed by a read that refreshes the cache, then a warm read of an unchanged dataset (it
stats every file). Printed: the medians of each, as ratios against the full rebuild's median,
in wall seconds and in CPU seconds (the read's process and the parse workers it ended: on a
shared machine the CPU ratio moves less, and a full build's workers suffer most from other
jobs), and the files each refresh parsed again (``index.meta["refreshed"]``).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

CLASSES = [f"class{k:02d}" for k in range(20)]
#: what each child process runs: one read, timed without the interpreter's start and imports
CHILD = """
import json, resource, sys, time
from detloader import read_annotations
def cpu():
    usage = [resource.getrusage(who) for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN)]
    return sum(r.ru_utime + r.ru_stime for r in usage)
start, start_cpu = time.perf_counter(), cpu()
index = read_annotations(sys.argv[1], cache=sys.argv[2] == "rebuild" and "rebuild" or True, on_error="skip")
print(json.dumps({"seconds": time.perf_counter() - start, "cpu": cpu() - start_cpu,
                  "refreshed": index.meta.get("refreshed"), "images": len(index)}))
"""


def voc_file(stem: str, rng: random.Random, shift: int = 0) -> str:
    """One annotation file of ``stem``.jpg (640x480) with 1-4 objects."""
    objects = []
    for _ in range(rng.randint(1, 4)):
        x, y = rng.randint(0, 500), rng.randint(0, 350)
        w, h = rng.randint(10, 130) + shift, rng.randint(10, 120)
        objects.append(
            f"<object><name>{rng.choice(CLASSES)}</name><difficult>0</difficult><bndbox><xmin>{x}</xmin>"
            f"<ymin>{y}</ymin><xmax>{x + w}</xmax><ymax>{y + h}</ymax></bndbox></object>"
        )
    return (
        f"<annotation><folder>VOC</folder><filename>{stem}.jpg</filename><size><width>640</width>"
        f"<height>480</height><depth>3</depth></size>{''.join(objects)}</annotation>"
    )


def make_dataset(root: Path, n: int, seed: int = 0) -> None:
    """``n`` annotation files in Annotations/, an empty image file for each (and one spare) in JPEGImages/."""
    rng = random.Random(seed)
    (root / "Annotations").mkdir(parents=True)
    (root / "JPEGImages").mkdir()
    for i in range(n + 1):
        stem = f"{i:07d}"
        if i < n:
            (root / "Annotations" / f"{stem}.xml").write_text(voc_file(stem, rng))
        (root / "JPEGImages" / f"{stem}.jpg").touch()


def timed_read(root: Path, mode: str) -> dict:
    """One read in a fresh process: its seconds, the files it parsed again, its images."""
    out = subprocess.run(
        [sys.executable, "-c", CHILD, str(root), mode], check=True, capture_output=True, text=True
    ).stdout
    return json.loads(out.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--files", type=int, default=20_000)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args(argv)
    n = args.files
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "voc"
        make_dataset(root, n)
        rng = random.Random(1)
        spare = root / "Annotations" / f"{n:07d}.xml"  # its image is there: adding it changes no image folder
        times: dict[str, list[float]] = {"full": [], "edit": [], "add": [], "remove": [], "warm": []}
        cpus: dict[str, list[float]] = {k: [] for k in times}
        parsed: dict[str, set] = {k: set() for k in times}
        timed_read(root, "read")  # the page cache warm for every round alike
        for r in range(args.rounds):
            result = timed_read(root, "rebuild")
            times["full"].append(result["seconds"])
            cpus["full"].append(result["cpu"])
            edited = root / "Annotations" / f"{rng.randrange(n):07d}.xml"
            for step in ("edit", "add", "remove"):
                if step == "edit":
                    edited.write_text(voc_file(edited.stem, rng, shift=r + 1))
                elif step == "add":
                    spare.write_text(voc_file(spare.stem, rng))
                else:
                    spare.unlink()
                result = timed_read(root, "read")
                times[step].append(result["seconds"])
                cpus[step].append(result["cpu"])
                parsed[step].add(result["refreshed"])
            result = timed_read(root, "read")
            times["warm"].append(result["seconds"])
            cpus["warm"].append(result["cpu"])
            parsed["warm"].add(result["refreshed"])
        full, full_cpu = statistics.median(times["full"]), statistics.median(cpus["full"])
        print(f"{n} VOC files, {args.rounds} rounds, medians; ratios against the full rebuild (wall, CPU)")
        for step, values in times.items():
            median, cpu = statistics.median(values), statistics.median(cpus[step])
            again = "" if step in ("full", "warm") else f"  files parsed again: {sorted(parsed[step], key=str)}"
            ratios = f"{median / full:6.3f}x   CPU {cpu:8.3f} s  {cpu / full_cpu:6.3f}x"
            print(f"  {step:7s} {median:8.3f} s  {ratios}{again}")
    return 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONHASHSEED", "0")
    sys.exit(main())
