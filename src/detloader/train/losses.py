"""The reference model's loss: a batch's dense targets, then focal heatmap, L1 size / offset,
GIoU box, landmarks and image class (docs/training.md, "Losses").

Each term is a mean over what it is defined on; a term with nothing to average is an exact zero
that still touches its head's outputs (DDP needs a gradient, even 0, for every parameter).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any, Literal

import torch
import torch.nn.functional as F

from detloader.errors import DetloaderValueError


@dataclass(frozen=True)
class Targets:
    """Dense and per-object targets for a batch of ``B`` images and ``M`` objects.

    Attributes:
        heatmap: float32 ``[B, C, h, w]`` in 0..1, exactly 1 at object centres.
        batch_index: int64 ``[M]`` image of each object.
        cell: int64 ``[M]`` flat index ``y * w + x`` of each object's centre cell.
        valid: bool ``[M]``: the centre lies on the grid and the box has a positive size
            (only these train the regression heads).
        size: float32 ``[M, 2]`` box width, height in cells.
        offset: float32 ``[M, 2]`` centre minus its integer cell, in ``[0, 1)``.
        box: float32 ``[M, 4]`` the box in cells (xyxy), for the GIoU term.
        landmarks: float32 ``[M, K, 2]`` landmark minus the integer centre cell, in cells.
        landmark_mask: bool ``[M, K]``: visibility > 0 (absent points never train).
        image_labels: int64 ``[B]`` (``MISSING`` = no label).
    """

    heatmap: torch.Tensor
    batch_index: torch.Tensor
    cell: torch.Tensor
    valid: torch.Tensor
    size: torch.Tensor
    offset: torch.Tensor
    box: torch.Tensor
    landmarks: torch.Tensor
    landmark_mask: torch.Tensor
    image_labels: torch.Tensor


def gaussian_radius(height: torch.Tensor, width: torch.Tensor, min_overlap: float = 0.7) -> torch.Tensor:
    """CenterNet's radius (cells) for boxes of ``height`` x ``width`` cells: the smallest of
    the three corner-shift cases that keep IoU >= ``min_overlap``; float ``[M]``."""
    h, w = height, width
    b1 = h + w
    c1 = w * h * (1 - min_overlap) / (1 + min_overlap)
    r1 = (b1 + torch.sqrt(b1**2 - 4 * c1)) / 2
    b2 = 2 * (h + w)
    c2 = (1 - min_overlap) * w * h
    r2 = (b2 + torch.sqrt(b2**2 - 16 * c2)) / 2
    a3 = 4 * min_overlap
    b3 = -2 * min_overlap * (h + w)
    c3 = (min_overlap - 1) * w * h
    r3 = (b3 + torch.sqrt(b3**2 - 4 * a3 * c3)) / 2
    return torch.minimum(torch.minimum(r1, r2), r3)


def encode_targets(
    *,
    boxes: torch.Tensor,
    batch_index: torch.Tensor,
    labels: torch.Tensor,
    landmarks: torch.Tensor,
    visibility: torch.Tensor,
    image_labels: torch.Tensor,
    num_classes: int,
    grid: tuple[int, int],
    stride: int,
) -> Targets:
    """Targets for one batch: the fields of a :class:`detloader.Batch` on one device (boxes
    in pixels of the network input), ``num_classes`` heatmap channels on a ``grid`` (h, w) of
    ``stride`` input pixels per cell."""
    dev = boxes.device
    b = int(image_labels.shape[0])
    gh, gw = grid
    cells_box = boxes.float() / stride
    cx = (cells_box[:, 0] + cells_box[:, 2]) / 2
    cy = (cells_box[:, 1] + cells_box[:, 3]) / 2
    bw = (cells_box[:, 2] - cells_box[:, 0]).clamp(min=0)
    bh = (cells_box[:, 3] - cells_box[:, 1]).clamp(min=0)
    ix = cx.floor().long()
    iy = cy.floor().long()
    valid = (ix >= 0) & (ix < gw) & (iy >= 0) & (iy < gh) & (bw > 0) & (bh > 0) & (labels >= 0) & (labels < num_classes)
    ix = ix.clamp(0, gw - 1)
    iy = iy.clamp(0, gh - 1)

    heat = torch.zeros(b * num_classes, gh * gw, device=dev)
    if bool(valid.any()):
        v = valid.nonzero().squeeze(1)
        radius = gaussian_radius(bh[v], bw[v]).floor().clamp(min=0)
        sigma = ((2 * radius + 1) / 6).view(-1, 1, 1)
        ys = torch.arange(gh, device=dev, dtype=torch.float32).view(1, gh, 1)
        xs = torch.arange(gw, device=dev, dtype=torch.float32).view(1, 1, gw)
        dx = xs - ix[v].float().view(-1, 1, 1)
        dy = ys - iy[v].float().view(-1, 1, 1)
        g = torch.exp(-(dx**2 + dy**2) / (2 * sigma**2))
        r = radius.view(-1, 1, 1)
        g = torch.where((dx.abs() <= r) & (dy.abs() <= r), g, torch.zeros_like(g))
        rows = (batch_index[v] * num_classes + labels[v]).view(-1, 1).expand(-1, gh * gw)
        heat.scatter_reduce_(0, rows, g.view(len(v), -1), reduce="amax", include_self=True)
    heatmap = heat.view(b, num_classes, gh, gw)

    centre_cell = torch.stack([ix, iy], dim=1).float()
    lm_cells = landmarks.float() / stride - centre_cell.unsqueeze(1)
    return Targets(
        heatmap=heatmap,
        batch_index=batch_index,
        cell=iy * gw + ix,
        valid=valid,
        size=torch.stack([bw, bh], dim=1),
        offset=torch.stack([cx, cy], dim=1) - centre_cell,
        box=cells_box,
        landmarks=lm_cells,
        landmark_mask=(visibility > 0) & valid.unsqueeze(1),
        image_labels=image_labels,
    )


LandmarkLoss = Literal["l1", "wing"]
LANDMARK_LOSSES: tuple[str, ...] = ("l1", "wing")


@dataclass(frozen=True)
class LossWeights:
    """Weights of the loss terms (see the module docstring for what each averages over)."""

    heatmap: float = 1.0
    size: float = 0.1
    offset: float = 1.0
    giou: float = 1.0
    landmarks: float = 1.0
    image_class: float = 1.0

    def __post_init__(self) -> None:
        for name, value in asdict(self).items():
            if not isinstance(value, (int, float)) or value < 0:
                raise DetloaderValueError(f"loss weight {name}={value!r} must be a number >= 0")

    def to_dict(self) -> dict[str, float]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> LossWeights:
        return cls(**{k: float(v) for k, v in data.items()})


def focal_heatmap_loss(
    logits: torch.Tensor, target: torch.Tensor, alpha: float = 2.0, beta: float = 4.0
) -> torch.Tensor:
    """CenterNet's penalty-reduced focal loss, summed and divided by the number of peaks.

    ``logits`` and ``target`` ``[B, C, h, w]``; ``target`` is 1 at centres, a Gaussian around
    them. Computed from logits (log-sigmoid) for stability."""
    logits = logits.float()
    p = logits.sigmoid()
    log_p = F.logsigmoid(logits)
    log_1mp = F.logsigmoid(-logits)
    pos = target.eq(1).float()
    pos_loss = (1 - p) ** alpha * log_p * pos
    neg_loss = (1 - target) ** beta * p**alpha * log_1mp * (1 - pos)
    num_pos = pos.sum().clamp(min=1)
    return -(pos_loss.sum() + neg_loss.sum()) / num_pos


def wing_loss(diff: torch.Tensor, width: float = 1.0, curvature: float = 0.25) -> torch.Tensor:
    """Wing loss (Feng et al. 2018) of the elementwise errors ``diff`` (cells):
    ``width * ln(1 + |x| / curvature)`` below ``width``, ``|x| - C`` above (continuous)."""
    x = diff.abs()
    c = width - width * torch.log1p(torch.tensor(width / curvature, device=diff.device))
    return torch.where(x < width, width * torch.log1p(x / curvature), x - c)


def giou_loss(pred: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """``1 - GIoU`` per box, for xyxy boxes ``[N, 4]`` -> ``[N]``."""
    area_p = (pred[:, 2] - pred[:, 0]).clamp(min=0) * (pred[:, 3] - pred[:, 1]).clamp(min=0)
    area_t = (target[:, 2] - target[:, 0]).clamp(min=0) * (target[:, 3] - target[:, 1]).clamp(min=0)
    lt = torch.maximum(pred[:, :2], target[:, :2])
    rb = torch.minimum(pred[:, 2:], target[:, 2:])
    inter = (rb - lt).clamp(min=0).prod(dim=1)
    union = area_p + area_t - inter
    iou = inter / union.clamp(min=1e-6)
    hull = (
        (torch.maximum(pred[:, 2:], target[:, 2:]) - torch.minimum(pred[:, :2], target[:, :2])).clamp(min=0).prod(dim=1)
    )
    return 1 - (iou - (hull - union) / hull.clamp(min=1e-6))


def _gather(dense: torch.Tensor, batch_index: torch.Tensor, cell: torch.Tensor) -> torch.Tensor:
    """``dense`` ``[B, D, h, w]`` at (batch_index, cell) -> ``[M, D]``."""
    b, d = dense.shape[:2]
    flat = dense.reshape(b, d, -1)
    return flat[batch_index, :, cell].float()


def _masked_mean(values: torch.Tensor, mask: torch.Tensor, touch: torch.Tensor) -> torch.Tensor:
    if bool(mask.any()):
        return values[mask].mean()
    return touch.sum() * 0.0


def multitask_loss(
    outputs: Mapping[str, torch.Tensor], targets: Targets, weights: LossWeights, landmark_loss: LandmarkLoss = "l1"
) -> dict[str, torch.Tensor]:
    """Each unweighted term, a scalar tensor; the loss is ``sum(weights.<name> * term)``
    (:meth:`detloader.train.task.Task.total`).

    ``outputs`` as :class:`~detloader.train.model.CenterNet` returns them; terms of heads the
    model does not have are left out, and so is ``giou`` when its weight is 0."""
    if landmark_loss not in LANDMARK_LOSSES:
        raise DetloaderValueError(f"landmark_loss={landmark_loss!r} is not one of {LANDMARK_LOSSES}")
    parts: dict[str, torch.Tensor] = {}
    parts["heatmap"] = focal_heatmap_loss(outputs["heatmap"], targets.heatmap)
    v = targets.valid
    bi, cell = targets.batch_index, targets.cell
    size = _gather(outputs["size"], bi, cell)
    offset = _gather(outputs["offset"], bi, cell)
    parts["size"] = _masked_mean((size - targets.size).abs(), v.unsqueeze(1).expand_as(size), outputs["size"])
    parts["offset"] = _masked_mean((offset - targets.offset).abs(), v.unsqueeze(1).expand_as(offset), outputs["offset"])
    if weights.giou > 0:
        w = outputs["size"].shape[-1]
        centre = torch.stack([cell % w, cell // w], dim=1).float() + offset
        half = size.clamp(min=0) / 2
        pred_box = torch.cat([centre - half, centre + half], dim=1)
        parts["giou"] = _masked_mean(giou_loss(pred_box, targets.box), v, outputs["size"])
    if "landmarks" in outputs:
        k = targets.landmarks.shape[1]
        lm = _gather(outputs["landmarks"], bi, cell).view(-1, k, 2)
        diff = lm - targets.landmarks
        err = diff.abs() if landmark_loss == "l1" else wing_loss(diff)
        mask = targets.landmark_mask.unsqueeze(-1).expand_as(err)
        parts["landmarks"] = _masked_mean(err, mask, outputs["landmarks"])
    if "image_logits" in outputs:
        logits = outputs["image_logits"].float()
        labelled = targets.image_labels >= 0
        if bool(labelled.any()):
            parts["image_class"] = F.cross_entropy(logits[labelled], targets.image_labels[labelled])
        else:
            parts["image_class"] = logits.sum() * 0.0
    return parts
