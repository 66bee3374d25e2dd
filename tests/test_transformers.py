"""detloader.transformers with transformers' ``Trainer``: a tiny DETR built from its config with
random weights (no download), 2 epochs on a synthetic fixture; the balanced draw per epoch, the
resume, ``coco_metrics`` against ``score_predictions``, the model's classes, 2 processes under
torchrun and the README's block. They skip where transformers is not installed."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

pytestmark = pytest.mark.skipif(importlib.util.find_spec("transformers") is None,
                                reason="needs transformers (pip install 'detloader[transformers]')")

os.environ["HF_HUB_OFFLINE"] = "1"  # nothing is downloaded: the models are built from configs

README = Path(__file__).resolve().parents[1] / "README.md"
SRC = Path(__file__).resolve().parents[1] / "src"
BATCH = 4
EPOCHS = 2

# The fixture, the tiny model and the recording trainer, as source: the 2-process test runs the
# same code in each process.
COMMON = '''
import os
os.environ["HF_HUB_OFFLINE"] = "1"
from transformers import DetrConfig, DetrForObjectDetection, DetrImageProcessorPil, ResNetConfig, TrainingArguments

from detloader import read_annotations
from detloader.synth import make_synthetic
from detloader.transformers import balanced_trainer, detection_dataset, id2label, label2id


def fixture(root):
    """26 train images (48 x 36), 2 of them holding the rare class 'masked'; 6 val images."""
    if not os.path.isdir(root):
        make_synthetic(root, 32, seed=2, size=(48, 36), classes=("face", "masked"), class_frequencies=(0.93, 0.07))
    return read_annotations(root)


def processor():
    return DetrImageProcessorPil(size={"shortest_edge": 32, "longest_edge": 48})


def tiny_detr(dataset, num_labels=None):
    backbone = ResNetConfig(embedding_size=8, hidden_sizes=[8, 8, 8, 8], depths=[1, 1, 1, 1], out_features=["stage4"])
    names = id2label(dataset)
    config = DetrConfig(use_timm_backbone=False, use_pretrained_backbone=False, backbone_config=backbone,
                        d_model=16, encoder_layers=1, decoder_layers=1, encoder_attention_heads=2,
                        decoder_attention_heads=2, encoder_ffn_dim=16, decoder_ffn_dim=16, num_queries=20,
                        num_labels=len(names) if num_labels is None else num_labels,
                        **({} if num_labels is not None else {"id2label": names, "label2id": label2id(dataset)}))
    return DetrForObjectDetection(config)


def arguments(out, **overrides):
    values = dict(output_dir=str(out), num_train_epochs=2, per_device_train_batch_size=4, per_device_eval_batch_size=4,
                  use_cpu=True, report_to=[], eval_do_concat_batches=False, remove_unused_columns=False,
                  save_strategy="no", logging_strategy="no", disable_tqdm=True, seed=0)
    values.update(overrides)
    return TrainingArguments(**values)


def direct_metrics(model, val, processor, batch=4):
    """score_predictions of the model's predictions on val, run here one batch at a time (all
    images have one size: no padding) and put back in the annotation's pixels by hand."""
    import torch
    from transformers.utils import ModelOutput
    from detloader.train import score_predictions
    from detloader.transformers import flat_metrics

    model = model.eval()
    predictions = []
    with torch.no_grad():
        for lo in range(0, len(val), batch):
            items = val.collate([val[i] for i in range(lo, min(lo + batch, len(val)))])
            out = model(pixel_values=items["pixel_values"], pixel_mask=items["pixel_mask"])
            rows = [int(t["image_id"][0]) for t in items["labels"]]
            sizes = torch.tensor([[int(val.index.height[r]), int(val.index.width[r])] for r in rows])
            found = processor.post_process_object_detection(
                ModelOutput(logits=out.logits, pred_boxes=out.pred_boxes), threshold=0.0, target_sizes=sizes)
            predictions += [{"image_id": r, **f} for r, f in zip(rows, found)]
    return flat_metrics(score_predictions(predictions, val.index))


