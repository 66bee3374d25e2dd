"""Figures of docs/ultralytics.md, in .venv-ultralytics (``make .venv-ultralytics/.installed``).

``python benchmarks/bench_ultralytics.py DATA.yaml shares``: per class, the share of the training
images drawn in an epoch that hold it, and the share of objects, Ultralytics' own order vs each
balance (mean of 5 epochs, from the labels alone).
``... mosaic``: the class shares of the objects actually in the training batches of one epoch (the
labels after augmentation), balanced sampler with mosaic on vs off.
``... train --epochs E --imgsz S``: a short CPU training from scratch (yolo11n.yaml), Ultralytics'
trainer vs ``balanced_trainer(BALANCE)``, then mAP50 per class on the val split.
Results print as JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile

import numpy as np


def _trainer(cls, data: str, project: str, **overrides):
    from ultralytics.nn.tasks import DetectionModel

    args = {"model": "yolo11n.yaml", "data": data, "imgsz": 320, "batch": 16, "workers": 0, "device": "cpu",
            "project": project, "name": "bench", "exist_ok": True, "plots": False, "verbose": False, **overrides}
    trainer = cls(overrides=args)
    trainer.model = DetectionModel("yolo11n.yaml", nc=len(trainer.data["names"]), verbose=False)
    return trainer


def shares(data: str, project: str, balances: list[str], epochs: int = 5) -> dict:
    from ultralytics.models.yolo.detect import DetectionTrainer

    from detloader.adapters.ultralytics import dataset_labels, dataset_sampler

    trainer = _trainer(DetectionTrainer, data, project)
    dataset = trainer.build_dataset(trainer.data["train"], "train", 16)
    names = [trainer.data["names"][k] for k in sorted(trainer.data["names"])]
    labels = [np.asarray(c).reshape(-1).astype(int) for c in dataset_labels(dataset)]

    def measure(picks: list[np.ndarray]) -> dict:
        holds = np.mean([[np.mean([c in labels[i] for i in p]) for c in range(len(names))] for p in picks], axis=0)
        objs = np.sum([np.bincount(np.concatenate([labels[i] for i in p]), minlength=len(names)) for p in picks], 0)
        return {n: {"images_holding": round(float(h), 4), "objects": round(float(o / objs.sum()), 4)}
                for n, h, o in zip(names, holds, objs)}

    out = {"images": len(labels), "raw": measure([np.arange(len(labels))])}
    for balance in balances:
        sampler = dataset_sampler(dataset, balance)
        out[balance] = measure([np.asarray(list(sampler)) for _ in range(epochs)])
    return out


def mosaic(data: str, project: str, balance: str) -> dict:
    from ultralytics.models.yolo.detect import DetectionTrainer

    from detloader.adapters.ultralytics import balanced_trainer

    out = {}
    for label, cls in (("ultralytics", DetectionTrainer), (balance, balanced_trainer(balance))):
        for on in (True, False):
            trainer = _trainer(cls, data, project, mosaic=1.0 if on else 0.0)
            loader = trainer.get_dataloader(trainer.data["train"], batch_size=16, rank=-1, mode="train")
            names = [trainer.data["names"][k] for k in sorted(trainer.data["names"])]
            counts = np.zeros(len(names))
            for batch in loader:
                counts += np.bincount(batch["cls"].reshape(-1).long().numpy(), minlength=len(names))
            loader.close()
            out[f"{label}, mosaic {'on' if on else 'off'}"] = {n: round(float(c / counts.sum()), 4)
                                                             for n, c in zip(names, counts)}
    return out


def train(data: str, project: str, balance: str, epochs: int, imgsz: int) -> dict:
    from ultralytics import YOLO

    from detloader.adapters.ultralytics import balanced_trainer

    out = {}
    for label, trainer in (("ultralytics", None), (f"balanced_trainer({balance!r})", balanced_trainer(balance))):
        model = YOLO("yolo11n.yaml")
        kw = {"trainer": trainer} if trainer is not None else {}
        model.train(data=data, epochs=epochs, imgsz=imgsz, batch=16, workers=2, device="cpu", seed=0,
                    project=project, name=label.split("(")[0], exist_ok=True, plots=False, verbose=False, **kw)
        metrics = model.val(data=data, imgsz=imgsz, batch=16, device="cpu", plots=False, verbose=False,
                            project=project, name=label.split("(")[0] + "-val", exist_ok=True)
        names = metrics.names
        out[label] = {"mAP50": round(float(metrics.box.map50), 4),
                      **{names[c]: round(float(metrics.box.class_result(i)[2]), 4)
                         for i, c in enumerate(metrics.box.ap_class_index)}}
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("data")
    p.add_argument("what", choices=("shares", "mosaic", "train"))
    p.add_argument("--balance", default="class_aware")
    p.add_argument("--epochs", type=int, default=5)
    p.add_argument("--imgsz", type=int, default=320)
    args = p.parse_args()
    os.environ.setdefault("YOLO_OFFLINE", "1")
    with tempfile.TemporaryDirectory() as project:
        if args.what == "shares":
            result = shares(args.data, project, ["sqrt", "inverse", "class_aware"])
        elif args.what == "mosaic":
            result = mosaic(args.data, project, args.balance)
        else:
            result = train(args.data, project, args.balance, args.epochs, args.imgsz)
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
