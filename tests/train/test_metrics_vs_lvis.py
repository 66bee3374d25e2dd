"""detloader's LVIS scoring against lvis-api's LVISEval (0.5.3, in its own environment
``.venv-reference``, which ``make test`` builds) run on the same LVIS files: AP, AP50, AP75, APs, APm,
APl, APr, APc, APf to 1e-4, on files with classes of each frequency, negative and not-exhaustive
lists, more than 300 detections on one image and detections of classes neither annotated nor
verified absent."""

from __future__ import annotations

import importlib.util
import json
import subprocess
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from detloader import read_annotations
from detloader.train import score_predictions

LVIS_PYTHON = Path(__file__).resolve().parents[2] / ".venv-reference" / "bin" / "python"
BACKENDS = ["pycocotools"] + (["faster_coco_eval"] if importlib.util.find_spec("faster_coco_eval") else [])
FIGURES = {"AP": "map50_95", "AP50": "map50", "AP75": "map75", "APs": "map_small", "APm": "map_medium",
           "APl": "map_large", "APr": "apr", "APc": "apc", "APf": "apf"}
REFERENCE = """
import json, sys
from lvis import LVIS, LVISEval, LVISResults
gt = LVIS(sys.argv[1])
ev = LVISEval(gt, LVISResults(gt, sys.argv[2]), "bbox")
ev.run()
print(json.dumps({k: float(v) for k, v in ev.results.items()}))
"""

needs_lvis = pytest.mark.skipif(
    not LVIS_PYTHON.exists(), reason="lvis-api's environment .venv-reference is absent (make reference)"
)


def _lvis_files(tmp_path: Path, seed: int) -> tuple[Path, Path]:
    """An LVIS val file and its detections. Integer boxes with mask areas below the box's,
    detections moved by quarter pixels
    (exact in float32: detloader stores float32), distinct scores k / 4096 (no tie to order); the
    first image's 330 false positives score above every other detection, so that LVIS's 300 per
    image drop its hits."""
    rng = np.random.default_rng(seed)
    frequency = ["r", "r", "r", "c", "c", "c", "f", "f", "f"]
    cat_ids = [3, 8, 11, 14, 20, 27, 31, 40, 52]
    cats = [{"id": c, "name": f"class{c}", "frequency": f, "synset": f"s{c}.n.01", "synonyms": [], "def": "",
             "image_count": 1, "instance_count": 1} for c, f in zip(cat_ids, frequency)]
    images, anns, dets = [], [], []
    for k, iid in enumerate(rng.permutation(np.arange(2, 60, 4))[:12].tolist()):
        present = rng.choice(cat_ids, size=int(rng.integers(1, 4)), replace=False).tolist()
        others = [c for c in cat_ids if c not in present]
        neg = rng.choice(others, size=int(rng.integers(0, 4)), replace=False).tolist()
        partial = present[:1] if k % 3 == 0 else []
        images.append({"id": iid, "width": 640, "height": 480, "coco_url": f"http://x/val2017/{iid:012d}.jpg",
                       "neg_category_ids": neg, "not_exhaustive_category_ids": partial})
        for c in present:
            for _ in range(int(rng.integers(1, 4))):
                w, h = (int(v) for v in rng.integers(8, 200, 2))
                x, y = int(rng.integers(0, 640 - w)), int(rng.integers(0, 480 - h))
                area = w * h * float(rng.integers(30, 100)) / 100  # a mask's area: the box's decides no size
                anns.append({"id": 100 + len(anns), "image_id": iid, "category_id": c, "bbox": [x, y, w, h],
                             "area": area, "segmentation": [[x, y, x + w, y, x, y + h]]})
                for _ in range(int(rng.integers(0, 3))):  # hits and near misses
                    dx, dy, dw, dh = (float(v) / 4 for v in rng.integers(-40, 41, 4))
                    dets.append((iid, c, [x + dx, y + dy, max(w + dw, 2.0), max(h + dh, 2.0)], False))
        n_extra = 330 if k == 0 else int(rng.integers(2, 12))  # image 0: past LVIS's 300 per image
        for _ in range(n_extra):  # false positives of any class: present, negative, unchecked
            w, h = (int(v) for v in rng.integers(8, 150, 2))
            x, y = int(rng.integers(0, 640 - w)), int(rng.integers(0, 480 - h))
            dets.append((iid, int(rng.choice(cat_ids)), [x, y, w, h], k == 0))
    top = [d[3] for d in dets]
    order = rng.permutation(len(dets))
    order = np.concatenate([order[~np.asarray(top)[order]], order[np.asarray(top)[order]]])  # first image's FPs last
    scores = np.empty(len(dets))
    scores[order] = (np.arange(len(dets)) + 1) / 4096
    assert len(dets) < 4096
    results = [{"image_id": i, "category_id": c, "bbox": b, "score": float(s)} for (i, c, b, _), s in zip(dets, scores)]
    gt = {"info": {}, "annotations": anns, "images": images, "licenses": [], "categories": cats}
    gt_path, dt_path = tmp_path / "lvis_v1_val.json", tmp_path / "detections.json"
    gt_path.write_text(json.dumps(gt))
    dt_path.write_text(json.dumps(results))
    return gt_path, dt_path