def recording(balance):
    """A balanced trainer that records, per training batch, the index rows it holds."""
    class Recording(balanced_trainer(balance)):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self.seen = []

        def training_step(self, model, inputs, *args, **kwargs):
            self.seen.append([int(t["image_id"][0]) for t in inputs["labels"]])
            return super().training_step(model, inputs, *args, **kwargs)

    return Recording
'''

namespace: dict = {}
if importlib.util.find_spec("transformers") is not None:
    exec(compile(COMMON, "test_transformers_common", "exec"), namespace)  # noqa: S102


def rare_rows(index) -> set[int]:
    labels, offsets = np.asarray(index.labels), np.asarray(index.object_offsets)
    rare = index.classes.index("masked")
    return {i for i in range(len(index)) if rare in labels[offsets[i]:offsets[i + 1]]}


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    index = namespace["fixture"](str(tmp_path_factory.mktemp("hf") / "synth"))
    processor = namespace["processor"]()
    from detloader.transformers import detection_dataset

    return index, processor, detection_dataset(index.split("train"), processor), detection_dataset(
        index.split("val"), processor)


@pytest.fixture(scope="module")
def run(data, tmp_path_factory):
    """2 epochs with balance="inverse", a checkpoint after step 10 (epoch 1, batch 3 of 7)."""
    from detloader.transformers import coco_metrics

    _, processor, train, val = data
    out = tmp_path_factory.mktemp("run")
    trainer = namespace["recording"]("inverse")(
        model=namespace["tiny_detr"](train), args=namespace["arguments"](out, save_strategy="steps", save_steps=10),
        train_dataset=train, eval_dataset=val, compute_metrics=coco_metrics(val, processor))
    trainer.train()
    return trainer, out


def global_draw(index, balance: str, epoch: int) -> list[int]:
    from detloader.balance.weighted import make_balanced_sampler

    sampler = make_balanced_sampler(index, balance, seed=0, rank=0, world_size=1)
    sampler.set_epoch(epoch)
    return sampler.indices().tolist()


def test_each_epoch_is_the_balanced_draw_with_3x_the_rare_share(data, run):
    _, _, train, _ = data
    trainer, _ = run
    steps = -(-len(train) // BATCH)
    assert len(trainer.seen) == EPOCHS * steps
    rare = rare_rows(train.index)
    raw = len(rare) / len(train)
    assert 0 < raw < 0.1
    epochs = [sum(trainer.seen[e * steps:(e + 1) * steps], []) for e in range(EPOCHS)]
    for e, rows in enumerate(epochs):
        assert rows == global_draw(train.index, "inverse", e)  # the sampler's draw of that epoch, in order
        share = sum(r in rare for r in rows) / len(rows)
        assert share >= 3 * raw, (share, raw)
    assert epochs[0] != epochs[1]


def test_resume_from_a_checkpoint_continues_the_draw_exactly(data, run, tmp_path):
    _, _, train, _ = data
    trainer, out = run
    checkpoint = out / "checkpoint-10"
    assert (checkpoint / "trainer_state.json").is_file()
    resumed = namespace["recording"]("inverse")(
        model=namespace["tiny_detr"](train), args=namespace["arguments"](tmp_path), train_dataset=train)
    resumed.train(resume_from_checkpoint=str(checkpoint))
    assert resumed.seen == trainer.seen[10:]


@pytest.mark.parametrize("concat", [False, True])
def test_evaluate_equals_score_predictions_on_the_same_predictions(data, run, concat):
    """BalancedTrainer hands the metrics one label tensor a batch, so batches may be concatenated."""
    _, processor, _, val = data
    trainer, _ = run
    trainer.args.eval_do_concat_batches = concat
    try:
        metrics = trainer.evaluate()
    finally:
        trainer.args.eval_do_concat_batches = False
    expected = namespace["direct_metrics"](trainer.model, val, processor)
    assert expected["images"] == len(val) and expected["fp"] + expected["tp"] > 0
    for key, value in expected.items():
        assert metrics[f"eval_{key}"] == pytest.approx(value, abs=1e-6), key


def test_coco_metrics_maps_padded_resized_shifted_boxes_back(data):
    """Perfect predictions (the labels' own boxes) of images of different sizes, padded in one
    batch, shifted and resized: mAP 1 only if every box comes back to its annotation."""
    import torch
    from transformers import EvalPrediction

    from detloader.dataset import DetectionDataset
    from detloader.transformers import coco_metrics, detection_dataset

    index, processor, _, _ = data
    val_index = index.split("val")

    def pad(sample, rng):  # a larger canvas, the image at a random offset: every object kept
        grow_w, grow_h = int(rng.integers(4, 30)), int(rng.integers(0, 12))
        sample.crop(-int(rng.integers(0, grow_w + 1)), -int(rng.integers(0, grow_h + 1)),
                    sample.width + grow_w, sample.height + grow_h, 0.25, 0)
        return sample

    val = detection_dataset(DetectionDataset(val_index, pad, seed=1), processor)
    batch = val.collate([val[i] for i in range(len(val))])
    assert len({tuple(val[i]["pixel_values"].shape) for i in range(len(val))}) > 1  # padding happened
    queries, classes = 10, len(index.classes)
    logits = torch.full((len(val), queries, classes + 1), -10.0)
    logits[:, :, classes] = 10.0  # "no object"
    boxes = torch.zeros((len(val), queries, 4))
    for k, t in enumerate(batch["labels"]):
        n = len(t["boxes"])
        boxes[k, :n] = t["boxes"]
        logits[k, torch.arange(n), t["class_labels"]] = 10.0
        logits[k, torch.arange(n), classes] = -10.0
    metrics = coco_metrics(val, processor)(EvalPrediction(predictions=[(logits.numpy(), boxes.numpy())],
                                                          label_ids=[batch["labels"]]))
    assert metrics["map50_95"] == pytest.approx(1.0) and metrics["fp"] == 0 and metrics["fn"] == 0


def test_coco_metrics_asks_for_batches_that_are_not_concatenated(data):
    from transformers import EvalPrediction

    from detloader.errors import DetloaderValueError
    from detloader.transformers import coco_metrics

    _, processor, _, val = data
    with pytest.raises(DetloaderValueError, match="eval_do_concat_batches=False"):
        coco_metrics(val, processor)(EvalPrediction(predictions=np.zeros((2, 3, 4)), label_ids=np.zeros(2)))


def test_a_model_with_other_classes_is_refused_by_name(data, tmp_path):
    from detloader.errors import ModelLabelsError
    from detloader.transformers import BalancedTrainer, id2label, label2id

    _, _, train, _ = data
    assert id2label(train) == {0: "face", 1: "masked"} and label2id(train) == {"face": 0, "masked": 1}
    with pytest.raises(ModelLabelsError, match=r"num_labels=5, the dataset has 2 classes \['face', 'masked'\]"):
        BalancedTrainer(model=namespace["tiny_detr"](train, num_labels=5), args=namespace["arguments"](tmp_path),
                        train_dataset=train)
    model = namespace["tiny_detr"](train)
    model.config.id2label = {0: "masked", 1: "face"}
    with pytest.raises(ModelLabelsError, match="id2label names"):
        BalancedTrainer(model=model, args=namespace["arguments"](tmp_path), train_dataset=train)


def test_balanced_trainer_checks_its_arguments_and_the_dataset(data, tmp_path):
    from detloader.errors import DetloaderTypeError, DetloaderValueError
    from detloader.transformers import balanced_trainer

    with pytest.raises(DetloaderValueError, match="balance"):
        balanced_trainer("inverted")
    with pytest.raises(DetloaderValueError, match="seed"):
        balanced_trainer(seed=-1)
    _, _, train, _ = data
    trainer = balanced_trainer()(model=namespace["tiny_detr"](train), args=namespace["arguments"](tmp_path),
                                 train_dataset=train.dataset, data_collator=train.collate)
    with pytest.raises(DetloaderTypeError, match=r"detection_dataset\(index_or_dataset, image_processor\)"):
        trainer.get_train_dataloader()


WORKER = '''
import json, sys
import torch.distributed as dist
from detloader.transformers import coco_metrics
root, out = sys.argv[1], sys.argv[2]
train = detection_dataset(fixture(root).split("train"), processor())
val = detection_dataset(fixture(root).split("val"), processor())
trainer = recording("inverse")(model=tiny_detr(train), args=arguments(out, per_device_train_batch_size=1,
                               ddp_backend="gloo"), train_dataset=train, eval_dataset=val,
                               compute_metrics=coco_metrics(val, processor()))
