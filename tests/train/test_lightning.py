"""detloader.lightning: the balanced distributed sampler kept under Lightning's DDP (two gloo
processes, as ``Trainer(strategy="ddp")`` starts them), set_epoch, and a mid-epoch Lightning
checkpoint that resumes with exactly the batches not yet seen."""

from __future__ import annotations

import json
import os
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
    assert saved["DetectionDataModule"]["train"]["batches"] == 5
    rest = _fit(module(), 2 * steps, ckpt_path=str(ckpt))
    assert len(first) == 5 and first + rest == full
    assert full[0][1] != full[steps][1]  # set_epoch: a new draw each epoch
