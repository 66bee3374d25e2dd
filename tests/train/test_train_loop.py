"""The training loop on tiny synthetic data: outputs, switched-off heads, exact resume."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

import detloader
from detloader.synth import make_synthetic
from detloader.train import TrainConfig, load_checkpoint, train
from detloader.train.checkpoint import CHECKPOINT_KEYS

pytest.importorskip("faster_coco_eval")


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """40 images of 96 x 72: 32 train, 8 val."""
    return make_synthetic(tmp_path_factory.mktemp("train") / "faces", 40, seed=1, size=(96, 72))


def _config(data: Path, out: Path, **changes) -> TrainConfig:
    base = dict(
        data=str(data), out=str(out), size=64, batch_size=4, epochs=2, width=4, num_workers=0,
        warmup_steps=2, read_options={"cache": False},
    )
    base.update(changes)
    return TrainConfig(**base)


def test_outputs(tiny: Path, tmp_path: Path):
    epochs = []
    metrics = train(_config(tiny, tmp_path / "run", epochs=1), on_epoch=epochs.append)
    required = {"map50", "map50_95", "nme", "nme_normaliser", "image_class_accuracy", "per_class", "data_wait_fraction"}
    assert required <= set(metrics)
    assert set(metrics["per_class"]) == {"face", "masked", "sunglasses"}
    assert {"precision", "recall", "ap50"} <= set(metrics["per_class"]["face"])
    assert metrics["nme_normaliser"] == "inter_ocular"
    assert 0.0 <= metrics["data_wait_fraction"] <= 1.0
    assert metrics["samples_per_rank"] == [32] and metrics["steps"] == 8
    saved = json.loads((tmp_path / "run" / "metrics.json").read_text())
    assert saved["map50"] == metrics["map50"]
    assert TrainConfig.from_dict(json.loads((tmp_path / "run" / "config.json").read_text())).size == 64
    state = load_checkpoint(tmp_path / "run" / "last.pt")
    assert set(CHECKPOINT_KEYS) <= set(state)
    assert state["classes"] == ["face", "masked", "sunglasses"] and state["image_classes"]
    assert state["epoch"] == 1 and state["history"][0]["data_wait_fraction"] == epochs[0].data_wait_fraction


def _boxes_only_coco(tiny: Path, out: Path) -> Path:
    """The tiny dataset as COCO instances without keypoints or image classes."""
    index = detloader.read_annotations(tiny, cache=False)
    images, anns = [], []
    for i in range(len(index)):
        v = index.image(i)
        images.append({"id": i, "file_name": v.path.name, "width": v.width, "height": v.height})
        for box, label in zip(v.boxes.tolist(), v.labels.tolist()):
            x1, y1, x2, y2 = box
            anns.append({"id": len(anns), "image_id": i, "category_id": label, "bbox": [x1, y1, x2 - x1, y2 - y1]})
    cats = [{"id": c, "name": n} for c, n in enumerate(index.classes)]
    out.mkdir()
    (out / "images").symlink_to(tiny / "JPEGImages")
    path = out / "instances.json"
    path.write_text(json.dumps({"images": images, "annotations": anns, "categories": cats}))
    return path


def test_heads_switch_off_without_landmarks_or_image_classes(tiny: Path, tmp_path: Path):
    data = _boxes_only_coco(tiny, tmp_path / "coco")
    metrics = train(_config(data, tmp_path / "run", epochs=1, balance="sqrt"))
    state = load_checkpoint(tmp_path / "run" / "last.pt")
    assert state["model_config"]["num_landmarks"] == 0 and state["model_config"]["num_image_classes"] == 0
    assert metrics["nme"] is None and metrics["image_class_accuracy"] is None
    assert metrics["epochs"][0]["losses"].keys() == {"heatmap", "size", "offset", "giou", "total"}


def test_bad_config_values_are_named():
    with pytest.raises(ValueError, match=r"balance='median'.*'sqrt'"):
        TrainConfig(balance="median")
    with pytest.raises(ValueError, match="size=100"):
        TrainConfig(size=100)
    with pytest.raises(ValueError, match="device='tpu'"):
        TrainConfig(device="tpu")
    with pytest.raises(ValueError, match="unknown keys"):
        TrainConfig.from_dict({"epoch": 3})


@pytest.mark.slow
@pytest.mark.parametrize("workers", [0, 2])
def test_killed_and_resumed_run_sees_exactly_the_uninterrupted_samples(tiny: Path, tmp_path: Path, workers: int):
    def recorder(seen: list):
        return lambda info: seen.append((info.epoch, tuple(info.image_ids)))

    full: list = []
    config = _config(tiny, tmp_path / "full", balance="inverse", num_workers=workers, evaluate=False)
    train(config, on_step=recorder(full))
    first: list = []
    # "killed" after 5 of 16 steps (mid-epoch 0), with workers prefetching ahead
    train(config.replace(out=str(tmp_path / "cut"), max_steps=5), on_step=recorder(first))
    rest: list = []
    train(config.replace(out=str(tmp_path / "cut"), resume=str(tmp_path / "cut" / "last.pt")), on_step=recorder(rest))
    assert len(first) == 5 and len(full) == 16
    assert first + rest == full
    a = load_checkpoint(tmp_path / "full" / "last.pt")["model"]
    b = load_checkpoint(tmp_path / "cut" / "last.pt")["model"]
    for name in a:
        torch.testing.assert_close(a[name], b[name], rtol=1e-4, atol=1e-5, msg=name)


@pytest.mark.slow
def test_mosaic_and_affine_in_the_trainer_resume_exactly(tiny: Path, tmp_path: Path):
    """Mosaic (partners from the balanced stream, off in the last epoch) and affine: a run
    stopped mid-epoch and resumed sees exactly the uninterrupted run's samples and weights."""

    def recorder(seen: list):
        return lambda info: seen.append((info.epoch, tuple(info.image_ids)))

    config = _config(tiny, tmp_path / "full", balance="sqrt", mosaic=1.0, close_mosaic=1, affine=True, evaluate=False)
    full: list = []
    metrics = train(config, on_step=recorder(full))
    assert metrics["config"]["mosaic"] == 1.0 and len(full) == 16
    first: list = []
    train(config.replace(out=str(tmp_path / "cut"), max_steps=5), on_step=recorder(first))
    rest: list = []
    train(config.replace(out=str(tmp_path / "cut"), resume=str(tmp_path / "cut" / "last.pt")), on_step=recorder(rest))
    assert first + rest == full
    a = load_checkpoint(tmp_path / "full" / "last.pt")["model"]
    b = load_checkpoint(tmp_path / "cut" / "last.pt")["model"]
    for name in a:
        torch.testing.assert_close(a[name], b[name], rtol=1e-4, atol=1e-5, msg=name)
    with pytest.raises(ValueError, match="mosaic=2"):
        TrainConfig(mosaic=2)
