"""The loop's model protocol (Task): a second model of another shape (two heads, no landmarks,
a tuple of outputs) trained, checkpointed, resumed exactly and evaluated; any predictions
scored."""

from __future__ import annotations

import json
import os
import pickle
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from helpers import free_port
from torch import nn

import detloader
from detloader.errors import PredictionError
from detloader.synth import make_synthetic
from detloader.train import (
    ImagePredictions,
    Task,
    TrainConfig,
    compute_metrics,
    evaluate_checkpoint,
    load_checkpoint,
    score_predictions,
    train,
)

pytest.importorskip("faster_coco_eval")


class OneBox(nn.Module):
    """Two heads on pooled features: one box per image (cx, cy, w, h in 0..1 of the input,
    then class logits) and the image class."""

    def __init__(self, num_classes: int, num_image_classes: int) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Conv2d(3, 8, 3, 2, 1), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten())
        self.box = nn.Linear(8, 4 + num_classes)
        self.image = nn.Linear(8, num_image_classes)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        f = self.body(x)
        return self.box(f), self.image(f)


def one_box_loss(outputs, batch) -> dict[str, torch.Tensor]:
    box, image_logits = outputs
    targets = batch.targets(format="detr")  # the first object of each image is the goal
    rows = [i for i, t in enumerate(targets) if len(t["boxes"])]
    goal = torch.stack([targets[i]["boxes"][0] for i in rows])
    label = torch.stack([targets[i]["class_labels"][0] for i in rows])
    return {
        "box": F.l1_loss(box[rows, :4].sigmoid(), goal),
        "class": F.cross_entropy(box[rows, 4:], label),
        "image_class": F.cross_entropy(image_logits, batch.image_labels, ignore_index=detloader.MISSING),
    }


def one_box_decode(outputs, batch) -> list[dict[str, torch.Tensor]]:
    box, image_logits = outputs
    h, w = batch.images.shape[-2:]
    cx, cy, bw, bh = (box[:, :4].sigmoid() * torch.tensor([w, h, w, h], device=box.device)).unbind(1)
    xyxy = torch.stack([cx - bw / 2, cy - bh / 2, cx + bw / 2, cy + bh / 2], dim=1)
    xyxy = batch.boxes_to_original(xyxy, torch.arange(len(batch), device=box.device))
    probs = box[:, 4:].softmax(dim=1)
    return [
        {"boxes": xyxy[b : b + 1], "scores": probs[b].max().view(1), "labels": probs[b].argmax().view(1),
         "image_probs": image_logits[b].softmax(dim=0)}
        for b in range(len(batch))
    ]


def one_box_task(index) -> Task:
    return Task(OneBox(len(index.classes), len(index.image_classes)), one_box_loss, one_box_decode, {"box": 5.0})


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """40 images of 96 x 72: 32 train, 8 val."""
    return make_synthetic(tmp_path_factory.mktemp("protocol") / "faces", 40, seed=1, size=(96, 72))


def _config(data: Path, out: Path, **changes) -> TrainConfig:
    base = dict(data=str(data), out=str(out), size=64, batch_size=4, epochs=2, num_workers=0, warmup_steps=2,
                read_options={"cache": False})
    return TrainConfig(**{**base, **changes})


@pytest.mark.slow
def test_own_model_killed_and_resumed_sees_exactly_the_uninterrupted_samples(tiny: Path, tmp_path: Path):
    def recorder(seen: list):
        return lambda info: seen.append((info.epoch, tuple(info.image_ids), info.losses["total"]))

    full: list = []
    config = _config(tiny, tmp_path / "full", balance="inverse", evaluate=False)
    train(config, task=one_box_task, on_step=recorder(full))
    first: list = []
    train(config.replace(out=str(tmp_path / "cut"), max_steps=5), task=one_box_task, on_step=recorder(first))
    rest: list = []
    resumed = config.replace(out=str(tmp_path / "cut"), resume=str(tmp_path / "cut" / "last.pt"))
    train(resumed, task=one_box_task, on_step=recorder(rest))
    assert len(first) == 5 and len(full) == 16
    assert [s[:2] for s in first + rest] == [s[:2] for s in full]
    a = load_checkpoint(tmp_path / "full" / "last.pt")["model"]
    b = load_checkpoint(tmp_path / "cut" / "last.pt")["model"]
    assert set(a) == {"body.0.weight", "body.0.bias", "box.weight", "box.bias", "image.weight", "image.bias"}
    for name in a:
        torch.testing.assert_close(a[name], b[name], rtol=1e-4, atol=1e-5, msg=name)


def test_own_model_trained_checkpointed_and_evaluated(tiny: Path, tmp_path: Path):
    epochs = []
    metrics = train(_config(tiny, tmp_path / "run", epochs=1), task=one_box_task, on_epoch=epochs.append)
    assert set(epochs[0].losses) == {"box", "class", "image_class", "total"}
    weighted = 5 * epochs[0].losses["box"] + epochs[0].losses["class"] + epochs[0].losses["image_class"]
    assert epochs[0].losses["total"] == pytest.approx(weighted, rel=1e-5)
    assert {"map50", "map50_95", "per_class", "image_class_accuracy"} <= set(metrics) and metrics["nme"] is None
    assert metrics["images"] == 8 and metrics["image_class_accuracy"] is not None
    state = load_checkpoint(tmp_path / "run" / "last.pt")
    assert state["task"] == f"{__name__}.OneBox" and state["model_config"] == {} and "data" in state
    again = evaluate_checkpoint(tmp_path / "run" / "last.pt", tiny, task=one_box_task, read_options={"cache": False},
                                coco_json=tmp_path / "dets.json")
    assert again["map50"] == pytest.approx(metrics["map50"]) and again["split"]["images"] == 8
    assert len(json.loads((tmp_path / "dets.json").read_text())) == 8  # one box per image
    with pytest.raises(ValueError, match=r"holds a .*OneBox, not the reference model: pass its Task"):
        evaluate_checkpoint(tmp_path / "run" / "last.pt", tiny, read_options={"cache": False})
    with pytest.raises(
        ValueError, match=r"the checkpoint holds a .*OneBox, this run trains a detloader.train.model.CenterNet"
    ):
        train(_config(tiny, tmp_path / "run", epochs=2, resume=str(tmp_path / "run" / "last.pt")))


