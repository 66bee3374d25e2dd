"""Encode a :class:`detloader.Batch` into the dense targets of the centre head.

Each object becomes a Gaussian peak on its class channel of the heatmap at its centre cell
(output stride :data:`~detloader.train.model.STRIDE`), with CenterNet's radius rule (the
radius at which a box shifted by it still overlaps the true box with IoU >= 0.7). At the
peak cell the head regresses the box size, the centre's sub-cell offset and the landmark
offsets from the (integer) centre cell, all in output cells.

Everything runs on the batch's device, vectorised over objects (no Python loop per object).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


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
    """Targets for one batch (the fields of a :class:`detloader.Batch`, on one device).

    Args:
        boxes: float ``[M, 4]`` xyxy pixels of the network input.
        batch_index, labels: int64 ``[M]``.
        landmarks: float ``[M, K, 2]`` pixels; visibility: uint8 ``[M, K]``.
        image_labels: int64 ``[B]``.
        num_classes: heatmap channels ``C``.
        grid: (h, w) of the output grid.
        stride: input pixels per output cell.
    """
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
