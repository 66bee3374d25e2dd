"""detloader.lightning: the balanced distributed sampler kept under Lightning's DDP (two gloo
processes, as ``Trainer(strategy="ddp")`` starts them), set_epoch, and a mid-epoch Lightning
checkpoint that resumes with exactly the batches not yet seen, in one process and on each rank
under DDP; the gathered validation score of all ranks, each image once, equal to one process's."""

from __future__ import annotations

import json
import os
import pickle
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

import detloader
from detloader.synth import make_synthetic

pl = pytest.importorskip("lightning.pytorch")

SCRIPT = """
import json, sys, torch
import lightning.pytorch as pl
import detloader
from detloader.lightning import DetectionDataModule
from detloader.transforms import Resize

root, out = sys.argv[1], sys.argv[2]
index = detloader.read_annotations(root, cache=False)
train = detloader.DetectionDataset(index, Resize(32, mode="letterbox"), seed=0)


class Recorder(pl.LightningModule):
    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(torch.zeros(1))
        self.seen = []

    def training_step(self, batch, i):
        self.seen.append([self.current_epoch, batch.image_ids.tolist()])
        return (self.w * batch.normalize().mean()).sum()

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)

    def on_train_end(self):
        with open(f"{out}/rank{self.global_rank}.json", "w") as f:
            json.dump({"seen": self.seen, "world": self.trainer.world_size}, f)


trainer = pl.Trainer(accelerator="cpu", devices=2, strategy="ddp", max_epochs=EPOCHS, logger=False,
                     enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False)
module = DetectionDataModule(train, batch_size=BATCH, balance="inverse", num_workers=0, seed=0)
trainer.fit(Recorder(), datamodule=module)
"""

EPOCHS, BATCH = 3, 4


