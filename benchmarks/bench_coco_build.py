"""Cold COCO index build against pycocotools' ``COCO(path)`` on the same file, in separate processes.

    python benchmarks/bench_coco_build.py                       # 50k images, ~350k objects, 5 runs each
    python benchmarks/bench_coco_build.py --images 20000 --runs 3
    python benchmarks/bench_coco_build.py --images 100000 --runs 3 --with-images

The file is synthetic and shaped like LVIS: 1,203 categories with a long-tail frequency (Zipf),
about 7 objects per image, each with a box, an area and a polygon of 8-24 coordinates. Each run
is a fresh Python process: ``read_annotations(path, cache=False)`` (no index cache: a cold build)
or ``COCO(path)`` (with ``--general`` also detloader's general path, as before the fast path),
alternating (A B A B ...). Each child reports the CPU seconds (user + sys,
``resource.getrusage``) of the build, after its imports, the peak resident memory of its
process and that peak's growth over the imports, and
the parent prints medians and the detloader / pycocotools ratios. By default no image files
exist and detloader runs with ``check_images=False`` (pycocotools never looks at the images);
``--with-images`` writes an empty file per image and checks that each exists (one ``stat``).
``--cached`` also times, after each pair, a first read with the index cache (the cold build and
the cache write) and a second one (the reload: a COCO dataset is built once, not twice).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

_CHILD = r"""
import json, resource, sys, time
def cpu():
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime
def rss():
    with open("/proc/self/statm") as fh:
        return int(fh.read().split()[1]) * resource.getpagesize()
which, path, check = sys.argv[1], sys.argv[2], sys.argv[3] == "1"
if which in ("detloader", "general", "cached"):
    from detloader import read_annotations
    if which == "general":  # the general path only, as before the fast path
        import detloader.annotations.readers.coco as coco_reader
        coco_reader.parse_fast = lambda *a: False
else:
    from pycocotools.coco import COCO
import numpy
base_cpu, base_rss, start = cpu(), rss(), time.perf_counter()
if which == "cached":  # with the index cache (made by the run before when it exists)
    index = read_annotations(path, check_images=check, on_error="skip")
    n = (len(index), index.num_objects)
elif which != "pycocotools":
    index = read_annotations(path, cache=False, check_images=check, on_error="skip")
    n = (len(index), index.num_objects)
else:
    coco = COCO(path)
    n = (len(coco.imgs), len(coco.anns))
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
print(json.dumps({"cpu": cpu() - base_cpu, "wall": time.perf_counter() - start, "peak": peak,
                  "growth": peak - base_rss, "n": n}))
