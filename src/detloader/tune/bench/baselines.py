"""The baselines a detection loader is compared with, written as tutorials write them:
:class:`TutorialDataset` (one ``ElementTree.parse`` per item, PIL decode and resize, float
tensors, a target dict) and torchvision's ``VOCDetection`` with the same resize and tensors
(:func:`torchvision_voc`). Both need the VOC layout (:func:`voc_layout`).
"""

from __future__ import annotations

import os
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import numpy as np
import torch
from PIL import Image
from torch.utils.data import Dataset


def voc_layout(root: str | os.PathLike[str]) -> bool:
    """Whether ``root`` holds ``Annotations/*.xml`` and ``JPEGImages/`` (what the baselines read)."""
    root = Path(root)
    return (root / "JPEGImages").is_dir() and any((root / "Annotations").glob("*.xml"))


def to_tensor(pic: Image.Image) -> torch.Tensor:
    """torchvision.transforms.functional.to_tensor for an RGB PIL image: float32 [3, H, W] / 255."""
    img = torch.from_numpy(np.array(pic, np.uint8, copy=True))
    img = img.view(pic.size[1], pic.size[0], 3).permute((2, 0, 1)).contiguous()
    return img.to(dtype=torch.float32).div(255)


def _target(boxes: list[list[float]], labels: list[int], sx: float, sy: float) -> dict[str, torch.Tensor]:
    scale = torch.tensor([sx, sy, sx, sy])
    return {
        "boxes": torch.tensor(boxes, dtype=torch.float32).reshape(-1, 4) * scale,
        "labels": torch.tensor(labels, dtype=torch.int64),
    }


def _voc_target(ann: ET.Element, class_to_id: dict[str, int], sx: float, sy: float) -> dict[str, torch.Tensor]:
    boxes, labels = [], []
    for obj in ann.iter("object"):
        bb = obj.find("bndbox")
        boxes.append([float(bb.findtext(k)) for k in ("xmin", "ymin", "xmax", "ymax")])  # type: ignore[union-attr, arg-type]
        labels.append(class_to_id.get(obj.findtext("name") or "", -1))
    return _target(boxes, labels, sx, sy)


def _resized(img: Image.Image, size: int) -> tuple[torch.Tensor, float, float]:
    w, h = img.size
    return to_tensor(img.resize((size, size), Image.BILINEAR)), size / w, size / h


class TutorialDataset(Dataset):  # type: ignore[type-arg]
    """What a detection tutorial writes: XML parsed per item, PIL, float tensors, dicts."""

    def __init__(self, root: str | os.PathLike[str], classes: list[str], size: int) -> None:
        self.root = Path(root)
        self.xml_files = sorted((self.root / "Annotations").glob("*.xml"))
        self.class_to_id = {c: i for i, c in enumerate(classes)}
        self.size = size

    def __len__(self) -> int:
        return len(self.xml_files)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        ann = ET.parse(self.xml_files[i]).getroot()
        img = Image.open(self.root / "JPEGImages" / (ann.findtext("filename") or "")).convert("RGB")
        image, sx, sy = _resized(img, self.size)
        return image, _voc_target(ann, self.class_to_id, sx, sy)


def tutorial_collate(batch: list[Any]) -> tuple[Any, ...]:
    return tuple(zip(*batch))


class _VOCResize:
    """torchvision's ``transforms=`` callable: the same resize and tensors as the tutorial."""

    def __init__(self, classes: list[str], size: int) -> None:
        self.class_to_id = {c: i for i, c in enumerate(classes)}
        self.size = size

    def __call__(self, img: Image.Image, target: dict[str, Any]) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        image, sx, sy = _resized(img, self.size)
        objects = target["annotation"].get("object", [])
        boxes = [[float(o["bndbox"][k]) for k in ("xmin", "ymin", "xmax", "ymax")] for o in objects]
        labels = [self.class_to_id.get(o["name"], -1) for o in objects]
        return image, _target(boxes, labels, sx, sy)


def torchvision_voc(
    root: str | os.PathLike[str], classes: list[str], size: int, workdir: str | os.PathLike[str]
) -> Dataset | None:  # type: ignore[type-arg]
    """torchvision ``VOCDetection`` over ``root`` (VOC layout), or None without torchvision.

    VOCDetection reads ``VOCdevkit/VOC2007/`` with an image-set list: ``workdir`` gets that
    tree as links to ``root``'s folders and a ``train.txt`` naming every annotation file."""
    try:
        from torchvision.datasets import VOCDetection
    except ImportError:
        return None
    root = Path(root).resolve()
    voc = Path(workdir) / "VOCdevkit" / "VOC2007"
    (voc / "ImageSets" / "Main").mkdir(parents=True, exist_ok=True)
    for name in ("Annotations", "JPEGImages"):
        if not (voc / name).exists():
            (voc / name).symlink_to(root / name, target_is_directory=True)
    ids = sorted(p.stem for p in (root / "Annotations").glob("*.xml"))
    (voc / "ImageSets" / "Main" / "train.txt").write_text("".join(f"{i}\n" for i in ids))
    return VOCDetection(str(workdir), year="2007", image_set="train", transforms=_VOCResize(classes, size))
