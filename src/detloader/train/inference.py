"""Running a trained model over a split: predictions in annotation coordinates, and the
evaluation of a checkpoint on a dataset (``detloader evaluate``)."""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import numpy as np
import torch

from detloader.train.checkpoint import load_checkpoint
from detloader.train.decode import decode
from detloader.train.distributed import DistEnv, all_gather_objects, running_distributed
from detloader.train.evaluate import ImagePredictions, compute_metrics
from detloader.train.model import STRIDE, CenterNet, ModelConfig
from detloader.train.runs import DataMismatchError, recorded_rows

__all__ = ["draw_predictions", "eval_transform", "evaluate_checkpoint", "predict", "val_loader"]


def eval_transform(size: int) -> Any:
    """The evaluation transform: letterbox to ``size`` (no augmentation)."""
    from detloader.transforms import Compose, Resize

    return Compose([Resize(size, mode="letterbox")])


def val_loader(index: Any, size: int, batch_size: int, env: DistEnv, num_workers: int | str = 0) -> Any:
    """A loader over this rank's share of ``index``: images ``rank, rank + W, ...`` in order,
    each exactly once over all ranks (no padding, so no image is counted twice)."""
    import detloader

    dataset = detloader.DetectionDataset(index, eval_transform(size), seed=0)
    indices = list(range(env.rank, len(index), env.world_size))
    return detloader.make_loader(
        dataset,
        batch_size=batch_size,
        sampler=indices,
        num_workers=num_workers,
        pin_memory=env.device.type == "cuda",
    )


