"""The reference trainer and evaluator: a loop for any model that meets the small
:class:`Task` protocol (the reference multi-task CenterNet-style model is one), trained on
any dataset :func:`detloader.read_annotations` reads, through the public pipeline
(``DetectionDataset`` -> balanced sampler -> ``make_loader`` -> ``ResumableLoader``).

This stage only reads the ones above it. Entry points::

    from detloader.train import TrainConfig, train, evaluate_checkpoint
    metrics = train(TrainConfig(epochs=12, balance="sqrt", out="runs/a"))   # -> dict
    metrics = train(TrainConfig(out="runs/b"), task=Task(my_net, my_loss, my_decode))
    metrics = evaluate_checkpoint("runs/a/last.pt", "data/VOC2007")  # the run's own val split
    metrics = score_predictions(predictions, index.split("val"))     # any model's predictions

What each module does: docs/training.md, "Files".
"""

from __future__ import annotations

from detloader.errors import (
    CheckpointError,
    DataMismatchError,
    NonFiniteError,
    NonFiniteLossError,
    NonFiniteWeightsError,
    RunDirError,
)
from detloader.train.checkpoint import load_checkpoint, save_checkpoint
from detloader.train.config import TrainConfig
from detloader.train.inference import evaluate_checkpoint, predict
from detloader.train.loop import train
from detloader.train.losses import LossWeights
from detloader.train.metrics import ImagePredictions, compute_metrics, score_predictions
from detloader.train.model import CenterNet, ModelConfig
from detloader.train.task import EpochInfo, StartInfo, StepInfo, Task, centernet_task

__all__ = [
    "CenterNet", "CheckpointError", "DataMismatchError", "EpochInfo", "ImagePredictions", "LossWeights",
    "ModelConfig", "NonFiniteError", "NonFiniteLossError", "NonFiniteWeightsError", "RunDirError", "StartInfo",
    "StepInfo", "Task", "TrainConfig", "centernet_task", "compute_metrics",
    "evaluate_checkpoint", "load_checkpoint", "predict", "save_checkpoint", "score_predictions", "train",
]
