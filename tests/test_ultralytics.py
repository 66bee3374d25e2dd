"""detloader.ultralytics with Ultralytics itself: the balanced training loader, its epochs, the rect
refusal, a 2-epoch training and the README's Ultralytics block. Marked ``ultralytics``: they skip
where ultralytics is not installed; ``make test-ultralytics`` runs them in .venv-ultralytics."""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

pytestmark = [
    pytest.mark.ultralytics,
    pytest.mark.skipif(importlib.util.find_spec("ultralytics") is None,
                       reason="needs ultralytics (make test-ultralytics)"),
]

README = Path(__file__).resolve().parents[1] / "README.md"
NAMES = ("common", "half", "rare")
RARE_IMAGES = 3


def write_dataset(root: Path, n: int = 40, tall: int = 0) -> Path:
    """``n`` images (64x64; the last ``tall`` 64 wide x 24 high) with YOLO labels: a ``common``
    box in every image, ``half`` in every second, ``rare`` in the first RARE_IMAGES. Returns data.yaml."""
    from PIL import Image, ImageDraw

    (root / "images").mkdir(parents=True)
    (root / "labels").mkdir()
    colors = {0: (200, 40, 40), 1: (40, 200, 40), 2: (40, 40, 200)}
    for i in range(n):
        w, h = (64, 24) if i >= n - tall else (64, 64)
        im = Image.new("RGB", (w, h), (128, 128, 128))
        draw = ImageDraw.Draw(im)
        boxes = [(0, 0.05)] + ([(1, 0.35)] if i % 2 else []) + ([(2, 0.65)] if i < RARE_IMAGES else [])
        lines = []
        for cls, x0 in boxes:
            draw.rectangle([x0 * w, 0.2 * h, (x0 + 0.25) * w, 0.8 * h], fill=colors[cls])
            lines.append(f"{cls} {x0 + 0.125:.4f} 0.5 0.25 0.6")
        im.save(root / "images" / f"im{i:03d}.png")
        (root / "labels" / f"im{i:03d}.txt").write_text("\n".join(lines) + "\n")
    yaml = root / "data.yaml"
    yaml.write_text(f"path: {root}\ntrain: images\nval: images\nnames:\n"
                    + "".join(f"  {k}: {v}\n" for k, v in enumerate(NAMES)))
    return yaml


@pytest.fixture(scope="module")
def ul(tmp_path_factory):
    """ultralytics, imported offline with its settings in a tmp dir."""
    os.environ["YOLO_OFFLINE"] = "1"
    os.environ["YOLO_CONFIG_DIR"] = str(tmp_path_factory.mktemp("yolo-config"))
    import ultralytics

    return ultralytics


@pytest.fixture(scope="module")
def data(ul, tmp_path_factory) -> Path:
    return write_dataset(tmp_path_factory.mktemp("tiny"))


def _trainer(cls, data: Path, tmp: Path, **overrides):
    from ultralytics.nn.tasks import DetectionModel

    args = {"model": "yolo11n.yaml", "data": str(data), "imgsz": 64, "batch": 4, "workers": 0, "device": "cpu",
            "project": str(tmp), "name": "run", "exist_ok": True, "plots": False, "verbose": False, **overrides}
    trainer = cls(overrides=args)
    trainer.model = DetectionModel("yolo11n.yaml", nc=len(NAMES), verbose=False)
    return trainer


def _epoch_files(loader) -> list[str]:
    """The primary image of each sample of one epoch (the sampler's picks; mosaic adds others)."""
    return [Path(f).name for batch in loader for f in batch["im_file"]]


@pytest.mark.parametrize("workers", [0, 2])
def test_inverse_triples_the_rare_share_and_every_epoch_is_a_new_draw(ul, data, tmp_path, workers):
    from detloader.balance import AutoEpochSampler
    from detloader.ultralytics import balanced_trainer

    trainer = _trainer(balanced_trainer("inverse"), data, tmp_path, workers=workers)
    loader = trainer.get_dataloader(trainer.data["train"], batch_size=4, rank=-1, mode="train")
    assert isinstance(loader.sampler, AutoEpochSampler)
    assert loader.collate_fn is loader.dataset.collate_fn and loader.batch_size == 4
    rare = {f"im{i:03d}.png" for i in range(RARE_IMAGES)}
    raw = len(rare) / 40
    epochs = [_epoch_files(loader) for _ in range(3)]
    for files in epochs:
        assert len(files) == 40
        share = sum(f in rare for f in files) / len(files)
        assert share >= 3 * raw, (share, raw)
    assert epochs[0] != epochs[1] != epochs[2]
    # the same draws as the sampler alone, epoch by epoch (Ultralytics never called set_epoch)
    names = [Path(f).name for f in loader.dataset.im_files]
    sampler = loader.sampler.sampler
    for e, files in enumerate(epochs):
        sampler.set_epoch(e)
        assert files == [names[i] for i in sampler.indices()]
    loader.reset()
    loader.close()