@pytest.fixture(scope="module")
def faces(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_synthetic(tmp_path_factory.mktemp("lightning") / "faces", 64, seed=2, size=(64, 48))


@pytest.mark.slow
@pytest.mark.distributed
@pytest.mark.timeout(300)
def test_ddp_keeps_the_balanced_sampler(faces: Path, tmp_path: Path) -> None:
    script = tmp_path / "fit.py"
    script.write_text(SCRIPT.replace("EPOCHS", str(EPOCHS)).replace("BATCH", str(BATCH)), encoding="utf-8")
    env = {**os.environ, "PYTHONWARNINGS": "ignore"}
    proc = subprocess.run([sys.executable, str(script), str(faces), str(tmp_path)], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=280)
    assert proc.returncode == 0, proc.stderr[-3000:]
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    assert [r["world"] for r in ranks] == [2, 2]
    index = detloader.read_annotations(faces, cache=False)
    drawn = []
    for epoch in range(EPOCHS):
        sampler = detloader.make_balanced_sampler(index, "inverse", seed=0, rank=0, world_size=2)
        sampler.set_epoch(epoch)
        stream = sampler.global_indices()  # one balanced draw; rank r has positions r::2
        for r, rank in enumerate(ranks):
            got = [i for e, ids in rank["seen"] if e == epoch for i in ids]
            share = stream[r::2].tolist()
            assert got == share[: len(share) // BATCH * BATCH], (epoch, r)  # not a DistributedSampler's
            drawn += got
    # the drawn class shares match the balanced expectation, far from the raw ones
    p = detloader.make_balanced_sampler(index, "inverse", seed=0, world_size=1).probabilities()
    for c, name in enumerate(index.classes):
        has = np.array([c in index.image(i).labels for i in range(len(index))])
        expected, raw = float(p[has].sum()), float(has.mean())
        observed = float(np.mean(has[drawn]))
        assert abs(observed - expected) < 4 * np.sqrt(expected * (1 - expected) / len(drawn)) + 0.02, name
        if raw < 0.1:
            assert observed > 2 * raw, name


def _fit(dm, max_steps: int, ckpt_dir: Path | None = None, ckpt_path: str | None = None) -> list:
    class Recorder(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.w = torch.nn.Parameter(torch.zeros(1))
            self.seen: list = []

        def training_step(self, batch, i):
            self.seen.append((self.current_epoch, batch.image_ids.tolist()))
            return (self.w * batch.normalize().mean()).sum()

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

    callbacks = (
        [pl.callbacks.ModelCheckpoint(dirpath=ckpt_dir, every_n_train_steps=max_steps, save_top_k=-1)]
        if ckpt_dir
        else []
    )
    trainer = pl.Trainer(
        accelerator="cpu",
        devices=1,
        max_steps=max_steps,
        max_epochs=-1,
        logger=False,
        enable_checkpointing=bool(ckpt_dir),
        callbacks=callbacks,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    module = Recorder()
    trainer.fit(module, datamodule=dm, ckpt_path=ckpt_path)
    return module.seen


@pytest.mark.filterwarnings("ignore")
def test_a_mid_epoch_checkpoint_resumes_exactly(faces: Path, tmp_path: Path) -> None:
    from detloader.lightning import DetectionDataModule
    from detloader.transforms import Resize

    index = detloader.read_annotations(faces, cache=False)

    def module() -> DetectionDataModule:
        return DetectionDataModule(detloader.DetectionDataset(index, Resize(32, mode="letterbox"), seed=0),
                                   batch_size=BATCH, balance="sqrt", num_workers=0)

    steps = len(index) // BATCH  # 16 per epoch
    full = _fit(module(), 2 * steps)
    first = _fit(module(), 5, ckpt_dir=tmp_path / "ckpt")
    (ckpt,) = (tmp_path / "ckpt").glob("*.ckpt")
    saved = torch.load(ckpt, weights_only=False)
    assert saved["DetectionDataModule"]["train"]["ranks"][0]["batches"] == 5
    rest = _fit(module(), 2 * steps, ckpt_path=str(ckpt))
    assert len(first) == 5 and first + rest == full
    assert full[0][1] != full[steps][1]  # set_epoch: a new draw each epoch


RESUME_SCRIPT = """
import json, pickle, sys, torch
import lightning.pytorch as pl
import detloader
from detloader.lightning import DetectionDataModule, evaluate_gathered
from detloader.train.metrics import as_predictions
from detloader.transforms import Resize

root, out = sys.argv[1], sys.argv[2]
index = detloader.read_annotations(root, cache=False)
val_index = index.subset(list(range(VAL)))  # odd: Lightning's DistributedSampler pads with a repeated image


def trainer(**kwargs):
    return pl.Trainer(accelerator="cpu", devices=2, strategy="ddp", logger=False, enable_progress_bar=False,
                      enable_model_summary=False, **kwargs)


def module(balance):
    return DetectionDataModule(detloader.DetectionDataset(index, Resize(32, mode="letterbox"), seed=0),
                               detloader.DetectionDataset(val_index, Resize(32, mode="letterbox")),
                               batch_size=BATCH, balance=balance, num_workers=0, seed=0)


class Recorder(pl.LightningModule):
    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(torch.zeros(1))
        self.seen = []

    def training_step(self, batch, i):
        self.seen.append([self.current_epoch, batch.image_ids.tolist()])
        return (self.w * batch.normalize().mean()).sum()

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)

    def on_validation_epoch_start(self):
        self.predictions = []

    def validation_step(self, batch, i):  # the truth, moved or left out on some images: a mAP below 1
        boxes = batch.boxes_to_original(batch.boxes, batch.batch_index)
        for b, image_id in enumerate(batch.image_ids.tolist()):
            mine = batch.batch_index == b
            if image_id % 4 == 1:
                continue
            shift = 25.0 if image_id % 3 == 0 else 0.0
            n = int(mine.sum())
            self.predictions.append({"image_id": image_id, "boxes": boxes[mine] + shift, "labels": batch.labels[mine],
                                     "scores": torch.full((n,), 0.3 + 0.05 * (image_id % 10))})

    def on_validation_epoch_end(self):
        metrics = evaluate_gathered(self.predictions, val_index)
        mine = [as_predictions(p) for p in self.predictions]
        with open(f"{out}/val-rank{self.global_rank}.pkl", "wb") as f:
            pickle.dump({"local": mine, "gathered": metrics}, f)

    def dump(self, name):
        with open(f"{out}/{name}-rank{self.global_rank}.json", "w") as f:
            json.dump(self.seen, f)


for balance in ("sqrt", "none"):
    ckpt = pl.callbacks.ModelCheckpoint(dirpath=f"{out}/ckpt-{balance}", filename="{step}",
                                        every_n_train_steps=CKPT_STEP, save_top_k=-1)
    full = Recorder()
    trainer(max_steps=STEPS, max_epochs=-1, callbacks=[ckpt]).fit(full, datamodule=module(balance))
    full.dump(f"full-{balance}")
    rest = Recorder()
    trainer(max_steps=STEPS, max_epochs=-1, enable_checkpointing=False).fit(
        rest, datamodule=module(balance), ckpt_path=f"{out}/ckpt-{balance}/step={CKPT_STEP}.ckpt")
    rest.dump(f"rest-{balance}")
trainer(enable_checkpointing=False).validate(Recorder(), datamodule=module("none"))
"""

VAL, RESUME_STEPS, CKPT_STEP = 11, 12, 5  # 8 steps per epoch and rank: the resumed run crosses an epoch


@pytest.fixture(scope="module")
def ddp_run(faces: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One script under ``Trainer(devices=2, strategy="ddp")``: for balance sqrt and none a run of
    12 steps with a checkpoint at step 5, and a run resumed from it; then a validation."""
    out = tmp_path_factory.mktemp("ddp_resume")
    code = RESUME_SCRIPT.replace("VAL", str(VAL)).replace("BATCH", str(BATCH))
    code = code.replace("CKPT_STEP", str(CKPT_STEP)).replace("STEPS", str(RESUME_STEPS))
    script = out / "fit.py"
    script.write_text(code, encoding="utf-8")
    env = {**os.environ, "PYTHONWARNINGS": "ignore"}
    proc = subprocess.run([sys.executable, str(script), str(faces), str(out)], cwd=out, env=env,
                          capture_output=True, text=True, timeout=560)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return out


@pytest.mark.slow
@pytest.mark.distributed
@pytest.mark.timeout(600)
@pytest.mark.parametrize("balance", ["sqrt", "none"])
def test_ddp_mid_epoch_checkpoint_resumes_each_rank_exactly(ddp_run: Path, balance: str) -> None:
    for rank in range(2):
        full = json.loads((ddp_run / f"full-{balance}-rank{rank}.json").read_text())
        rest = json.loads((ddp_run / f"rest-{balance}-rank{rank}.json").read_text())
        assert len(full) == RESUME_STEPS and len(rest) == RESUME_STEPS - CKPT_STEP, rank
        assert full[:CKPT_STEP] + rest == full, rank  # before the checkpoint + after the resume = uninterrupted
    ranks = [json.loads((ddp_run / f"full-{balance}-rank{r}.json").read_text()) for r in range(2)]
    assert ranks[0] != ranks[1]  # each rank its own share, not rank 0's
    saved = torch.load(ddp_run / f"ckpt-{balance}" / f"step={CKPT_STEP}.ckpt", weights_only=False)
    state = saved["DetectionDataModule"]["train"]
    assert state["world_size"] == 2 and [state["ranks"][r]["sampler"]["rank"] for r in range(2)] == [0, 1]
    assert [state["ranks"][r]["batches"] for r in range(2)] == [CKPT_STEP, CKPT_STEP]


@pytest.mark.slow
@pytest.mark.distributed
@pytest.mark.timeout(600)
def test_a_ddp_checkpoint_in_one_process_is_refused_by_name(ddp_run: Path, faces: Path) -> None:
    from detloader.errors import DetloaderValueError
    from detloader.lightning import DetectionDataModule

    saved = torch.load(ddp_run / "ckpt-sqrt" / f"step={CKPT_STEP}.ckpt", weights_only=False)
    index = detloader.read_annotations(faces, cache=False)
    dm = DetectionDataModule(detloader.DetectionDataset(index), batch_size=BATCH, num_workers=0)
    dm.load_state_dict(saved["DetectionDataModule"])
    with pytest.raises(DetloaderValueError, match="written by 2 processes, this run has 1"):
        dm.train_dataloader()


@pytest.mark.slow
@pytest.mark.distributed
@pytest.mark.timeout(600)
def test_ddp_validation_scores_every_image_once(ddp_run: Path, faces: Path) -> None:
    pytest.importorskip("faster_coco_eval")
    from detloader.train import score_predictions

    ranks = [pickle.loads((ddp_run / f"val-rank{r}.pkl").read_bytes()) for r in range(2)]
    ids = [{p.image_id for p in r["local"]} for r in ranks]
    assert ids[0] & ids[1]  # the DistributedSampler's padding: an image predicted on both ranks
    one: dict = {}
    for r in ranks:
        for p in r["local"]:
            one.setdefault(p.image_id, p)
    index = detloader.read_annotations(faces, cache=False).subset(list(range(VAL)))
    expected = score_predictions([one[i] for i in sorted(one)], index)  # one process, the same predictions
    assert expected["images_with_predictions"] == len(one) == sum(i % 4 != 1 for i in range(VAL))
    assert expected["images"] == VAL  # every image of the split counts, one without predictions as all misses
    assert ranks[0]["gathered"] == ranks[1]["gathered"] == expected
    halves = [score_predictions(r["local"], index) for r in ranks]
    assert any(h["map50"] != expected["map50"] for h in halves)  # what each rank alone would say


def _loader_state(faces: Path, **sampler: object) -> dict:
    """An older checkpoint's ``"train"`` state (one ResumableLoader.state_dict()) of one process."""
    from detloader.lightning import DetectionDataModule

    index = detloader.read_annotations(faces, cache=False)
    dm = DetectionDataModule(detloader.DetectionDataset(index), batch_size=BATCH, num_workers=0)
    loader = dm.train_dataloader()
    it = iter(loader)
    next(it), next(it)
    state = loader.loader.state_dict()
    state["sampler"].update(sampler)
    return state


@pytest.mark.filterwarnings("ignore")
def test_an_older_one_process_state_still_loads(faces: Path) -> None:
    from detloader.errors import DetloaderValueError
    from detloader.lightning import DetectionDataModule

    index = detloader.read_annotations(faces, cache=False)
    old = _loader_state(faces)
    dm = DetectionDataModule(detloader.DetectionDataset(index), batch_size=BATCH, num_workers=0)
    dm.load_state_dict({"train": old})
    assert dm.train_dataloader().loader.batches_consumed == 2
    assert dm.state_dict()["train"] == {"world_size": 1, "ranks": {0: old}}
    # rank 0's position of a 2-process run, written before every rank's was kept: refused by name
    dm = DetectionDataModule(detloader.DetectionDataset(index), batch_size=BATCH, num_workers=0)
    dm.load_state_dict({"train": _loader_state(faces, world_size=2)})
    with pytest.raises(DetloaderValueError, match="rank 0's training-loader position only, of a run of 2"):
        dm.train_dataloader()


def test_gather_in_one_process_keeps_each_image_once(faces: Path) -> None:
    pytest.importorskip("faster_coco_eval")
    from detloader.lightning import evaluate_gathered, gather_predictions
    from detloader.train import score_predictions

    index = detloader.read_annotations(faces, cache=False).subset(list(range(6)))
    truth = [index.image(i) for i in range(len(index))]

    def entry(i: int, shift: float) -> dict:
        boxes = np.asarray(truth[i].boxes, np.float32) + shift
        return {"image_id": i, "boxes": boxes, "labels": truth[i].labels, "scores": np.full(len(boxes), 0.5)}

    preds = [entry(i, 30.0 * (i % 2)) for i in (3, 0, 1, 2)] + [entry(0, 30.0)]  # image 0 twice: the first kept
    gathered = gather_predictions(preds)
    assert [p.image_id for p in gathered] == [0, 1, 2, 3]
    assert np.array_equal(gathered[0].boxes, np.asarray(truth[0].boxes, np.float32))
    assert evaluate_gathered(preds, index) == score_predictions(preds[:4], index)