trainer.train()
metrics = trainer.evaluate()  # 6 images over 2 processes, 4 a batch: the last batch padded by Accelerate
expected = direct_metrics(trainer.model, val, processor())
with open(f"{out}/seen{dist.get_rank()}.json", "w") as f:
    json.dump({"world": dist.get_world_size(), "seen": trainer.seen, "metrics": metrics, "expected": expected}, f)
# the DDP model (its reducer) goes before the process group, and the group before the interpreter:
# gloo torn down at exit under a live reducer can abort a rank ('terminate called without an active exception')
import gc
del trainer
gc.collect()
dist.barrier()
dist.destroy_process_group()
'''


@pytest.mark.slow
@pytest.mark.distributed
def test_two_processes_share_out_the_one_global_draw(tmp_path):
    """torchrun, 2 CPU processes (gloo), one image a batch: process p trains on positions p,
    p + 2, ... of each epoch's one draw, so together they see the draw once; ``trainer.evaluate()``
    with ``coco_metrics`` scores every validation image once, equal to one process's scoring."""
    from helpers import free_port

    script = tmp_path / "worker.py"
    script.write_text(COMMON + WORKER, encoding="utf-8")
    namespace["fixture"](str(tmp_path / "synth"))  # made once here: two ranks making it at once would race
    env = {**os.environ, "PYTHONPATH": f"{SRC}{os.pathsep}{os.environ.get('PYTHONPATH', '')}", "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port", str(free_port()),
         str(script), str(tmp_path / "synth"), str(tmp_path)],
        env=env, capture_output=True, text=True, timeout=280)
    assert proc.returncode == 0, proc.stderr[-4000:]
    runs = [json.loads((tmp_path / f"seen{r}.json").read_text()) for r in range(2)]
    assert [r["world"] for r in runs] == [2, 2]
    train = namespace["fixture"](str(tmp_path / "synth")).split("train")
    steps = len(train) // 2  # 26 images: 13 batches of one image per process and epoch
    for e in range(EPOCHS):
        draw = global_draw(train, "inverse", e)
        parts = [sum(r["seen"][e * steps:(e + 1) * steps], []) for r in runs]
        assert parts[0] == draw[0::2] and parts[1] == draw[1::2]
        assert sorted(parts[0] + parts[1]) == sorted(draw)
    for r in runs:  # each process scores every image once, as one process does
        assert r["expected"]["images"] == 6
        for key, value in r["expected"].items():
            assert r["metrics"][f"eval_{key}"] == pytest.approx(value, abs=1e-6), key


def readme_block() -> str:
    text = README.read_text(encoding="utf-8")
    section = text[text.index("## Hugging Face transformers"):]
    blocks = re.findall(r"```python\n(.*?)```", section, flags=re.S)
    assert blocks, "README.md's Hugging Face transformers section has no python block"
    return blocks[0]


@pytest.mark.slow
def test_readme_block_runs_as_a_script(tmp_path):
    script = tmp_path / "example.py"
    script.write_text(readme_block(), encoding="utf-8")
    env = {**os.environ, "PYTHONPATH": f"{SRC}{os.pathsep}{os.environ.get('PYTHONPATH', '')}",
           "DETLOADER_CACHE_DIR": str(tmp_path / "cache")}
    proc = subprocess.run([sys.executable, str(script)], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=240)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert re.search(r"eval_map50_95", proc.stdout), proc.stdout[-2000:]
