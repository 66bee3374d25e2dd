"""The Open Images Challenge evaluator (train/openimages_eval.py): the protocol on hand-made
cases, then equality with the TensorFlow Object Detection API's own challenge evaluation
(tests/train/openimages_reference.py, run in .venv-reference) on generated files."""

from __future__ import annotations

import csv
import math
import subprocess
from pathlib import Path

import numpy as np
import pytest
from helpers import oi_case, write_oi_case

from detloader.train.openimages_eval import ImageTruth, _iou, openimages_ap
from detloader.train.predictions import ImagePredictions

ROOT = Path(__file__).resolve().parents[2]
REFERENCE_PY = ROOT / ".venv-reference" / "bin" / "python"
REFERENCE = Path(__file__).with_name("openimages_reference.py")
needs_reference = pytest.mark.skipif(
    not REFERENCE_PY.exists(),
    reason="the reference (the TF Object Detection API's Open Images Challenge evaluation) runs in "
    ".venv-reference, which `make reference` (and `make test`) builds",
)


def truth(boxes, labels, group_of=None, present=(), absent=(), difficult=()) -> ImageTruth:
    n = len(labels)
    return ImageTruth(np.asarray(boxes, float).reshape(-1, 4), np.asarray(labels, np.int64),
                      np.asarray(group_of if group_of is not None else [False] * n, bool),
                      np.asarray(difficult, bool), np.asarray(present, np.int64), np.asarray(absent, np.int64))


def preds(image: int, boxes, scores, labels) -> ImagePredictions:
    p = len(labels)
    return ImagePredictions(image, np.asarray(boxes, np.float32).reshape(-1, 4), np.asarray(scores, np.float32),
                            np.asarray(labels, np.int64), np.zeros((p, 0, 2), np.float32), np.zeros(0, np.float32))


def test_detections_inside_one_group_of_box_count_once():
    gt = [truth([[0, 0, 100, 100], [200, 200, 260, 260]], [0, 0], group_of=[True, False])]
    dets = [preds(0, [[10, 10, 30, 30], [40, 40, 60, 60], [50, 50, 90, 90], [200, 200, 260, 260]],
                  [0.9, 0.8, 0.7, 0.6], [0, 0, 0, 0])]
    out = openimages_ap(gt, dets, ["dog"])
    assert out["per_class"]["dog"] == {"ap50": 1.0, "objects": 2, "group_of": 1}
    # a detection mostly outside the group-of box is a false positive, here ranked first: precision
    # 0/1, 1/2 (the group), 2/3; interpolated, 2/3 at both recalls
    dets = [preds(0, [[-100, 10, 20, 30], [10, 10, 30, 30], [200, 200, 260, 260]], [0.95, 0.9, 0.6], [0, 0, 0])]
    assert openimages_ap(gt, dets, ["dog"])["map50"] == pytest.approx(2 / 3)


def test_unverified_classes_are_ignored_and_verified_absent_ones_are_false_positives():
    gt = [truth([[0, 0, 50, 50]], [0], absent=[1])]
    box = [[0, 0, 50, 50]]
    out = openimages_ap(gt, [preds(0, box * 3, [0.9, 0.8, 0.7], [2, 1, 0])], ["car", "bus", "dog"])
    assert out["ignored_detections"] == 1  # the dog: never verified in the image
    assert out["per_class"]["car"]["ap50"] == 1.0
    assert out["per_class"]["bus"] == {"ap50": None, "objects": 0, "group_of": 0}  # no ground truth: no AP
    assert out["map50"] == 1.0
    # the bus (verified absent) is a false positive of a class scored elsewhere
    gt.append(truth([[0, 0, 50, 50]], [1]))
    out = openimages_ap(gt, [preds(0, box * 2, [0.9, 0.8], [1, 0]), preds(1, box, [0.5], [1])], ["car", "bus", "dog"])
    assert out["per_class"]["bus"]["ap50"] == pytest.approx(0.5)


def test_hierarchy_expands_boxes_labels_and_detections():
    classes, hierarchy = ["vehicle", "car", "bus"], {"car": ["vehicle"], "bus": ["vehicle"]}
    gt = [truth([[0, 0, 50, 50]], [1], absent=[0])]  # absent vehicle: absent car and bus, but a car is boxed
    dets = [preds(0, [[0, 0, 50, 50], [60, 60, 90, 90]], [0.9, 0.8], [1, 2])]
    out = openimages_ap(gt, dets, classes, hierarchy)
    assert out["per_class"]["vehicle"] == {"ap50": pytest.approx(1.0), "objects": 1, "group_of": 0}
    assert out["per_class"]["car"]["ap50"] == 1.0
    assert out["ignored_detections"] == 0
    flat = openimages_ap(gt, dets, classes, hierarchy, expand_detections=False)
    assert flat["per_class"]["vehicle"]["ap50"] == 0.0  # the box is a vehicle too, no detection says so


