"""Peak memory of reading a large CVAT for images XML file, streamed vs whole-tree.

Generates a deterministic CVAT 1.1 file of about ``--size-mb`` MB (faces: a box with two
attributes, a grouped 5-point skeleton, a tag per image), then measures, each in a fresh
process so that peak RSS (``ru_maxrss``) belongs to one measurement:

* ``import``       python + detloader imported, nothing read (the floor);
* ``tree``         ``lxml.etree.parse`` of the whole file: what a reader without streaming holds;
* ``stream``       :func:`detloader.annotations.readers.safe_xml.iter_xml` over every ``<image>``: the
                   parser's own footprint when records are dropped as they end;
* ``read``         ``read_annotations(path, format="cvat", check_images=False, cache=False)``:
                   streaming plus the index being built (ChunkBuilder's per-object records).

Memory is reported above the ``import`` floor and as a ratio to the file size; times as
MB/s and as a ratio to the tree parse of the same run (the machine is shared, so absolute
numbers drift; ratios measured together hold).

    python benchmarks/bench_cvat_stream.py                 # ~200 MB file in a temp folder
    python benchmarks/bench_cvat_stream.py --size-mb 20    # quick look
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

import numpy as np

FACE5 = ("left_eye", "right_eye", "nose", "left_mouth", "right_mouth")

META = """  <meta>
    <task>
      <name>bench faces</name>
      <labels>
        <label><name>face</name><type>rectangle</type><attributes>
          <attribute><name>age</name><input_type>select</input_type><values>adult\nchild</values></attribute>
          <attribute><name>mask</name><input_type>checkbox</input_type><values>false</values></attribute>
        </attributes></label>
        <label><name>masked</name><type>rectangle</type></label>
        <label><name>face5</name><type>skeleton</type></label>
""" + "".join(
    f"        <label><name>{n}</name><type>points</type><parent>face5</parent></label>\n" for n in FACE5
) + """        <label><name>indoor</name><type>tag</type></label>
        <label><name>outdoor</name><type>tag</type></label>
      </labels>
    </task>
  </meta>
"""


def _image_xml(i: int, rng: np.random.Generator) -> str:
    w, h = 1280, 720
    parts = [f'  <image id="{i}" name="frames/{i:08d}.jpg" width="{w}" height="{h}" subset="{"Train" if i % 5 else "Validation"}">\n']
    for f in range(int(rng.integers(1, 6))):
        x1, y1 = rng.uniform(0, w - 200), rng.uniform(0, h - 200)
        s = rng.uniform(40, 190)
        g = f + 1
        label = "face" if rng.random() < 0.9 else "masked"
        parts.append(
            f'    <box label="{label}" source="manual" occluded="{int(rng.random() < 0.1)}" '
            f'xtl="{x1:.2f}" ytl="{y1:.2f}" xbr="{x1 + s:.2f}" ybr="{y1 + s:.2f}" z_order="0" group_id="{g}">\n'
            f'      <attribute name="age">{"adult" if rng.random() < 0.8 else "child"}</attribute>\n'
            f'      <attribute name="mask">{"true" if label == "masked" else "false"}</attribute>\n'
            "    </box>\n"
            f'    <skeleton label="face5" source="manual" z_order="0" group_id="{g}">\n'
        )
        for k, name in enumerate(FACE5):
            px = x1 + s * (0.3 + 0.4 * (k % 2))
            py = y1 + s * (0.35 + 0.15 * k)
            parts.append(
                f'      <points label="{name}" source="manual" outside="0" occluded="{int(rng.random() < 0.05)}" '
                f'points="{px:.2f},{py:.2f}" z_order="0"></points>\n'
            )
        parts.append("    </skeleton>\n")
    parts.append(f'    <tag label="{"indoor" if rng.random() < 0.6 else "outdoor"}" source="manual"></tag>\n')
    parts.append("  </image>\n")
    return "".join(parts)


def generate(path: Path, size_mb: float, seed: int = 0) -> dict[str, int]:
    """Write the file; return its size and number of images."""
    rng = np.random.default_rng(seed)
    target = int(size_mb * 1024 * 1024)
    images = 0
    with open(path, "w", encoding="utf-8") as fh:
        fh.write('<?xml version="1.0" encoding="utf-8"?>\n<annotations>\n  <version>1.1</version>\n')
        fh.write(META)
        written = fh.tell()
        while written < target:
            block = "".join(_image_xml(images + k, rng) for k in range(500))
            images += 500
            fh.write(block)
            written += len(block)
        fh.write("</annotations>\n")
    return {"bytes": path.stat().st_size, "images": images}


_CHILD = r"""
import json, resource, sys, time
mode, path = sys.argv[1], sys.argv[2]
import detloader
from detloader.annotations.readers.safe_xml import iter_xml
from lxml import etree
start = time.perf_counter()
out = {}
if mode == "tree":
    root = etree.parse(path).getroot()
    out["images"] = sum(1 for _ in root.iterfind("image"))