@torch.no_grad()
def predict(
    model: torch.nn.Module,
    loader: Any,
    device: torch.device,
    *,
    image_class_map: Sequence[int] | None = None,
    amp_dtype: torch.dtype | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> list[ImagePredictions]:
    """Predictions for every image ``loader`` yields (a loader of :class:`detloader.Batch`),
    mapped back to annotation coordinates. ``image_class_map[i]`` re-orders the model's image
    classes to the dataset's (None: the same order)."""
    was_training = model.training
    model.eval()
    out: list[ImagePredictions] = []
    total = len(loader)
    try:
        for step, batch in enumerate(loader):
            batch = batch.to(device, non_blocking=True)
            x = batch.normalize()
            with torch.autocast(device.type, dtype=amp_dtype or torch.bfloat16, enabled=amp_dtype is not None):
                outputs = model(x)
            det = decode(outputs, STRIDE)
            boxes = batch.boxes_to_original(det.boxes, det.image_index).cpu().numpy()
            lms = batch.landmarks_to_original(det.landmarks, det.image_index).cpu().numpy() if det.landmarks.shape[1] else det.landmarks.cpu().numpy()
            scores, labels = det.scores.cpu().numpy(), det.labels.cpu().numpy()
            which = det.image_index.cpu().numpy()
            probs = det.image_probs.cpu().numpy()
            if image_class_map is not None and probs.shape[1]:
                mapped = np.zeros((probs.shape[0], len(image_class_map)), dtype=probs.dtype)
                for target, source in enumerate(image_class_map):
                    if source >= 0:
                        mapped[:, target] = probs[:, source]
                probs = mapped
            for b, image_id in enumerate(batch.image_ids.tolist()):
                sel = which == b
                out.append(
                    ImagePredictions(int(image_id), boxes[sel], scores[sel], labels[sel].astype(np.int64), lms[sel], probs[b])
                )
            if progress is not None:
                progress(step + 1, total)
    finally:
        model.train(was_training)
    return out


def draw_predictions(index: Any, predictions: Sequence[ImagePredictions], path: Path, score_threshold: float) -> Path | None:
    """``path``: the first 8 predicted images, truth (left) beside prediction (right); None
    when there is nothing to draw."""
    if not predictions:
        return None
    from detloader.show import show_predictions

    return show_predictions(index, predictions, path, n=8, score_threshold=score_threshold).path


def evaluate_checkpoint(
    checkpoint: str | os.PathLike[str],
    data: str | os.PathLike[str],
    *,
    split: str | None = None,
    read_options: Mapping[str, Any] | None = None,
    batch_size: int = 16,
    device: str = "auto",
    num_workers: int | str = 0,
    score_threshold: float = 0.3,
    backend: str = "auto",
    progress: Callable[[int, int], None] | None = None,
    picture: str | os.PathLike[str] | None = None,
) -> dict[str, Any]:
    """Metrics (:func:`~detloader.train.evaluate.compute_metrics`) of ``checkpoint`` on a
    part of the dataset at ``data``, with ``split`` (``{"name", "images", "source"}``) and
    ``seen_in_training`` (images scored that the checkpoint was trained on).

    ``split``: None (the checkpoint's own validation images, recorded by ``train``; the
    dataset's ``val`` split for a checkpoint without that record), a split name of the
    dataset, or ``"all"``. The dataset is read with the checkpoint's class list
    (``classes=``), so class ids match the model's; a dataset with none of its classes is
    refused (:class:`~detloader.train.runs.DataMismatchError`). Image classes are matched by
    name. ``picture``: also draw truth beside prediction there (PNG)."""
    import detloader

    with running_distributed(device) as env:
        state = load_checkpoint(checkpoint)
        options = dict(read_options or {})
        options.setdefault("classes", list(state["classes"]))
        index = detloader.read_annotations(data, **options)
        _require_known_classes(index, list(state["classes"]), data)
        index, info = _part(index, state.get("data", {}).get("splits", {}), split, data)
        model = CenterNet(ModelConfig.from_dict(state["model_config"]))
        model.load_state_dict(state["model"])
        model.to(env.device)
        size = int(state["config"]["size"])
        trained = list(state["image_classes"])
        mapping = [trained.index(name) if name in trained else -1 for name in index.image_classes]
        loader = val_loader(index, size, batch_size, env, num_workers)
        preds = predict(model, loader, env.device, image_class_map=mapping, progress=progress)
        gathered = [p for part in all_gather_objects(env, preds) for p in part]
        metrics = compute_metrics(index, gathered, score_threshold=score_threshold, backend=backend)  # type: ignore[arg-type]
        metrics["checkpoint"] = str(checkpoint)
        metrics["split"] = info
        metrics["seen_in_training"] = _seen(index, state.get("data", {}).get("splits", {}).get("train"))
        if picture is not None and env.is_main:
            draw_predictions(index, gathered, Path(picture), score_threshold)
        return metrics


def _require_known_classes(index: Any, classes: list[str], data: Any) -> None:
    if index.num_objects or not index.problems.counts().get("unknown_class"):
        return
    found = sorted({m.group(1) for p in index.problems if p.kind == "unknown_class" and (m := re.search(r"name=(.+?) is not", p.message))})
    raise DataMismatchError(
        f"{data}: its classes ({', '.join(found)}) share none with the checkpoint's {classes}: nothing to evaluate"
    )


def _part(index: Any, recorded: Mapping[str, Any], split: str | None, data: Any) -> tuple[Any, dict[str, Any]]:
    """The evaluated images and ``{"name", "images", "source"}``."""
    if split == "all":
        return index, {"name": "all", "images": len(index), "source": "every image"}
    if split is None and "val" in recorded:
        rec = recorded["val"]
        rows, missing = recorded_rows(index, rec)
        if not len(rows):
            raise DataMismatchError(
                f"{data}: none of the checkpoint's {rec['images']} validation images (split {rec['name']!r}, "
                f"{rec['source']}) is in this dataset; choose images with --split NAME or --split all"
            )
        source = f"the checkpoint's validation split: {rec['source']}"
        source += f"; {missing} of its images are not in this dataset" if missing else ""
        return index.subset(rows), {"name": rec["name"], "images": len(rows), "source": source}
    name = split or "val"
    part = index.split(name)
    return part, {"name": name, "images": len(part), "source": index.meta.get("split_sources", {}).get(name, "split file")}


def _seen(index: Any, train: Mapping[str, Any] | None) -> int | None:
    """How many images of ``index`` the checkpoint was trained on (None: not recorded)."""
    if train is None:
        return None
    trained = set(train["paths"].split("\n"))
    return sum(index.relative_image_path(i) in trained for i in range(len(index)))
