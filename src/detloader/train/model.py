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
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

import torch
from torch import nn

from detloader.errors import DetloaderValueError

#: Output stride of the dense head (pixels of the input per output cell).
STRIDE = 4
#: Input height and width must be multiples of this (the deepest stage has stride 32).
INPUT_MULTIPLE = 32
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
        for name, low in (
            ("num_classes", 1),
            ("num_landmarks", 0),
            ("num_image_classes", 0),
            ("width", 4),
            ("head_width", 4),
        ):
            value = getattr(self, name)
            if not isinstance(value, int) or value < low:
                raise DetloaderValueError(f"{name}={value!r} must be an int >= {low}")

    def to_dict(self) -> dict[str, int]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ModelConfig:
        return cls(**{k: int(v) for k, v in data.items()})


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
        self.body = nn.Sequential(
            _conv(cout, cout),
            nn.Conv2d(cout, cout, 3, 1, 1, bias=False),
            _norm(cout),
        )
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
        self.image_class = (
            nn.Linear(self.backbone.pooled_channels, config.num_image_classes)
            if config.num_image_classes
            else None
        )
        nn.init.constant_(self.heatmap[-1].bias, _HEATMAP_PRIOR_BIAS)

    def forward(self, x: torch.Tensor) -> dict[str, torch.Tensor]:
        if x.shape[-1] % INPUT_MULTIPLE or x.shape[-2] % INPUT_MULTIPLE:
            raise DetloaderValueError(
                f"input size {tuple(x.shape[-2:])} (H, W): both must be multiples of {INPUT_MULTIPLE}"
            )
        feats, pooled = self.backbone(x)
        out = {
            "heatmap": self.heatmap(feats),
            "size": self.size(feats),
            "offset": self.offset(feats),
        }
        if self.landmarks is not None:
            out["landmarks"] = self.landmarks(feats)
        if self.image_class is not None:
            out["image_logits"] = self.image_class(pooled)
        return out