def test_difficult_boxes_ignore_what_they_match_and_invalid_detections_are_counted():
    gt = [truth([[0, 0, 50, 50], [100, 100, 150, 150]], [0, 0], difficult=[True, False])]
    dets = [preds(0, [[0, 0, 50, 50], [100, 100, 150, 150], [5, 5, 5, 9]], [0.9, 0.8, 0.7], [0, 0, 0])]
    out = openimages_ap(gt, dets, ["a"])
    assert out["per_class"]["a"] == {"ap50": 1.0, "objects": 1, "group_of": 0}
    assert out["invalid_detections"] == 1


def ancestors(parents: dict[str, list[str]], mid: str) -> set[str]:
    found: set[str] = set()
    for p in parents.get(mid, []):
        found |= {p} | ancestors(parents, p)
    return found


def ours(case: dict, expand: bool) -> dict:
    """The case in pixels (coordinates times the image's size) through openimages_ap."""
    row = {m: k for k, m in enumerate(case["mids"])}
    name = dict(zip(case["mids"], case["names"]))
    hierarchy = {name[m]: sorted(name[a] for a in ancestors(case["parents"], m)) for m in case["mids"]}
    images = list(case["sizes"])
    gt, dets = [], []
    for i, image in enumerate(images):
        w, h = case["sizes"][image]

        def pixels(x0, x1, y0, y1, w=w, h=h):
            return [float(x0) * w, float(y0) * h, float(x1) * w, float(y1) * h]

        b = [r for r in case["boxes"] if r[0] == image]
        lab = [r for r in case["labels"] if r[0] == image]
        gt.append(truth([pixels(*r[4:8]) for r in b], [row[r[2]] for r in b], [bool(r[10]) for r in b],
                        [row[r[2]] for r in lab if r[3] == 1], [row[r[2]] for r in lab if r[3] == 0]))
        p = [r for r in case["predictions"] if r[0] == image]
        dets.append(preds(i, [pixels(*r[3:7]) for r in p], [r[2] for r in p], [row[r[1]] for r in p]))
    return openimages_ap(gt, dets, case["names"], hierarchy, expand_detections=expand)


def reference(files: dict[str, Path], expand: bool) -> tuple[float, dict[str, float | None]]:
    """mAP and AP per MID (None: no ground truth) of the reference on ``files``."""
    out = files["boxes"].parent / "reference" / "metrics.csv"  # the expanded files beside it
    out.parent.mkdir()
    cmd = [str(REFERENCE_PY), str(REFERENCE), "--out", str(out)]
    cmd += [f"--{k}={files[k]}" for k in ("hierarchy", "boxes", "labels", "predictions", "labelmap")]
    run = subprocess.run(cmd + (["--expand-predictions"] if expand else []), capture_output=True, text=True)
    assert run.returncode == 0, run.stderr[-3000:]
    per_class, mean = {}, math.nan
    with open(out, newline="") as f:
        for key, value in csv.reader(f):
            v = float(value)
            if key.endswith("Precision/mAP@0.5IOU"):
                mean = v
            else:
                per_class[key.split("AP@0.5IOU/", 1)[1]] = None if math.isnan(v) else v
    return mean, per_class


@needs_reference
@pytest.mark.slow
@pytest.mark.parametrize(("seed", "expand"), [(0, True), (1, True), (2, True), (3, False), (4, False)])
def test_equals_the_tf_object_detection_api_challenge_evaluation(tmp_path, seed, expand):
    case = oi_case(seed)
    mean, per_mid = reference(write_oi_case(tmp_path, case), expand)
    got = ours(case, expand)
    name = dict(zip(case["mids"], case["names"]))
    assert {name[m]: v for m, v in per_mid.items()} == pytest.approx(
        {n: row["ap50"] for n, row in got["per_class"].items()}, abs=1e-6)
    assert got["map50"] == pytest.approx(mean, abs=1e-6)
    # the case exercises what the protocol is about
    assert got["ignored_detections"] > 0 and any(r["group_of"] for r in got["per_class"].values())


def read_predictions(index, case: dict) -> dict[int, dict]:
    """The case's predictions CSV rows as score_predictions entries: rows of the index, pixels."""
    row = {Path(p).stem: i for i, p in enumerate(index.image_paths())}
    names = dict(zip(case["mids"], case["names"]))
    out: dict[int, dict] = {i: {"boxes": [], "scores": [], "labels": []} for i in range(len(index))}
    for image, mid, score, x0, x1, y0, y1 in case["predictions"]:
        i = row[image]
        w, h = int(index.width[i]), int(index.height[i])
        out[i]["boxes"].append([x0 * w, y0 * h, x1 * w, y1 * h])
        out[i]["scores"].append(score)
        out[i]["labels"].append(index.classes.index(names[mid]))
    return {i: {"boxes": np.asarray(e["boxes"], np.float32).reshape(-1, 4), "scores": np.asarray(e["scores"]),
                "labels": np.asarray(e["labels"], np.int64)} for i, e in out.items()}