def _ddp_worker(rank: int, data: str, out: str, port: int) -> None:
    os.environ.update(  # what torchrun sets for each process
        MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE="2",
        LOCAL_WORLD_SIZE="2",
    )
    seen: list[int] = []
    config = _config(Path(data), Path(out), epochs=1, device="cpu", read_options={"cache": False, "workers": 1})
    metrics = train(config, task=one_box_task, on_step=lambda info: seen.extend(info.image_ids))
    Path(out, f"rank{rank}.pkl").write_bytes(pickle.dumps({"metrics": metrics, "seen": seen}))


@pytest.mark.slow
@pytest.mark.distributed
@pytest.mark.timeout(180)
def test_own_model_under_ddp(tiny: Path, tmp_path: Path):
    import torch.multiprocessing as mp

    mp.spawn(_ddp_worker, args=(str(tiny), str(tmp_path / "run"), free_port()), nprocs=2, join=True)
    ranks = [pickle.loads((tmp_path / "run" / f"rank{r}.pkl").read_bytes()) for r in range(2)]
    assert ranks[0]["metrics"] == ranks[1]["metrics"] and ranks[0]["metrics"]["samples_per_rank"] == [16, 16]
    a, b = (set(r["seen"]) for r in ranks)
    assert len(a | b) == 32 and not a & b
    assert ranks[0]["metrics"]["images"] == 8 and load_checkpoint(tmp_path / "run" / "last.pt")["task"].endswith(
        "OneBox"
    )


def test_total_is_the_weighted_sum_or_the_given_total():
    task = Task(nn.Linear(1, 1), one_box_loss, one_box_decode, {"a": 2.0})
    terms = {"a": torch.tensor(1.0), "b": torch.tensor(3.0)}
    assert float(task.total(terms)) == 5.0
    assert float(task.total({**terms, "total": torch.tensor(7.0)})) == 7.0
    assert task.name == "torch.nn.modules.linear.Linear"
    with pytest.raises(TypeError, match="loss returned Tensor"):
        task.total(torch.tensor(1.0))  # type: ignore[arg-type]


def test_any_predictions_scored_as_dicts_of_tensors(tiny: Path, tmp_path: Path):
    val = detloader.read_annotations(tiny, cache=False).split("val")
    rng = np.random.default_rng(0)
    preds = []
    for i in range(len(val)):
        v = val.image(i)
        boxes = v.boxes + rng.normal(0, 1.5, v.boxes.shape).astype(np.float32)
        probs = np.eye(len(val.image_classes), dtype=np.float32)[max(v.image_label, 0)]
        preds.append(ImagePredictions(i, boxes, np.linspace(0.9, 0.5, len(boxes), dtype=np.float32), v.labels,
                                      v.landmarks + 1, probs))
    expected = compute_metrics(val, preds)
    as_dicts = [{"image_id": p.image_id, "boxes": torch.from_numpy(p.boxes), "scores": p.scores.tolist(),
                 "labels": torch.from_numpy(p.labels), "landmarks": torch.from_numpy(p.landmarks),
                 "image_probs": torch.from_numpy(p.image_probs).to(torch.bfloat16)} for p in preds]
    got = score_predictions(as_dicts, val, coco_json=tmp_path / "results.json")
    assert got == expected and 0.5 < got["map50"] <= 1.0 and got["nme"] > 0
    by_id = score_predictions({d.pop("image_id"): d for d in as_dicts[:4]}, val)
    assert by_id["images"] == len(val) and by_id["images_with_predictions"] == 4
    results = json.loads((tmp_path / "results.json").read_text())
    assert len(results) == sum(len(p.boxes) for p in preds)
    first = results[0]
    assert first["image_id"] == int(val.image_ids[0]) and first["category_id"] == int(preds[0].labels[0]) + 1
    assert first["bbox"][2] == pytest.approx(float(preds[0].boxes[0, 2] - preds[0].boxes[0, 0]), rel=1e-5)
    assert len(first["keypoints"]) == 3 * len(val.landmark_schema)
    with pytest.raises(ValueError, match=r"image_id=0: boxes \(2, 5\)"):
        score_predictions([{"image_id": 0, "boxes": np.zeros((2, 5)), "scores": [1, 1], "labels": [0, 0]}], val)
    with pytest.raises(PredictionError, match="image_id=99 is not a row of the index"):
        score_predictions([{"image_id": 99, "boxes": [], "scores": [], "labels": []}], val)
    with pytest.raises(ValueError, match="dict with boxes, scores, labels; got"):
        score_predictions([{"image_id": 0, "boxes": []}], val)