def _reference(gt_path: Path, dt_path: Path) -> dict[str, float]:
    done = subprocess.run([str(LVIS_PYTHON), "-c", REFERENCE, str(gt_path), str(dt_path)],
                          capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


def _detloader(gt_path: Path, dt_path: Path, backend: str, protocol: str = "auto") -> dict[str, Any]:
    """detloader's metrics of the detections file on the LVIS file, read as a user reads it."""
    index = read_annotations(gt_path, check_images=False, cache=False)
    entries: dict[int, dict[str, list]] = {}
    for r in json.loads(dt_path.read_text()):
        e = entries.setdefault(r["image_id"], {"boxes": [], "scores": [], "labels": []})
        x, y, w, h = r["bbox"]
        e["boxes"].append([x, y, x + w, y + h])
        e["scores"].append(r["score"])
        e["labels"].append(r["category_id"])
    return score_predictions(entries, index, ids="dataset", labels="category", backend=backend,  # type: ignore[arg-type]
                             protocol=protocol)  # type: ignore[arg-type]


def _compare(reference: dict[str, float], metrics: dict[str, Any]) -> None:
    for name, key in FIGURES.items():
        ours = -1.0 if metrics[key] is None else metrics[key]
        assert ours == pytest.approx(reference[name], abs=1e-4), (name, ours, reference[name])


@needs_lvis
@pytest.mark.parametrize("backend", BACKENDS)
def test_lvis_scores_equal_lvis_api(tmp_path: Path, backend: str):
    gt_path, dt_path = _lvis_files(tmp_path, seed=0)
    reference = _reference(gt_path, dt_path)
    metrics = _detloader(gt_path, dt_path, backend)
    assert metrics["protocol"] == "lvis" and metrics["frequency_groups"]["source"] == "the dataset's frequency field"
    assert all(reference[name] > 0 for name in FIGURES)  # every figure is scored, none trivially -1 or 0
    _compare(reference, metrics)
    coco = _detloader(gt_path, dt_path, backend, protocol="coco")  # COCO's rules score the same files otherwise
    assert coco["protocol"] == "coco" and abs(coco["map50_95"] - reference["AP"]) > 1e-3


@needs_lvis
@pytest.mark.slow
@pytest.mark.parametrize("seed", [1, 2, 3, 4])
def test_lvis_scores_equal_lvis_api_on_random_files(tmp_path: Path, seed: int):
    gt_path, dt_path = _lvis_files(tmp_path, seed)
    reference = _reference(gt_path, dt_path)
    for backend in BACKENDS:
        _compare(reference, _detloader(gt_path, dt_path, backend))


def test_counts_at_the_operating_point_follow_lvis(tmp_path: Path):
    cats = [{"id": i, "name": n, "frequency": "f"} for i, n in ((1, "a"), (2, "b"), (3, "c"))]
    image = {"id": 7, "width": 100, "height": 100, "coco_url": "http://x/val2017/7.jpg",
             "neg_category_ids": [2], "not_exhaustive_category_ids": [1]}
    gt = {"annotations": [{"id": 1, "image_id": 7, "category_id": 1, "bbox": [10, 10, 20, 20], "area": 400}],
          "images": [image], "categories": cats}
    (tmp_path / "lvis_v1_val.json").write_text(json.dumps(gt))
    index = read_annotations(tmp_path / "lvis_v1_val.json", check_images=False, cache=False)
    boxes = [[10, 10, 30, 30], [60, 60, 80, 80], [60, 60, 80, 80], [60, 60, 80, 80]]
    entry = {"boxes": boxes, "scores": [0.9, 0.8, 0.7, 0.6], "labels": [0, 0, 1, 2]}
    for backend in BACKENDS:
        metrics = score_predictions({0: entry}, index, backend=backend)  # type: ignore[arg-type]
        rows = metrics["per_class"]
        assert (rows["a"]["tp"], rows["a"]["fp"]) == (1, 0)  # its miss is ignored: a is not exhaustive here
        assert (rows["b"]["tp"], rows["b"]["fp"]) == (0, 1)  # b is verified absent: a false positive
        assert (rows["c"]["tp"], rows["c"]["fp"]) == (0, 0)  # c was never checked: not scored
        assert metrics["map50"] == pytest.approx(1.0) and metrics["protocol"] == "lvis"
        coco = score_predictions({0: entry}, index, backend=backend, protocol="coco")  # type: ignore[arg-type]
        assert (coco["per_class"]["a"]["fp"], coco["per_class"]["c"]["fp"]) == (1, 1)
        empty = score_predictions({}, index, backend=backend)  # type: ignore[arg-type]
        assert (empty["map50_95"], empty["map_small"], empty["map_medium"], empty["map_large"]) == (0, 0, None, None)


def _lvis_from_index(index: Any, tmp_path: Path, seed: int) -> tuple[Path, Path]:
    """A real dataset (BCCD) as an LVIS val file and detections: its boxes and classes, the
    classes' frequency by their image counts' rank (fewest r, then c, the rest f, so that each
    group is scored), each image's absent classes checked on a draw
    (neg_category_ids), every fourth image's first class not exhaustive; the detections its
    boxes moved and missed at random, plus false positives of any class, scores distinct."""
    rng = np.random.default_rng(seed)
    names = list(index.classes)
    counts = index.class_counts("images")
    rank = {n: r for r, n in enumerate(sorted(names, key=lambda n: counts[n]))}
    cats = [{"id": k + 1, "name": n, "frequency": "rcf"[min(rank[n], 2)]} for k, n in enumerate(names)]
    images, anns, dets = [], [], []
    offsets, labels, boxes = index.object_offsets, index.labels, index.boxes
    for i in range(len(index)):
        w, h = int(index.width[i]), int(index.height[i])
        held = sorted({int(c) + 1 for c in labels[offsets[i]:offsets[i + 1]]})
        absent = [c["id"] for c in cats if c["id"] not in held and rng.random() < 0.6]
        images.append({"id": i + 1, "width": w, "height": h, "coco_url": f"http://x/val2017/{i + 1:012d}.jpg",
                       "neg_category_ids": absent, "not_exhaustive_category_ids": held[:1] if i % 4 == 0 else []})
        for j in range(int(offsets[i]), int(offsets[i + 1])):
            x1, y1, x2, y2 = (float(v) for v in boxes[j])
            anns.append({"id": j + 1, "image_id": i + 1, "category_id": int(labels[j]) + 1,
                         "bbox": [x1, y1, x2 - x1, y2 - y1], "area": (x2 - x1) * (y2 - y1)})
            if rng.random() < 0.8:
                d = rng.integers(-24, 25, 4) / 4
                dets.append([i + 1, int(labels[j]) + 1, [x1 + d[0], y1 + d[1], max(x2 - x1 + d[2], 2.0),
                                                         max(y2 - y1 + d[3], 2.0)]])
        for _ in range(int(rng.integers(0, 6))):
            bw, bh = (float(v) for v in rng.integers(10, 120, 2))
            dets.append([i + 1, int(rng.integers(1, len(cats) + 1)),
                         [float(rng.integers(0, max(w - bw, 1))), float(rng.integers(0, max(h - bh, 1))), bw, bh]])
    scores = (rng.permutation(len(dets)) + 1) / (len(dets) + 1)
    results = [{"image_id": i, "category_id": c, "bbox": b, "score": float(s)} for (i, c, b), s in zip(dets, scores)]
    gt_path, dt_path = tmp_path / "lvis_v1_val.json", tmp_path / "detections.json"
    gt_path.write_text(json.dumps({"info": {}, "licenses": [], "images": images, "annotations": anns,
                                   "categories": cats}))
    dt_path.write_text(json.dumps(results))
    return gt_path, dt_path


@needs_lvis
@pytest.mark.dataset
@pytest.mark.slow
def test_lvis_scores_equal_lvis_api_on_a_real_dataset_made_lvis_shaped(bccd_root: Path, tmp_path: Path):
    """BCCD (364 images, 4,888 boxes, 3 classes) as an LVIS file: every figure lvis-api prints."""
    index = read_annotations(bccd_root, on_error="skip", cache=False)
    gt_path, dt_path = _lvis_from_index(index, tmp_path, seed=0)
    reference = _reference(gt_path, dt_path)
    for backend in BACKENDS:
        metrics = _detloader(gt_path, dt_path, backend)
        assert metrics["protocol"] == "lvis" and all(reference[n] > 0 for n in ("APr", "APc", "APf"))
        for name, key in FIGURES.items():
            ours = -1.0 if metrics[key] is None else metrics[key]
            assert ours == pytest.approx(reference[name], abs=1e-4), (backend, name, ours, reference[name])
