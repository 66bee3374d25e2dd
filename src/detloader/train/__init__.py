"""The reference trainer and evaluator: a small multi-task CenterNet-style model trained on
any dataset :func:`detloader.read_annotations` reads, through the public pipeline
(``DetectionDataset`` -> balanced sampler -> ``make_loader`` -> ``ResumableLoader``).

This stage only reads the ones above it. Entry points::

    from detloader.train import TrainConfig, train, evaluate_checkpoint
    metrics = train(TrainConfig(epochs=12, balance="sqrt", out="runs/a"))   # -> dict
    metrics = evaluate_checkpoint("runs/a/last.pt", "data/VOC2007")  # the run's own val split

Modules: ``model`` (network), ``targets`` (Batch -> heatmaps), ``losses``, ``decode``
(outputs -> detections), ``evaluate`` (mAP, NME, image class), ``inference``, ``checkpoint``,
``distributed`` (torchrun), ``config``, ``runs`` (run folders, the data a checkpoint
knows), ``loop``. See ``docs/training.md``.
"""

from __future__ import annotations

from detloader.train.checkpoint import CheckpointError, load_checkpoint, save_checkpoint
from detloader.train.config import TrainConfig
from detloader.train.evaluate import ImagePredictions, compute_metrics
from detloader.train.inference import evaluate_checkpoint, predict
from detloader.train.losses import LossWeights
from detloader.train.loop import EpochInfo, StartInfo, StepInfo, train
from detloader.train.model import CenterNet, ModelConfig
from detloader.train.runs import DataMismatchError, RunDirError

__all__ = [
    "CenterNet", "CheckpointError", "DataMismatchError", "EpochInfo", "ImagePredictions", "LossWeights",
    "ModelConfig", "RunDirError", "StartInfo", "StepInfo", "TrainConfig", "compute_metrics",
    "evaluate_checkpoint", "load_checkpoint", "predict", "save_checkpoint", "train",
]
