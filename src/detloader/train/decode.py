"""Turn the head's dense outputs into detections: peaks of the heatmaps, then the boxes,
landmarks and image class read at those peaks.

A peak is a cell that equals the 3x3 max-pool of its heatmap (CenterNet's NMS-free rule);
the ``top_k`` highest peaks per image over all classes are kept, down to ``min_score``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from detloader.train.metrics import ImagePredictions
from detloader.train.model import STRIDE


@dataclass(frozen=True)
class Detections:
    """``P`` detections of a batch, in input pixels (flat, with the image of each).

    Attributes:
        image_index: int64 ``[P]`` image of the batch each detection belongs to.
        boxes: float32 ``[P, 4]`` xyxy pixels of the network input.
        scores: float32 ``[P]`` heatmap peak value (sigmoid), 0..1.
        labels: int64 ``[P]`` class ids.
        landmarks: float32 ``[P, K, 2]`` pixels (``K = 0`` without a landmark head).
        image_probs: float32 ``[B, I]`` image-class probabilities (``I = 0`` without a head).
    """

    image_index: torch.Tensor
    boxes: torch.Tensor
    scores: torch.Tensor
    labels: torch.Tensor
    landmarks: torch.Tensor
    image_probs: torch.Tensor


@torch.no_grad()
def decode(
    outputs: dict[str, torch.Tensor], stride: int, top_k: int = 100, min_score: float = 0.01
) -> Detections:
    """Detections from :class:`~detloader.train.model.CenterNet` outputs (see the module
    docstring); ``stride`` input pixels per output cell."""
    heat = outputs["heatmap"].float().sigmoid()
    b, c, h, w = heat.shape
    peaks = heat * (F.max_pool2d(heat, 3, 1, 1) == heat)
    k = min(top_k, c * h * w)
    scores, flat = peaks.view(b, -1).topk(k, dim=1)  # [B, k]
    labels = flat // (h * w)
    cell = flat % (h * w)
    ys = (cell // w).float()
    xs = (cell % w).float()

    def at(name: str) -> torch.Tensor:
        dense = outputs[name].float()
        d = dense.shape[1]
        return dense.view(b, d, h * w).gather(2, cell.unsqueeze(1).expand(b, d, k)).permute(0, 2, 1)

    size = at("size").clamp(min=0)
    offset = at("offset")
    cx, cy = xs + offset[..., 0], ys + offset[..., 1]
    boxes = torch.stack(
        [cx - size[..., 0] / 2, cy - size[..., 1] / 2, cx + size[..., 0] / 2, cy + size[..., 1] / 2], dim=-1
    ) * stride
    if "landmarks" in outputs:
        lm = at("landmarks").view(b, k, -1, 2)
        landmarks = (lm + torch.stack([xs, ys], dim=-1).unsqueeze(2)) * stride
    else:
        landmarks = torch.zeros(b, k, 0, 2, device=heat.device)
    keep = scores >= min_score
    image_index = torch.arange(b, device=heat.device).view(b, 1).expand(b, k)
    if "image_logits" in outputs:
        image_probs = outputs["image_logits"].float().softmax(dim=1)
    else:
        image_probs = torch.zeros(b, 0, device=heat.device)
    return Detections(
        image_index=image_index[keep],
        boxes=boxes[keep],
        scores=scores[keep],
        labels=labels[keep],
        landmarks=landmarks[keep],
        image_probs=image_probs,
    )


def decode_predictions(outputs: dict[str, torch.Tensor], batch: Any) -> list[ImagePredictions]:
    """Each image's detections in annotation coordinates: the reference model's ``decode`` of
    the :class:`~detloader.train.task.Task` protocol (``batch``: the :class:`detloader.Batch`)."""
    det = decode(outputs, STRIDE)
    which = det.image_index
    boxes = batch.boxes_to_original(det.boxes, which).cpu().numpy()
    lms = (batch.landmarks_to_original(det.landmarks, which) if det.landmarks.shape[1] else det.landmarks).cpu().numpy()
    scores, labels, which = det.scores.cpu().numpy(), det.labels.cpu().numpy().astype(np.int64), which.cpu().numpy()
    probs = det.image_probs.cpu().numpy()
    return [
        ImagePredictions(int(i), boxes[which == b], scores[which == b], labels[which == b], lms[which == b], probs[b])
        for b, i in enumerate(batch.image_ids.tolist())
    ]
