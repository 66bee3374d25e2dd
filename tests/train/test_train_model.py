"""The reference network, its targets, losses and decoding (tiny tensors, no data)."""

from __future__ import annotations

import pytest
import torch

from detloader.train import CenterNet, LossWeights, ModelConfig
from detloader.train.losses import encode_targets, focal_heatmap_loss, giou_loss, multitask_loss, wing_loss
from detloader.train.model import STRIDE, decode


def _targets(k: int = 2, vis=None):
    boxes = torch.tensor([[8.0, 8.0, 40.0, 48.0], [30.0, 4.0, 60.0, 30.0]])
    lm = torch.tensor([[[16.0, 20.0], [30.0, 20.0]], [[40.0, 10.0], [50.0, 10.0]]])[:, :k]
    vis = torch.full((2, k), 2, dtype=torch.uint8) if vis is None else vis
    return encode_targets(
        boxes=boxes, batch_index=torch.tensor([0, 1]), labels=torch.tensor([0, 1]),
        landmarks=lm, visibility=vis, image_labels=torch.tensor([1, -1]),
        num_classes=2, grid=(16, 16), stride=STRIDE,
    )


def test_outputs_and_switched_off_heads():
    x = torch.randn(2, 3, 64, 64)
    full = CenterNet(ModelConfig(num_classes=3, num_landmarks=5, num_image_classes=4, width=4, head_width=8))(x)
    assert full["heatmap"].shape == (2, 3, 16, 16)
    assert full["size"].shape == full["offset"].shape == (2, 2, 16, 16)
    assert full["landmarks"].shape == (2, 10, 16, 16)
    assert full["image_logits"].shape == (2, 4)
    bare = CenterNet(ModelConfig(num_classes=1, width=4, head_width=8))
    out = bare(x)
    assert set(out) == {"heatmap", "size", "offset"}
    assert bare.landmarks is None and bare.image_class is None


def test_bad_arguments_name_the_value():
    with pytest.raises(ValueError, match="num_classes=0"):
        ModelConfig(num_classes=0)
    with pytest.raises(ValueError, match=r"multiples of 32"):
        CenterNet(ModelConfig(num_classes=1, width=4))(torch.zeros(1, 3, 48, 64))


def test_targets_peak_at_centres_and_mask_absent_landmarks():
    vis = torch.tensor([[2, 0], [1, 2]], dtype=torch.uint8)
    t = _targets(vis=vis)
    # object 0: centre (24, 28) px -> cell (6, 7); class 0 of image 0
    assert t.heatmap[0, 0, 7, 6] == 1.0
    assert t.heatmap[1, 1].max() == 1.0 and t.heatmap[0, 1].max() == 0.0
    assert torch.equal(t.cell, torch.tensor([7 * 16 + 6, 4 * 16 + 11]))
    assert torch.allclose(t.size[0], torch.tensor([8.0, 10.0]))
    assert t.landmark_mask.tolist() == [[True, False], [True, True]]
    assert torch.allclose(t.landmarks[0, 0], torch.tensor([16 / 4 - 6, 20 / 4 - 7]))


def test_absent_landmarks_never_train():
    model = CenterNet(ModelConfig(num_classes=2, num_landmarks=2, num_image_classes=2, width=4, head_width=8))
    out = model(torch.randn(2, 3, 64, 64))
    vis = torch.tensor([[2, 0], [2, 2]], dtype=torch.uint8)
    a = _targets(vis=vis)
    moved = a.landmarks.clone()
    moved[0, 1] += 100.0  # an absent point anywhere: same loss
    b = type(a)(**{**a.__dict__, "landmarks": moved})
    for kind in ("l1", "wing"):
        pa = multitask_loss(out, a, LossWeights(), kind)
        pb = multitask_loss(out, b, LossWeights(), kind)
        assert float(pa["landmarks"].detach()) == pytest.approx(float(pb["landmarks"].detach()))
    assert set(pa) == {"heatmap", "size", "offset", "giou", "landmarks", "image_class"}


def test_loss_terms_behave():
    target = torch.zeros(1, 1, 8, 8)
    target[0, 0, 3, 3] = 1.0
    perfect = torch.where(target == 1, torch.tensor(20.0), torch.tensor(-20.0))
    assert focal_heatmap_loss(perfect, target) < 1e-6
    assert focal_heatmap_loss(torch.zeros(1, 1, 8, 8), target) > 0.1
    box = torch.tensor([[0.0, 0.0, 4.0, 4.0]])
    assert giou_loss(box, box).item() == pytest.approx(0.0, abs=1e-6)
    assert giou_loss(box, box + 10).item() > 1.0
    d = torch.tensor([0.0, 0.5, 3.0])
    w = wing_loss(d)
    assert w[0] == 0 and w[1] < w[2]
    with pytest.raises(ValueError, match="landmark_loss='l2'"):
        multitask_loss({"heatmap": target, "size": torch.zeros(1, 2, 8, 8), "offset": torch.zeros(1, 2, 8, 8)},
                       _targets(), LossWeights(), "l2")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="size=-1"):
        LossWeights(size=-1)


def test_decode_inverts_the_targets():
    t = _targets()
    logits = torch.where(t.heatmap == 1, torch.tensor(10.0), torch.tensor(-10.0))
    size = torch.zeros(2, 2, 16, 16)
    offset = torch.zeros(2, 2, 16, 16)
    lms = torch.zeros(2, 4, 16, 16)
    for m in range(2):
        b, cell = int(t.batch_index[m]), int(t.cell[m])
        size[b, :, cell // 16, cell % 16] = t.size[m]
        offset[b, :, cell // 16, cell % 16] = t.offset[m]
        lms[b, :, cell // 16, cell % 16] = t.landmarks[m].reshape(-1)
    det = decode({"heatmap": logits, "size": size, "offset": offset, "landmarks": lms}, STRIDE, min_score=0.5)
    assert det.image_index.tolist() == [0, 1] and det.labels.tolist() == [0, 1]
    assert torch.allclose(det.boxes, torch.tensor([[8.0, 8.0, 40.0, 48.0], [30.0, 4.0, 60.0, 30.0]]), atol=1e-4)
    assert torch.allclose(det.landmarks[0], torch.tensor([[16.0, 20.0], [30.0, 20.0]]), atol=1e-4)
    assert det.image_probs.shape == (2, 0)
