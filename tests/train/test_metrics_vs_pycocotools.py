"""detloader's metrics against pycocotools' COCOeval run directly on the same COCO files (gapped,
unsorted image and category ids, ids from 0, crowd regions, images without predictions), the
results file against the original annotations, VOC difficult objects against the VOC devkit's
matching rule, TP / FP / FN counts, and predictions that cannot be scored."""

from __future__ import annotations

import contextlib
import importlib.util
import io
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from helpers import voc_dataset, voc_object, voc_xml, write_image

from detloader import read_annotations
from detloader.errors import PredictionError
from detloader.train import score_predictions

pytest.importorskip("pycocotools")
from pycocotools.coco import COCO  # noqa: E402
from pycocotools.cocoeval import COCOeval  # noqa: E402

BACKENDS = ["pycocotools"] + (["faster_coco_eval"] if importlib.util.find_spec("faster_coco_eval") else [])


def _coco_file(tmp_path: Path, image_ids: list[int], cat_ids: list[int], seed: int, crowd: int = 2) -> Path:
    """A COCO instances file with the given (unsorted, gapped) ids, 1-4 objects per image on a
    grid of cells (integer coordinates: no float32 rounding near an IoU threshold), ``crowd``
    crowd regions, and the images written beside it."""
    rng = np.random.default_rng(seed)
    images, anns = [], []
    for iid in image_ids:
        name = f"img{iid}.jpg"
        write_image(tmp_path / "images" / name, (200, 160))
        images.append({"id": iid, "file_name": name, "width": 200, "height": 160})
        cells = rng.choice(12, size=int(rng.integers(1, 5)), replace=False)
        for cell in cells:
            x, y = 40 * int(cell % 4) + 4, 40 * int(cell // 4) + 4
            w, h = int(rng.integers(14, 32)), int(rng.integers(14, 32))
            anns.append({"id": 1000 + len(anns), "image_id": iid, "category_id": int(rng.choice(cat_ids)),
                         "bbox": [x, y, w, h], "area": w * h, "iscrowd": 0})
    for k in range(crowd):  # a crowd region over the cell of an object, same class
        target = anns[3 * k + 1]
        x, y, w, h = target["bbox"]
        anns.append({"id": 5000 + k, "image_id": target["image_id"], "category_id": target["category_id"],
                     "bbox": [x - 2, y - 2, w + 8, h + 8], "area": (w + 8) * (h + 8), "iscrowd": 1})
    cats = [{"id": c, "name": f"class{c}"} for c in cat_ids]
    order = rng.permutation(len(images))  # images listed unsorted
    data = {"images": [images[i] for i in order], "annotations": anns, "categories": cats[::-1]}
    path = tmp_path / "instances_val.json"
    path.write_text(json.dumps(data))
    return path


def _results(path: Path, seed: int, skip: int) -> list[dict[str, Any]]:
    """COCO results on the file's own ids: ground truth moved by a few pixels (some boxes far
    enough to miss), false positives, detections inside crowd regions, and no detection at all
    on ``skip`` images."""
    rng = np.random.default_rng(seed)
    data = json.loads(path.read_text())
    cats = [c["id"] for c in data["categories"]]
    skipped = {img["id"] for img in data["images"][:skip]}
    out = []
    for a in data["annotations"]:
        if a["image_id"] in skipped:
            continue
        x, y, w, h = a["bbox"]
        n = 3 if a["iscrowd"] else 1
        for _ in range(n):
            dx, dy = (int(v) for v in rng.integers(-6, 7, 2))
            score = round(float(rng.uniform(0.05, 1.0)), 3)
            out.append({"image_id": a["image_id"], "category_id": a["category_id"], "bbox": [x + dx, y + dy, w, h],
                        "score": score})
    for img in data["images"]:
        if img["id"] not in skipped:
            for _ in range(int(rng.integers(0, 3))):
                x, y = (int(v) for v in rng.integers(0, 130, 2))
                out.append({"image_id": img["id"], "category_id": int(rng.choice(cats)), "bbox": [x, y, 20, 20],
                            "score": round(float(rng.uniform(0.0, 0.7)), 3)})
    return out


def _pycocotools(path: Path, results: list[dict[str, Any]], **params: Any) -> COCOeval:
    with contextlib.redirect_stdout(io.StringIO()):
        gt = COCO(str(path))
        ev = COCOeval(gt, gt.loadRes(results), "bbox")
        for key, value in params.items():
            setattr(ev.params, key, value)
        ev.evaluate()
        ev.accumulate()
        ev.summarize()
    return ev


def _by_image(results: list[dict[str, Any]]) -> dict[int, dict[str, list]]:
    """Results grouped per dataset image id, boxes back to xyxy, labels as category ids."""
    out: dict[int, dict[str, list]] = {}
    for r in results:
        e = out.setdefault(r["image_id"], {"boxes": [], "scores": [], "labels": []})
        x, y, w, h = r["bbox"]
        e["boxes"].append([x, y, x + w, y + h])
        e["scores"].append(r["score"])
        e["labels"].append(r["category_id"])
    return out


CASES = {
    "gapped_unsorted": ([42, 7, 19, 3, 88, 5, 61, 12], [1, 3, 5]),
    "from_zero": ([0, 1, 2, 3, 4, 5, 6], [0, 1, 2]),
    "large_ids": ([9001, 17, 400, 2, 33, 71], [90, 2, 44]),
}


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("case", sorted(CASES))
def test_map_equals_pycocotools_on_the_file(tmp_path: Path, case: str, backend: str):
    image_ids, cat_ids = CASES[case]
    path = _coco_file(tmp_path, image_ids, cat_ids, seed=len(case))
    results = _results(path, seed=3, skip=2)
    ref = _pycocotools(path, results)
    index = read_annotations(path, cache=False)
    assert sorted(index.image_ids.tolist()) == sorted(image_ids) and sorted(index.category_ids.tolist()) == sorted(
        cat_ids
    )
    assert int(index.crowd.sum()) == 2
    m = score_predictions(_by_image(results), index, ids="dataset", labels="category", backend=backend,
                          coco_json=tmp_path / "results.json")
    assert m["images"] == len(image_ids) and m["images_with_predictions"] == len(image_ids) - 2
    assert m["map50_95"] == pytest.approx(ref.stats[0], abs=1e-12)
    assert m["map50"] == pytest.approx(ref.stats[1], abs=1e-12)
    assert 0.0 < m["map50"] < 1.0
    # per class: AP@0.5 as pycocotools' precision curve gives it
    for k, cid in enumerate(ref.params.catIds):
        name = f"class{cid}"
        prec = ref.eval["precision"][0, :, k, 0, -1]
        expected = float(prec[prec > -1].mean()) if (prec > -1).any() else None
        assert m["per_class"][name]["ap50"] == (pytest.approx(expected, abs=1e-12) if expected is not None else None)
    # the results file loads against the original annotations and scores the same
    written = json.loads((tmp_path / "results.json").read_text())
    assert {r["image_id"] for r in written} <= set(image_ids) and {r["category_id"] for r in written} <= set(cat_ids)
    again = _pycocotools(path, written)
    np.testing.assert_allclose(again.stats, ref.stats, atol=1e-6)


def test_rows_and_class_indexes_score_the_same(tmp_path: Path):
    path = _coco_file(tmp_path, [42, 7, 19, 3, 88, 5], [1, 3, 5], seed=1)
    results = _results(path, seed=4, skip=1)
    index = read_annotations(path, cache=False)
    by_id = _by_image(results)
    row = {int(v): r for r, v in enumerate(index.image_ids.tolist())}
    cls = {int(c): k for k, c in enumerate(index.category_ids.tolist())}
    by_row = {row[i]: {**e, "labels": [cls[c] for c in e["labels"]]} for i, e in by_id.items()}
    a = score_predictions(by_id, index, ids="dataset", labels="category")
    b = score_predictions(by_row, index)
    assert a == b and a["map50"] == pytest.approx(_pycocotools(path, results).stats[1], abs=1e-12)


def test_images_without_predictions_are_misses(tmp_path: Path):
    path = _coco_file(tmp_path, [42, 7, 19, 3, 88, 5], [1, 3, 5], seed=2, crowd=0)
    data = json.loads(path.read_text())
    half = {img["id"] for img in data["images"][:3]}
    perfect = [{"image_id": a["image_id"], "category_id": a["category_id"], "bbox": a["bbox"], "score": 0.9}
               for a in data["annotations"] if a["image_id"] in half]
    index = read_annotations(path, cache=False)
    m = score_predictions(_by_image(perfect), index, ids="dataset", labels="category")
    ref = _pycocotools(path, perfect)
    assert m["map50"] == pytest.approx(ref.stats[1], abs=1e-12) and m["map50"] < 0.99
    missed = sum(a["image_id"] not in half for a in data["annotations"])
    assert (m["tp"], m["fp"], m["fn"]) == (len(perfect), 0, missed)
    assert m["recall"] == pytest.approx(len(perfect) / len(data["annotations"]))


def test_crowd_regions_are_ignored_like_pycocotools(tmp_path: Path):
    """One object and a crowd region beside it: a detection on the object (TP), three on the
    crowd (ignored, not false positives), a miss of nothing."""
    write_image(tmp_path / "images" / "a.jpg", (160, 120))
    data = {
        "images": [{"id": 5, "file_name": "a.jpg", "width": 160, "height": 120}],
        "categories": [{"id": 3, "name": "person"}],
        "annotations": [
            {"id": 1, "image_id": 5, "category_id": 3, "bbox": [10, 10, 30, 30], "area": 900, "iscrowd": 0},
            {"id": 2, "image_id": 5, "category_id": 3, "bbox": [60, 20, 80, 80], "area": 6400, "iscrowd": 1},
        ],
    }
    path = tmp_path / "crowd.json"
    path.write_text(json.dumps(data))
    results = [{"image_id": 5, "category_id": 3, "bbox": [10, 10, 30, 30], "score": 0.5}] + [
        {"image_id": 5, "category_id": 3, "bbox": [62 + 20 * k, 22, 18, 30], "score": 0.9} for k in range(3)
    ]
    index = read_annotations(path, cache=False)
    m = score_predictions(_by_image(results), index, ids="dataset", labels="category")
    ref = _pycocotools(path, results)
    assert ref.stats[1] == pytest.approx(1.0) and m["map50"] == pytest.approx(ref.stats[1], abs=1e-12)
    assert (m["tp"], m["fp"], m["fn"]) == (1, 0, 0)
    assert m["per_class"]["person"]["ignored"] == 1 and m["per_class"]["person"]["objects"] == 2


def test_counts_at_the_operating_point(tmp_path: Path):
    """TP / FP / FN counted at the score threshold and IoU 0.5 (not read off the curve)."""
    write_image(tmp_path / "images" / "a.jpg", (160, 120))
    write_image(tmp_path / "images" / "b.jpg", (160, 120))
    boxes = [[10, 10, 30, 30], [60, 10, 30, 30], [110, 10, 30, 30], [10, 70, 30, 30]]
    data = {
        "images": [{"id": 0, "file_name": "a.jpg", "width": 160, "height": 120},
                   {"id": 1, "file_name": "b.jpg", "width": 160, "height": 120}],
        "categories": [{"id": 0, "name": "cat"}, {"id": 2, "name": "dog"}],
        "annotations": [{"id": k + 1, "image_id": 0, "category_id": 0, "bbox": b, "area": 900, "iscrowd": 0}
                        for k, b in enumerate(boxes)]
        + [{"id": 9, "image_id": 1, "category_id": 2, "bbox": [50, 50, 40, 40], "area": 1600, "iscrowd": 0}],
    }
    path = tmp_path / "counts.json"
    path.write_text(json.dumps(data))
    results = [
        {"image_id": 0, "category_id": 0, "bbox": boxes[0], "score": 0.9},  # TP
        {"image_id": 0, "category_id": 0, "bbox": boxes[0], "score": 0.8},  # duplicate: FP
        {"image_id": 0, "category_id": 0, "bbox": boxes[1], "score": 0.2},  # below 0.3: not counted
        {"image_id": 0, "category_id": 0, "bbox": [120, 80, 30, 30], "score": 0.6},  # FP (nothing there)
        {"image_id": 0, "category_id": 2, "bbox": boxes[2], "score": 0.7},  # wrong class: FP for dog
        {"image_id": 0, "category_id": 0, "bbox": [10, 70, 12, 12], "score": 0.95},  # IoU 0.16: FP
    ]
    index = read_annotations(path, cache=False)
    m = score_predictions(_by_image(results), index, ids="dataset", labels="category", score_threshold=0.3)
    cat, dog = m["per_class"]["cat"], m["per_class"]["dog"]
    assert (cat["tp"], cat["fp"], cat["fn"]) == (1, 3, 3)
    assert (dog["tp"], dog["fp"], dog["fn"]) == (0, 1, 1)
    assert (m["tp"], m["fp"], m["fn"]) == (1, 4, 4)
    assert cat["precision"] == pytest.approx(0.25) and cat["recall"] == pytest.approx(0.25)
    assert dog["precision"] == 0.0 and dog["recall"] == 0.0
    low = score_predictions(_by_image(results), index, ids="dataset", labels="category", score_threshold=0.1)
    assert (low["per_class"]["cat"]["tp"], low["per_class"]["cat"]["fn"]) == (2, 2)
    assert m["map50"] == pytest.approx(_pycocotools(path, results).stats[1], abs=1e-12)


def test_predictions_that_cannot_be_scored_are_named(tmp_path: Path):
    path = _coco_file(tmp_path, [42, 7, 19], [1, 3, 5], seed=5, crowd=0)
    index = read_annotations(path, cache=False)
    ok = {"boxes": [[1, 1, 20, 20]], "scores": [0.5], "labels": [3]}
    assert score_predictions({42: ok}, index, ids="dataset", labels="category")["images"] == 3
    with pytest.raises(PredictionError, match="category_id=4 is not a category of the dataset"):
        score_predictions({42: {**ok, "labels": [4]}}, index, ids="dataset", labels="category")
    with pytest.raises(PredictionError, match="label 3 is not a class index of the dataset"):
        score_predictions({0: ok}, index)
    with pytest.raises(PredictionError, match="image_id=8 is not an image id of the evaluated images"):
        score_predictions({8: ok}, index, ids="dataset", labels="category")
    with pytest.raises(PredictionError, match="image_id=42 is not a row of the index"):
        score_predictions({42: ok}, index, labels="category")
    with pytest.raises(PredictionError, match=r"box 0 is \[nan"):
        score_predictions({42: {**ok, "boxes": [[float("nan"), 1, 20, 20]]}}, index, ids="dataset", labels="category")
    for bad in (1.5, -0.1, float("nan")):
        with pytest.raises(PredictionError, match="outside \\[0, 1\\]"):
            score_predictions({42: {**ok, "scores": [bad]}}, index, ids="dataset", labels="category")
    with pytest.raises(ValueError, match="ids='index'"):
        score_predictions({42: ok}, index, ids="index")  # type: ignore[arg-type]


# -- VOC difficult ----------------------------------------------------------------------------
def _voc_devkit(gt: list[tuple[int, list[float], bool]], dets: list[tuple[int, list[float], float]],
                thresh: float = 0.5) -> tuple[int, int, int]:
    """TP, FP and npos of one class by the VOC devkit's rule (VOCevaldet.m / py-faster-rcnn
    voc_eval.py): detections by falling score, each to the ground truth of its image with the
    highest IoU; above ``thresh``: a difficult one makes it neither TP nor FP, a free one TP, a
    taken one FP; else FP. Difficult objects do not count in npos. (IoU without the devkit's +1
    pixel: the cases below sit far from the threshold.)"""
    taken = [False] * len(gt)
    tp = fp = 0
    for image, box, _ in sorted(dets, key=lambda d: -d[2]):
        best, jmax = -1.0, -1
        for j, (g_image, g, _) in enumerate(gt):
            if g_image != image:
                continue
            iw = max(0.0, min(box[2], g[2]) - max(box[0], g[0]))
            ih = max(0.0, min(box[3], g[3]) - max(box[1], g[1]))
            inter = iw * ih
            union = (box[2] - box[0]) * (box[3] - box[1]) + (g[2] - g[0]) * (g[3] - g[1]) - inter
            if inter / union > best:
                best, jmax = inter / union, j
        if best > thresh:
            if gt[jmax][2]:
                continue
            if not taken[jmax]:
                tp, taken[jmax] = tp + 1, True
            else:
                fp += 1
        else:
            fp += 1
    return tp, fp, sum(not d for _, _, d in gt)


@pytest.fixture
def voc_index(tmp_path: Path):
    objects = {
        "a": [("car", (10, 10, 40, 40), "0"), ("car", (60, 10, 90, 40), "1"), ("car", (110, 60, 150, 100), "0")],
        "b": [("car", (20, 20, 60, 60), "1"), ("car", (80, 30, 120, 80), "0")],
        "c": [("car", (30, 30, 70, 70), "0")],
    }
    files = {stem: voc_xml(f"{stem}.jpg", [voc_object(n, b, difficult=d) for n, b, d in objs], size=(160, 120))
             for stem, objs in objects.items()}
    index = read_annotations(voc_dataset(tmp_path / "voc", files, image_size=(160, 120)), cache=False)
    assert int(index.difficult.sum()) == 2
    return index


def _as_entries(index, dets: list[tuple[int, list[float], float]]) -> dict[int, dict[str, list]]:
    out: dict[int, dict[str, list]] = {i: {"boxes": [], "scores": [], "labels": []} for i in range(len(index))}
    for image, box, score in dets:
        out[image]["boxes"].append(box)
        out[image]["scores"].append(score)
        out[image]["labels"].append(0)
    return out


def _truth(index) -> list[tuple[int, list[float], bool]]:
    return [(int(i), b, bool(d)) for i, b, d in zip(index.object_image, index.boxes.tolist(), index.difficult)]


@pytest.mark.parametrize("backend", BACKENDS)
def test_voc_difficult_perfect_predictions_on_the_others_score_one(voc_index, backend: str):
    gt = _truth(voc_index)
    dets = [(i, b, 0.9 - 0.1 * k) for k, (i, b, d) in enumerate(gt) if not d]
    m = score_predictions(_as_entries(voc_index, dets), voc_index, backend=backend)
    assert m["map50"] == pytest.approx(1.0) and m["map50_95"] == pytest.approx(1.0)
    assert (m["tp"], m["fp"], m["fn"]) == _voc_devkit(gt, dets)[:2] + (0,) == (4, 0, 0)
    everything = [(i, b, 0.9 - 0.1 * k) for k, (i, b, _) in enumerate(gt)]  # and on the difficult ones
    m = score_predictions(_as_entries(voc_index, everything), voc_index, backend=backend)
    assert m["map50"] == pytest.approx(1.0) and (m["tp"], m["fp"], m["fn"]) == (4, 0, 0)
    assert m["per_class"]["car"]["ignored"] == 2


def test_voc_difficult_counts_equal_the_devkit(voc_index):
    """Misses, false positives, a near miss and detections on difficult objects: TP / FP / FN
    equal the devkit's at every threshold."""
    gt = _truth(voc_index)
    dets = [
        (0, [11, 11, 41, 41], 0.95),  # TP
        (0, [61, 12, 89, 41], 0.9),  # on a difficult object: neither
        (0, [0, 80, 30, 110], 0.85),  # nothing there: FP
        (1, [22, 18, 61, 58], 0.8),  # difficult: neither
        (1, [80, 30, 100, 50], 0.7),  # IoU 0.2: FP
        (2, [31, 29, 70, 71], 0.4),  # TP
        (0, [110, 60, 150, 100], 0.2),  # TP at low thresholds
    ]
    entries = _as_entries(voc_index, dets)
    for threshold in (0.0, 0.3, 0.5, 0.75, 0.9):
        m = score_predictions(entries, voc_index, score_threshold=threshold)
        tp, fp, npos = _voc_devkit(gt, [d for d in dets if d[2] >= threshold])
        assert (m["tp"], m["fp"], m["fn"]) == (tp, fp, npos - tp), threshold