elif mode == "stream":
    out["images"] = sum(1 for _ in iter_xml(path, "image"))
elif mode == "read":
    index = detloader.read_annotations(path, format="cvat", check_images=False, cache=False)
    out.update(images=len(index), objects=index.num_objects, index_bytes=sum(index.nbytes().values()),
               landmarks=len(index.landmark_schema), problems=len(index.problems))
out["seconds"] = time.perf_counter() - start
out["peak_rss"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
print(json.dumps(out))
"""


def measure(mode: str, path: Path) -> dict:
    env = dict(os.environ)
    src = str(Path(__file__).resolve().parents[1] / "src")
    env["PYTHONPATH"] = src + os.pathsep + env.get("PYTHONPATH", "")
    proc = subprocess.run(
        [sys.executable, "-c", _CHILD, mode, str(path)], capture_output=True, text=True, env=env, check=False
    )
    if proc.returncode != 0:
        raise RuntimeError(f"{mode} failed:\n{proc.stderr}")
    return json.loads(proc.stdout)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size-mb", type=float, default=200.0, help="file size to generate (default: 200)")
    parser.add_argument("--out", help="folder for the file (default: a temporary folder, removed)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--skip-tree", action="store_true", help="skip the whole-tree baseline (needs ~10x the file in RAM)")
    args = parser.parse_args(argv)

    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(args.out) if args.out else Path(tmp)
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / "annotations.xml"
        t0 = time.perf_counter()
        info = generate(path, args.size_mb, args.seed)
        mb = info["bytes"] / 2**20
        print(f"generated {path.name}: {mb:.1f} MB, {info['images']} images in {time.perf_counter() - t0:.1f} s")

        floor = measure("import", path)
        results = {"stream": measure("stream", path), "read": measure("read", path)}
        if not args.skip_tree:
            results["tree"] = measure("tree", path)
        print(f"import floor: peak RSS {floor['peak_rss'] / 2**20:.0f} MB (subtracted below)")
        tree_s = results["tree"]["seconds"] if "tree" in results else None
        print(f"{'mode':<8} {'peak RSS above floor':>21} {'x file':>7} {'MB/s':>7} {'time vs tree':>13}")
        for mode in ("tree", "stream", "read"):
            if mode not in results:
                continue
            r = results[mode]
            extra = (r["peak_rss"] - floor["peak_rss"]) / 2**20
            speed = mb / r["seconds"]
            rel = f"{r['seconds'] / tree_s:.2f}x" if tree_s else "-"
            print(f"{mode:<8} {extra:>18.0f} MB {extra / mb:>7.2f} {speed:>7.1f} {rel:>13}")
        read = results["read"]
        print(
            f"read: {read['images']} images, {read['objects']} objects, {read['landmarks']} landmarks, "
            f"{read['problems']} problems; index arrays {read['index_bytes'] / 2**20:.0f} MB"
        )
        if "tree" in results:
            ratio = (results["tree"]["peak_rss"] - floor["peak_rss"]) / max(1, results["read"]["peak_rss"] - floor["peak_rss"])
            print(f"whole-tree parse holds {ratio:.1f}x the memory of the streamed read")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
