"""The reference multi-task network: a small CNN backbone and an anchor-free centre head.

CenterNet-style ("Objects as Points", multi-pose variant): every object is the peak of a
per-class heatmap at output stride :data:`STRIDE`; at that cell the head regresses the box
size, the sub-cell offset of the centre and ``K`` landmark offsets from the centre. An
image-level class comes from globally pooled features (stem and deepest stage). Pure PyTorch, no torchvision.

Shapes (input ``[B, 3, H, W]`` float, ``H`` and ``W`` multiples of :data:`INPUT_MULTIPLE`;
``h, w = H / STRIDE, W / STRIDE``):

==================  ========================  ============================================
``heatmap``         float ``[B, C, h, w]``    logits of the per-class centre heatmaps
``size``            float ``[B, 2, h, w]``    box width, height in output cells
``offset``          float ``[B, 2, h, w]``    centre offset within its cell, 0..1
``landmarks``       float ``[B, 2K, h, w]``   (dx, dy) of each landmark from the centre, cells
``image_logits``    float ``[B, I]``          image-class logits
==================  ========================  ============================================

``landmarks`` is absent when ``num_landmarks == 0``, ``image_logits`` when
``num_image_classes == 0`` (those heads are not built at all).

Decoding (:func:`decode`, then :func:`decode_predictions` to annotation coordinates): docs/training.md, "Model".
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from detloader.errors import DetloaderValueError
from detloader.train.metrics import ImagePredictions

#: Output stride of the dense head (pixels of the input per output cell).
STRIDE = 4
#: Input height and width must be multiples of this (the deepest stage has stride 32).
INPUT_MULTIPLE = 32
#: Largest network input side, pixels (``TrainConfig.size``; a checkpoint asking more is refused).
MAX_INPUT_SIZE = 8192
#: Sane bounds of each :class:`ModelConfig` field, (lowest, highest): far above any real model
#: (width 1024 is 8192 channels in the deepest stage, 1.7 billion weights; LVIS has 1203 classes,
#: dense face meshes 478 points), far below what would exhaust a machine's memory, so that a damaged
#: or hostile checkpoint is refused before anything is built from it (docs/training.md, "Damaged checkpoints").
MODEL_BOUNDS: dict[str, tuple[int, int]] = {
    "num_classes": (1, 100_000), "num_landmarks": (0, 10_000), "num_image_classes": (0, 100_000),
    "width": (4, 1024), "head_width": (4, 4096),
}


def model_config_problem(data: Any) -> str | None:
    """What makes ``data`` (a checkpoint's ``model_config``) unfit to build a :class:`ModelConfig`
    from: not a mapping, an unknown or missing key, a value that is not an int or lies outside
    :data:`MODEL_BOUNDS` (``"width=1000000 is outside [4, 1024]"``); None when it is fit. Builds nothing."""
    if not isinstance(data, Mapping):
        return f"model_config is a {type(data).__name__}, not a mapping"
    unknown = sorted(str(k) for k in data if k not in MODEL_BOUNDS)
    if unknown:
        return f"model_config has unknown keys {unknown} (known: {sorted(MODEL_BOUNDS)})"
    if "num_classes" not in data:
        return "model_config lacks num_classes"
    for name, value in data.items():
        low, high = MODEL_BOUNDS[name]
        if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
            return f"model_config {name}={value!r} is outside [{low}, {high}] (an int; no real model needs more)"
    return None


#: Heatmap bias at initialisation: sigmoid(-2.19) = 0.1, CenterNet's prior.
_HEATMAP_PRIOR_BIAS = -2.19


@dataclass(frozen=True)
class ModelConfig:
    """What the network is built from (saved in checkpoints to rebuild it).

    Attributes:
        num_classes: object classes ``C`` (heatmap channels), >= 1.
        num_landmarks: landmarks per object ``K`` (0: no landmark head).
        num_image_classes: image-level classes ``I`` (0: no image-class head).
        width: channels of the first stage; later stages use 2x, 4x, 6x, 8x.
        head_width: channels of the hidden layer of each head.
    """

    num_classes: int
    num_landmarks: int = 0
    num_image_classes: int = 0
    width: int = 16
    head_width: int = 64

    def __post_init__(self) -> None:
        for name, (low, high) in MODEL_BOUNDS.items():
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise DetloaderValueError(f"{name}={value!r} must be an int >= {low}")
            if value > high:
                raise DetloaderValueError(f"{name}={value!r} exceeds {high}, far beyond any real model (MODEL_BOUNDS)")

    def to_dict(self) -> dict[str, int]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ModelConfig:
        """Inverse of :meth:`to_dict`; a :class:`DetloaderValueError` naming the problem
        (:func:`model_config_problem`) when ``data`` is unfit, before anything is built."""
        problem = model_config_problem(data)
        if problem is not None:
            raise DetloaderValueError(problem)
        return cls(**dict(data))


def _norm(channels: int) -> nn.GroupNorm:
    """GroupNorm, not BatchNorm: the same function in training and evaluation (BatchNorm's
    running statistics lag far behind the weights in a run of a few hundred steps), and
    independent of the per-rank batch size under DDP."""
    return nn.GroupNorm(max(1, min(8, channels // 4)), channels)


def _conv(cin: int, cout: int, stride: int = 1) -> nn.Sequential:
    """3x3 conv + GroupNorm + ReLU."""
    return nn.Sequential(nn.Conv2d(cin, cout, 3, stride, 1, bias=False), _norm(cout), nn.ReLU(inplace=True))


class _Block(nn.Module):
    """A residual stage: a strided 3x3 conv, then a 3x3 + 3x3 residual pair."""

    def __init__(self, cin: int, cout: int) -> None:
        super().__init__()
        self.down = _conv(cin, cout, 2)
        self.body = nn.Sequential(_conv(cout, cout), nn.Conv2d(cout, cout, 3, 1, 1, bias=False), _norm(cout))
        self.act = nn.ReLU(inplace=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.down(x)
        return self.act(x + self.body(x))


class _Backbone(nn.Module):
    """Strides 2 (stem), 4, 8, 16, 32; a top-down path merges them back to stride 4."""

    def __init__(self, width: int) -> None:
        super().__init__()
        c = (width, 2 * width, 4 * width, 6 * width, 8 * width)
        # No normalisation in the stem: its pooled output keeps the image's absolute colour
        # (which GroupNorm removes), a cue of the image class.
        self.stem = nn.Sequential(nn.Conv2d(3, c[0], 3, 2, 1), nn.ReLU(inplace=True))
        self.stages = nn.ModuleList([_Block(c[i], c[i + 1]) for i in range(4)])
        out = c[1]
        self.lateral = nn.ModuleList([nn.Conv2d(ci, out, 1) for ci in c[1:]])
        self.smooth = _conv(out, out)
        self.out_channels = out
        self.pooled_channels = c[0] + c[-1]

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``[B, 3, H, W]`` -> (stride-4 features ``[B, c, H/4, W/4]``, pooled features
        ``[B, pooled_channels]`` of the stem and the deepest stage)."""
        feats = []
        x = self.stem(x)
        stem_pooled = x.mean(dim=(2, 3))
        for stage in self.stages:
            x = stage(x)
            feats.append(x)
        y = self.lateral[-1](feats[-1])
        for lateral, f in zip(reversed(self.lateral[:-1]), reversed(feats[:-1])):
            y = nn.functional.interpolate(y, size=f.shape[-2:], mode="nearest") + lateral(f)
        return self.smooth(y), torch.cat([stem_pooled, feats[-1].mean(dim=(2, 3))], dim=1)


def _head(cin: int, hidden: int, cout: int) -> nn.Sequential:
    return nn.Sequential(nn.Conv2d(cin, hidden, 3, 1, 1), nn.ReLU(inplace=True), nn.Conv2d(hidden, cout, 1))


class CenterNet(nn.Module):
    """Backbone + heads; ``forward(x) -> dict`` of the outputs in the module docstring."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.config = config
        self.backbone = _Backbone(config.width)
        c, hid = self.backbone.out_channels, config.head_width
        self.heatmap = _head(c, hid, config.num_classes)
        self.size = _head(c, hid, 2)
        self.offset = _head(c, hid, 2)
        self.landmarks = _head(c, hid, 2 * config.num_landmarks) if config.num_landmarks else None
        pooled, images = self.backbone.pooled_channels, config.num_image_classes
        self.image_class = nn.Linear(pooled, images) if images else None
        nn.init.constant_(self.heatmap[-1].bias, _HEATMAP_PRIOR_BIAS)

    def forward(self, x: torch.Tensor) -> dict[str, torch.Tensor]:
        if x.shape[-1] % INPUT_MULTIPLE or x.shape[-2] % INPUT_MULTIPLE:
            raise DetloaderValueError(
                f"input size {tuple(x.shape[-2:])} (H, W): both must be multiples of {INPUT_MULTIPLE}"
            )
        feats, pooled = self.backbone(x)
        out = {"heatmap": self.heatmap(feats), "size": self.size(feats), "offset": self.offset(feats)}
        if self.landmarks is not None:
            out["landmarks"] = self.landmarks(feats)
        if self.image_class is not None:
            out["image_logits"] = self.image_class(pooled)
        return out


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
def decode(outputs: dict[str, torch.Tensor], stride: int, top_k: int = 100, min_score: float = 0.01) -> Detections:
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
    return Detections(image_index[keep], boxes[keep], scores[keep], labels[keep], landmarks[keep], image_probs)


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