@needs_reference
@pytest.mark.slow
def test_reading_the_files_and_scoring_equals_the_reference(tmp_path, capsys):
    """The same files through read_annotations (format found: openimages) and score_predictions
    (protocol found: openimages), against the reference on the files themselves."""
    from helpers import write_image

    from detloader import read_annotations
    from detloader.train import score_predictions

    case = oi_case(5, images=16)
    files = write_oi_case(tmp_path, case)
    for image, size in case["sizes"].items():
        write_image(tmp_path / "validation" / f"{image}.jpg", size)
    mean, per_mid = reference(files, expand=True)
    index = read_annotations(tmp_path, cache=False)
    metrics = score_predictions(read_predictions(index, case), index)
    assert metrics["protocol"] == "openimages" and metrics["map50_95"] is None
    assert metrics["map50"] == pytest.approx(mean, abs=1e-6)
    name = dict(zip(case["mids"], case["names"]))
    assert {name[m]: v for m, v in per_mid.items()} == pytest.approx(
        {n: row["ap50"] for n, row in metrics["per_class"].items()}, abs=1e-6)
    assert score_predictions(read_predictions(index, case), index, protocol="coco")["map50"] != metrics["map50"]
    from detloader.cli.train import print_metrics

    print_metrics(metrics)  # what detloader evaluate prints
    assert f"Open Images protocol: AP@0.5 over the boxes expanded up the class hierarchy, group-of boxes counted " \
        f"once; {metrics['ignored_detections']} detections" in " ".join(capsys.readouterr().out.split())


def case_from_index(index, seed: int) -> dict:
    """A real dataset (BCCD) as an Open Images case (:func:`helpers.oi_case`'s shape): its boxes
    in fractions of the image, a parent class over its first two classes, a tenth of the boxes
    group-of; each image's classes verified present, the others verified absent or unchecked at
    random; detections its boxes moved (a tenth named by the parent) and strays, scores distinct.
    A box that repeats another of its class (IoU >= 0.8: BCCD has such doubles) is left out: a
    detection then has two equal IoUs, which rounding breaks one way in pixels and another in
    the file's fractions (docs/formats.md)."""
    rng = np.random.default_rng(seed)
    names = [*index.classes, "Blood cell"]
    mids = [f"/m/b{k}" for k in range(len(names))]
    parents = {mids[0]: [mids[-1]], mids[1]: [mids[-1]]}
    sizes, box_rows, label_rows, pred_rows = {}, [], [], []
    scores = iter(rng.permutation(np.arange(1, 100000)) / 100000.0)
    offsets = index.object_offsets
    for i in range(len(index)):
        image, w, h = f"img{i:03d}", int(index.width[i]), int(index.height[i])
        sizes[image] = (w, h)
        held, kept = set(), []
        for j in range(int(offsets[i]), int(offsets[i + 1])):
            x1, y1, x2, y2 = (float(v) for v in index.boxes[j])
            mid = mids[int(index.labels[j])]
            if any(m == mid and _iou(np.array([[x1, y1, x2, y2]]), np.array([b]))[0][0, 0] >= 0.8 for m, b in kept):
                continue
            kept.append((mid, [x1, y1, x2, y2]))
            held.add(mid)
            box = np.round([x1 / w, x2 / w, y1 / h, y2 / h], 4)
            box_rows.append((image, "xclick", mid, 1, *box.tolist(), 0, 0, int(rng.random() < 0.1), 0, 0))
            if rng.random() < 0.8:
                b = np.clip(box + rng.normal(0, 0.01, 4), 0, 1).round(4)
                if b[0] < b[1] and b[2] < b[3]:
                    named = mids[-1] if mid in parents and rng.random() < 0.1 else mid
                    pred_rows.append((image, named, round(float(next(scores)), 5), *b.tolist()))
        label_rows += [(image, "verification", m, 1) for m in sorted(held)]
        label_rows += [(image, "verification", m, 0) for m in mids[:-1] if m not in held and rng.random() < 0.5]
        for _ in range(int(rng.integers(0, 4))):
            x0, y0 = rng.uniform(0, 0.8, 2).round(4)
            pred_rows.append((image, mids[int(rng.integers(0, len(mids)))], round(float(next(scores)), 5),
                              x0, round(x0 + 0.15, 4), y0, round(y0 + 0.15, 4)))
    return {"mids": mids, "names": names, "parents": parents, "sizes": sizes, "boxes": box_rows,
            "labels": label_rows, "predictions": pred_rows}


@needs_reference
@pytest.mark.dataset
@pytest.mark.slow
def test_equals_the_reference_on_a_real_dataset_made_open_images_shaped(bccd_root, tmp_path):
    """BCCD (364 images, 4,888 boxes) as Open Images files: per-class AP and the mean."""
    from detloader import read_annotations

    case = case_from_index(read_annotations(bccd_root, on_error="skip", cache=False), seed=0)
    mean, per_mid = reference(write_oi_case(tmp_path, case), expand=True)
    got = ours(case, expand=True)
    name = dict(zip(case["mids"], case["names"]))
    assert {name[m]: v for m, v in per_mid.items()} == pytest.approx(
        {n: row["ap50"] for n, row in got["per_class"].items()}, abs=1e-6)
    assert got["map50"] == pytest.approx(mean, abs=1e-6) and 0.2 < mean < 1