"""


def write_lvis_like(path: Path, n_images: int, seed: int = 0, classes: int = 1203) -> int:
    """Write a synthetic LVIS-shaped COCO file to ``path``; the number of objects."""
    rng = np.random.default_rng(seed)
    weights = 1.0 / np.arange(1, classes + 1) ** 1.1
    per_image = rng.poisson(7.0, n_images)
    m = int(per_image.sum())
    cats = rng.permutation(classes)[rng.choice(classes, m, p=weights / weights.sum())] + 1
    owners = np.repeat(np.arange(1, n_images + 1), per_image)
    sides = rng.integers(320, 1025, (n_images, 2))
    wh = sides[owners - 1]
    xy = rng.uniform(0, 0.8, (m, 2)) * wh
    size = np.maximum(rng.uniform(0.02, 0.4, (m, 2)) * wh, 1.0)
    size = np.minimum(size, wh - xy)
    n_poly = rng.integers(4, 13, m) * 2
    with open(path, "w") as fh:
        fh.write('{"info": {"description": "synthetic LVIS-like"}, "licenses": [], "images": [')
        fh.write(
            ",".join(
                f'{{"id": {i + 1}, "file_name": "{i + 1:012d}.jpg", "width": {w}, "height": {h}, '
                f'"coco_url": "http://example.invalid/{i + 1:012d}.jpg", "not_exhaustive_category_ids": [], '
                f'"neg_category_ids": []}}'
                for i, (w, h) in enumerate(sides.tolist())
            )
        )
        fh.write('], "annotations": [')
        for start in range(0, m, 100_000):
            stop = min(m, start + 100_000)
            parts = []
            for j in range(start, stop):
                x, y = xy[j]
                w, h = size[j]
                poly = rng.uniform(0, 1, n_poly[j]).round(2).tolist()
                parts.append(
                    f'{{"id": {j + 1}, "image_id": {owners[j]}, "category_id": {cats[j]}, '
                    f'"bbox": [{x:.2f}, {y:.2f}, {w:.2f}, {h:.2f}], "area": {w * h:.2f}, '
                    f'"segmentation": [{json.dumps(poly)}], "iscrowd": 0}}'
                )
            fh.write(("," if start else "") + ",".join(parts))
        fh.write('], "categories": [')
        fh.write(
            ",".join(
                f'{{"id": {c + 1}, "name": "class_{c:04d}", "synset": "s{c}", "frequency": "{"frc"[c % 3]}"}}'
                for c in range(classes)
            )
        )
        fh.write("]}")
    return m


def _run(which: str, path: Path, check: bool) -> dict:
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(
            p for p in (str(Path(__file__).parents[1] / "src"), os.environ.get("PYTHONPATH", "")) if p
        ),
    }
    out = subprocess.run(
        [sys.executable, "-c", _CHILD, which, str(path), "1" if check else "0"],
        capture_output=True,
        text=True,
        env=env,
        check=True,
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--images", type=int, default=50_000, help="images in the synthetic file")
    parser.add_argument("--runs", type=int, default=5, help="runs of each side (alternating)")
    parser.add_argument("--with-images", action="store_true", help="write empty image files and check them")
    parser.add_argument("--general", action="store_true", help="also time detloader's general (slow) path")
    parser.add_argument("--dir", help="where to write the file (default: a temporary folder)")
    parser.add_argument("--cached", action="store_true",
                        help="also time a first read with the index cache (build + write) and a second (reload)")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        folder = Path(tmp)
        path = folder / "lvis_like.json"
        start = time.perf_counter()
        m = write_lvis_like(path, args.images)
        if args.with_images:
            for i in range(args.images):
                (folder / f"{i + 1:012d}.jpg").touch()
        print(
            f"{args.images} images, {m} objects, {path.stat().st_size / 1e6:.0f} MB "
            f"(written in {time.perf_counter() - start:.1f} s); {args.runs} runs each, alternating"
        )
        results: dict[str, list[dict]] = {
            "detloader": [],
            "pycocotools": [],
            **({"general": []} if args.general else {}),
        }
        cached: dict[str, list[dict]] = {"first": [], "second": []}
        for _ in range(args.runs):
            for which in results:
                results[which].append(_run(which, path, args.with_images))
            if args.cached:
                shutil.rmtree(folder / ".detloader-cache", ignore_errors=True)
                for which in cached:
                    cached[which].append(_run("cached", path, args.with_images))
    med = {
        w: {k: statistics.median(r[k] for r in runs) for k in ("cpu", "wall", "peak", "growth")}
        for w, runs in results.items()
    }
    for which, fig in med.items():
        print(
            f"{which:12s} CPU {fig['cpu']:6.2f} s  wall {fig['wall']:6.2f} s  peak RSS {fig['peak'] / 2**20:7.0f} MiB"
            f"  (growth {fig['growth'] / 2**20:6.0f} MiB)  n={results[which][0]['n']}"
        )
    d, p = med["detloader"], med["pycocotools"]
    ratios = {k: d[k] / p[k] for k in ("cpu", "wall", "peak", "growth")}
    print("detloader / pycocotools: " + ", ".join(f"{k} {v:.2f}x" for k, v in ratios.items()))
    if args.general:
        g = med["general"]
        print("general path / pycocotools: " + ", ".join(f"{k} {g[k] / p[k]:.2f}x" for k in ("cpu", "wall", "peak")))
    if args.cached:
        first, second = (statistics.median(r["cpu"] for r in cached[w]) for w in ("first", "second"))
        print(f"with the index cache: first read CPU {first:.2f} s, second {second:.3f} s "
              f"({second / first:.3f}x the first; pycocotools / second {p['cpu'] / second:.0f}x)")
        med |= {f"cached_{w}": {"cpu": statistics.median(r["cpu"] for r in cached[w])} for w in cached}
    print(json.dumps({"images": args.images, "objects": m, "medians": med, "ratios": ratios}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