def test_validation_loader_is_ultralytics_own_and_get_dataloader_can_be_called_again(ul, data, tmp_path):
    from detloader.ultralytics import BalancedTrainer

    trainer = _trainer(BalancedTrainer, data, tmp_path)
    val = trainer.get_dataloader(trainer.data["val"], batch_size=8, rank=-1, mode="val")
    assert type(val.sampler).__name__ == "SequentialSampler"
    first = trainer.get_dataloader(trainer.data["train"], batch_size=4, rank=-1, mode="train")
    again = trainer.get_dataloader(trainer.data["train"], batch_size=2, rank=-1, mode="train")  # OOM retry
    assert first.batch_size == 4 and again.batch_size == 2
    assert _epoch_files(again)[:4] == _epoch_files(first)[:4]  # same seed: the same epoch 0


def test_single_cls_and_classes_are_read_from_the_dataset(ul, data, tmp_path):
    from detloader.ultralytics import BalancedTrainer, dataset_labels

    trainer = _trainer(BalancedTrainer, data, tmp_path, classes=[0, 1])
    loader = trainer.get_dataloader(trainer.data["train"], batch_size=4, rank=-1, mode="train")
    assert not any(2 in np.asarray(c) for c in dataset_labels(loader.dataset))
    trainer = _trainer(BalancedTrainer, data, tmp_path, single_cls=True)
    loader = trainer.get_dataloader(trainer.data["train"], batch_size=4, rank=-1, mode="train")
    assert {int(v) for c in dataset_labels(loader.dataset) for v in np.asarray(c).ravel()} == {0}


def test_rect_with_several_shapes_is_refused_by_name(ul, tmp_path):
    from detloader.errors import RectBatchError
    from detloader.ultralytics import BalancedTrainer

    yaml = write_dataset(tmp_path / "mixed", tall=12)
    trainer = _trainer(BalancedTrainer, yaml, tmp_path, rect=True)
    with pytest.raises(RectBatchError, match="rect=True gives this dataset 2 batch shapes"):
        trainer.get_dataloader(trainer.data["train"], batch_size=4, rank=-1, mode="train")


def test_balanced_trainer_checks_its_arguments(ul):
    from detloader.errors import DetloaderValueError
    from detloader.ultralytics import BalancedTrainer, balanced_trainer

    cls = balanced_trainer("power:0.3", seed=5)
    assert issubclass(cls, BalancedTrainer) and cls.balance == "power:0.3" and cls.balance_seed == 5
    assert BalancedTrainer.balance == "sqrt"
    with pytest.raises(DetloaderValueError, match="'median'"):
        balanced_trainer("median")
    with pytest.raises(DetloaderValueError, match="by='image_class'"):
        balanced_trainer(by="image_class")


@pytest.mark.slow
def test_two_epoch_training_writes_ultralytics_results(ul, data, tmp_path):
    from ultralytics import YOLO

    from detloader.ultralytics import balanced_trainer

    model = YOLO("yolo11n.yaml")
    model.train(data=str(data), trainer=balanced_trainer("inverse"), epochs=2, imgsz=64, batch=4, workers=0,
                device="cpu", project=str(tmp_path), name="run", plots=False, verbose=False)
    results = tmp_path / "run" / "results.csv"
    rows = results.read_text().strip().splitlines()
    assert len(rows) == 3 and rows[0].split(",")[0].strip() == "epoch"
    assert (tmp_path / "run" / "weights" / "last.pt").is_file()
    sampler = model.trainer.train_loader.sampler
    assert sampler.epoch == 1  # one draw per epoch, from the trainer's epoch


def readme_block() -> str:
    section = README.read_text(encoding="utf-8").split("\n## Ultralytics\n", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"```python\n(.*?)```", section, flags=re.S)
    assert len(blocks) == 1, "README's 'Ultralytics' section should hold one python block"
    return blocks[0]


@pytest.mark.slow
def test_readme_block_runs_as_a_plain_script(ul, tmp_path):
    write_dataset(tmp_path)
    env = {**os.environ, "YOLO_OFFLINE": "1", "YOLO_CONFIG_DIR": str(tmp_path / "yolo-config")}
    src = str(Path(__file__).resolve().parents[1] / "src")
    env["PYTHONPATH"] = src + os.pathsep + env.get("PYTHONPATH", "")
    (tmp_path / "block.py").write_text(readme_block())
    done = subprocess.run([sys.executable, "block.py"], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    results = Path(done.stdout.strip().splitlines()[-1])
    assert results.name == "results.csv" and len(results.read_text().strip().splitlines()) == 3
