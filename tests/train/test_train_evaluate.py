"""Metrics: COCO mAP through faster-coco-eval and pycocotools (checked one against the
other), per-class figures, NME with its named normaliser, image-class accuracy."""

from __future__ import annotations

import numpy as np
import pytest

import detloader
from detloader.synth import make_synthetic
from detloader.train import ImagePredictions, compute_metrics
from detloader.train.metrics import landmark_normaliser

pytest.importorskip("faster_coco_eval")
pytest.importorskip("pycocotools")


@pytest.fixture(scope="module")
def index(tmp_path_factory: pytest.TempPathFactory):
    root = make_synthetic(tmp_path_factory.mktemp("eval") / "faces", 40, seed=5, size=(96, 72))
    return detloader.read_annotations(root, cache=False)


def _predictions(index, noise: float, seed: int = 0, extra: int = 2) -> list[ImagePredictions]:
    """Ground truth moved by ``noise`` pixels, plus ``extra`` random false positives per image."""
    rng = np.random.default_rng(seed)
    out = []
    k = len(index.landmark_schema)
    for i in range(len(index)):
        v = index.image(i)
        boxes = v.boxes + rng.normal(0, noise, v.boxes.shape).astype(np.float32)
        fp = rng.uniform(0, 60, (extra, 2)).astype(np.float32)
        boxes = np.concatenate([boxes, np.concatenate([fp, fp + 15], axis=1)])
        labels = np.concatenate([v.labels, rng.integers(0, len(index.classes), extra)]).astype(np.int64)
        scores = np.concatenate([rng.uniform(0.5, 1.0, len(v.boxes)), rng.uniform(0.0, 0.6, extra)]).astype(np.float32)
        lms = np.concatenate([v.landmarks + rng.normal(0, noise, v.landmarks.shape), np.zeros((extra, k, 2))]).astype(
            np.float32
        )
        probs = np.eye(len(index.image_classes), dtype=np.float32)[max(v.image_label, 0)]
        out.append(ImagePredictions(i, boxes, scores, labels, lms, probs))
    return out


def test_backends_agree(index):
    preds = _predictions(index, noise=2.0)
    a = compute_metrics(index, preds, backend="faster_coco_eval")
    b = compute_metrics(index, preds, backend="pycocotools")
    assert a["backend"] == "faster_coco_eval" and b["backend"] == "pycocotools"
    assert a["map50"] == pytest.approx(b["map50"], abs=1e-9)
    assert a["map50_95"] == pytest.approx(b["map50_95"], abs=1e-9)
    assert 0.3 < a["map50_95"] < a["map50"] <= 1.0
    for name in index.classes:
        for key in ("ap50", "ap50_95", "precision", "recall"):
            assert a["per_class"][name][key] == pytest.approx(b["per_class"][name][key], abs=1e-9), (name, key)


def test_perfect_predictions(index):
    m = compute_metrics(index, _predictions(index, noise=0.0, extra=0))
    assert m["map50"] == pytest.approx(1.0) and m["map50_95"] == pytest.approx(1.0)
    assert m["nme"] == pytest.approx(0.0, abs=1e-6) and m["nme_normaliser"] == "inter_ocular"
    assert m["nme_objects"] > 0
    assert m["image_class_accuracy"] == 1.0
    for row in m["per_class"].values():
        if row["objects"]:
            assert row["precision"] == 1.0 and row["recall"] == 1.0 and row["ap50"] == pytest.approx(1.0)
    required = {"map50", "map50_95", "nme", "nme_normaliser", "image_class_accuracy", "per_class"}
    assert required <= set(m)


def test_no_detections_on_half_the_images(index):
    empty = [
        ImagePredictions(i, np.zeros((0, 4), np.float32), np.zeros(0, np.float32), np.zeros(0, np.int64),
                         np.zeros((0, 5, 2), np.float32), np.zeros(0, np.float32))
        for i in range(0, len(index), 2)
    ]
    m = compute_metrics(index, empty)
    assert m["map50"] == 0.0 and m["nme"] is None and m["images"] == len(index)
    assert m["images_with_predictions"] == len(empty) and m["tp"] == 0 and m["fn"] == index.num_objects
    assert m["image_class_accuracy"] is None
    with pytest.raises(ValueError, match="appears twice"):
        compute_metrics(index, empty + empty[:1])
    with pytest.raises(ValueError, match="backend='coco'"):
        compute_metrics(index, empty, backend="coco")  # type: ignore[arg-type]


def test_normaliser_is_named():
    assert landmark_normaliser(detloader.FACE5.names) == ("inter_ocular", (0, 1))
    assert landmark_normaliser(["LeftEye", "RightEye", "nose"])[0] == "inter_ocular"
    assert landmark_normaliser([str(i) for i in range(68)]) == ("box_diagonal", None)
    assert landmark_normaliser(["left_eye_inner", "left_eye_outer", "right_eye"])[0] == "box_diagonal"
