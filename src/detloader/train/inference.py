"""Running a trained model over a split: predictions in annotation coordinates (any
:class:`~detloader.train.task.Task`'s decode), and the evaluation of a checkpoint on a
dataset (``detloader evaluate``)."""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from typing import Any

import numpy as np
import torch

from detloader.errors import DataMismatchError, DetloaderValueError
from detloader.train.checkpoint import load_checkpoint, load_weights
from detloader.train.distributed import DistEnv, all_gather_objects, running_distributed
from detloader.train.metrics import ImagePredictions, as_predictions, score_predictions
from detloader.train.model import CenterNet, ModelConfig, decode_predictions
from detloader.train.run_data import RunReadOptions, describe_read_changes, recorded_rows, run_read_options
from detloader.train.task import REFERENCE, Task, as_task, centernet_task


@torch.no_grad()
def predict(
    model: torch.nn.Module,
    loader: Any,
    device: torch.device,
    *,
    decode: Callable[[Any, Any], Sequence[Any]] = decode_predictions,
    image_class_map: Sequence[int] | None = None,
    amp_dtype: torch.dtype | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> list[ImagePredictions]:
    """Predictions for every image ``loader`` yields (a loader of :class:`detloader.Batch`):
    ``decode(model(batch.normalize()), batch)``, in annotation coordinates (the reference
    model's decoding unless ``decode`` is a :class:`~detloader.train.task.Task`'s).
    ``image_class_map[i]`` re-orders the model's image classes to the dataset's (None: the
    same order)."""
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
            entries = decode(outputs, batch)
            if len(entries) != len(batch):
                raise DetloaderValueError(
                    f"decode gave {len(entries)} entries for a batch of {len(batch)} images: one per image, in order"
                )
            for image_id, entry in zip(batch.image_ids.tolist(), entries):
                p = as_predictions(entry, image_id)
                if image_class_map is not None and p.image_probs.size:
                    probs = np.asarray([p.image_probs[s] if s >= 0 else 0.0 for s in image_class_map], np.float32)
                    p = replace(p, image_probs=probs)
                out.append(p)
            if progress is not None:
                progress(step + 1, total)
    finally:
        model.train(was_training)
    return out


def evaluate_model(
    model: torch.nn.Module,
    decode: Callable[[Any, Any], Sequence[Any]],
    index: Any,
    size: int,
    env: DistEnv,
    *,
    batch_size: int = 16,
    num_workers: int | str = 0,
    score_threshold: float = 0.3,
    backend: str = "auto",
    image_class_map: Sequence[int] | None = None,
    amp_dtype: torch.dtype | None = None,
    progress: Callable[[int, int], None] | None = None,
    picture: str | os.PathLike[str] | None = None,
    coco_json: str | os.PathLike[str] | None = None,
    frequency: Mapping[str, str | None] | None = None,
    protocol: str = "auto",
) -> dict[str, Any]:
    """:func:`~detloader.train.metrics.score_predictions` of ``model`` on ``index``, letterboxed
    to ``size``: each rank predicts images ``rank, rank + W, ...`` (each image once over all
    ranks, no padding), every rank scores them all; rank 0 writes ``coco_json`` and draws the
    first 8 images, truth (left) beside prediction (right), in ``picture``. ``frequency``: the
    classes' LVIS frequency groups, ``protocol``: ``"auto"``, ``"coco"`` or ``"lvis"``
    (``score_predictions``' own)."""
    import detloader
    from detloader.transforms import Compose, Resize

    dataset = detloader.DetectionDataset(index, Compose([Resize(size, mode="letterbox")]), seed=0)
    loader = detloader.make_loader(
        dataset, batch_size=batch_size, sampler=list(range(env.rank, len(index), env.world_size)),
        num_workers=num_workers, pin_memory=env.device.type == "cuda",
    )
    mine = predict(
        model, loader, env.device, decode=decode, image_class_map=image_class_map, amp_dtype=amp_dtype,
        progress=progress,
    )
    predictions = [p for part in all_gather_objects(env, mine) for p in part]
    metrics = score_predictions(
        predictions, index, score_threshold=score_threshold, backend=backend,  # type: ignore[arg-type]
        coco_json=coco_json if env.is_main else None, frequency=frequency, protocol=protocol,  # type: ignore[arg-type]
    )
    if picture is not None and env.is_main and predictions:
        from detloader.stats.show import show_predictions

        show_predictions(index, predictions, picture, n=8, score_threshold=score_threshold)
    return metrics


def evaluate_checkpoint(
    checkpoint: str | os.PathLike[str],
    data: str | os.PathLike[str],
    *,
    split: str | None = None,
    read_options: Mapping[str, Any] | None = None,
    read_defaults: Mapping[str, Any] | None = None,
    batch_size: int = 16,
    device: str = "auto",
    num_workers: int | str = 0,
    score_threshold: float = 0.3,
    backend: str = "auto",
    progress: Callable[[int, int], None] | None = None,
    picture: str | os.PathLike[str] | None = None,
    coco_json: str | os.PathLike[str] | None = None,
    task: Task | Callable[[Any], Task] | None = None,
    protocol: str = "auto",
) -> dict[str, Any]:
    """Metrics (:func:`~detloader.train.metrics.score_predictions`) of ``checkpoint`` on a
    part of the dataset at ``data``, with ``split`` (``{"name", "images", "source"}``) and
    ``seen_in_training`` (images scored that the checkpoint was trained on).

    ``split``: None (the checkpoint's own validation images, recorded by ``train``; the
    dataset's ``val`` split for a checkpoint without that record), a split name of the
    dataset, or ``"all"``. ``read_options``: :func:`detloader.read_annotations` keywords; the
    run's recorded ones fill in those not given (:func:`~detloader.train.run_data.run_read_options`:
    a run trained with ``images_by="id"`` is evaluated with it), ``read_defaults`` those neither
    gives (``read_annotations``' own otherwise); ``metrics["read_options"]`` says what was read
    with (``options``), which came from the run (``from_run``) and which given ones differ from
    the run's (``changed``: name -> [run's, given]). The dataset is read with the checkpoint's
    class list (``classes=``, unless given), so class ids match the model's; a dataset with none
    of its classes is refused (:class:`~detloader.errors.DataMismatchError`). Image classes
    are matched by name. ``picture``: also draw truth beside prediction there (PNG); ``coco_json``: write
    the detections there (COCO results). ``task``: None rebuilds the reference model from
    the checkpoint; a checkpoint of your own model needs its
    :class:`~detloader.train.task.Task` (or a function of the index returning one), whose
    model the weights load into. ``protocol``: ``"auto"`` (LVIS for LVIS annotations), ``"coco"``
    or ``"lvis"``."""
    import detloader

    with running_distributed(device) as env:
        state = load_checkpoint(checkpoint)
        recorded = {k: v for k, v in state["config"].get("read_options", {}).items() if k != "classes"}
        read = run_read_options(recorded, read_options or {}, read_defaults)  # its classes: the checkpoint's
        index = detloader.read_annotations(data, **{"classes": list(state["classes"]), **read.options})
        _require_known_classes(index, list(state["classes"]), data)
        frequency, frequency_source = _training_frequency(index, state.get("data", {}).get("splits", {}))
        index, info = _part(index, state.get("data", {}).get("splits", {}), split, data, read)
        saved = state.get("task", REFERENCE)
        if task is None and saved != REFERENCE:
            raise DetloaderValueError(
                f"{checkpoint}: holds a {saved}, not the reference model: pass its Task, "
                "evaluate_checkpoint(..., task=...), whose model the weights load into"
            )
        if task is None:
            task = centernet_task(CenterNet(ModelConfig.from_dict(state["model_config"])))
        task = as_task(task, index)
        load_weights(task.model, state["model"], checkpoint)
        task.model.to(env.device)
        trained = list(state["image_classes"])
        metrics = evaluate_model(
            task.model, task.decode, index, int(state["config"]["size"]), env, batch_size=batch_size,
            num_workers=num_workers, score_threshold=score_threshold, backend=backend, progress=progress,
            image_class_map=[trained.index(name) if name in trained else -1 for name in index.image_classes],
            picture=picture, coco_json=coco_json, frequency=frequency, protocol=protocol,
        )
        metrics["frequency_groups"]["source"] = frequency_source
        metrics["checkpoint"] = str(checkpoint)
        metrics["split"] = info
        metrics["read_options"] = {"options": read.options, "from_run": read.from_run, "changed": read.changed}
        metrics["seen_in_training"] = _seen(index, state.get("data", {}).get("splits", {}).get("train"))
        return metrics


def _training_frequency(index: Any, recorded: Mapping[str, Any]) -> tuple[dict[str, str | None], str]:
    """The LVIS frequency groups of the run's classes: the dataset's own (``index.meta["frequency"]``,
    LVIS), else counted on its training images: those the checkpoint records (found in ``index``,
    the whole dataset), else the dataset's ``train`` split, else every image of it; and where they
    come from, in words."""
    from detloader.balance.groups import balance_groups, group_counts
    from detloader.stats.describe import class_frequency, training_frequency

    rec = recorded.get("train")
    if rec is not None and index.meta.get("frequency") is None:
        rows, missing = recorded_rows(index, rec)
        if len(rows):
            groups = class_frequency(index.classes, group_counts(balance_groups(index.subset(rows), "class"), "images"))
            source = f"the checkpoint's training split {rec['name']!r} ({len(rows):,} images"
            return groups, source + (f"; {missing:,} of its images are not in this dataset)" if missing else ")")
    return training_frequency(index)


def _require_known_classes(index: Any, classes: list[str], data: Any) -> None:
    if index.num_objects or not index.problems.counts().get("unknown_class"):
        return
    unknown = (re.search(r"name=(.+?) is not", p.message) for p in index.problems if p.kind == "unknown_class")
    found = sorted({m.group(1) for m in unknown if m})
    raise DataMismatchError(
        f"{data}: its classes ({', '.join(found)}) share none with the checkpoint's {classes}: nothing to evaluate"
    )


def _part(
    index: Any, recorded: Mapping[str, Any], split: str | None, data: Any, read: RunReadOptions
) -> tuple[Any, dict[str, Any]]:
    """The evaluated images and ``{"name", "images", "source"}``."""
    if split == "all":
        return index, {"name": "all", "images": len(index), "source": "every image"}
    if split is None and "val" in recorded:
        rec = recorded["val"]
        rows, missing = recorded_rows(index, rec)
        if not len(rows):
            changed = describe_read_changes(read.changed)
            raise DataMismatchError(
                f"{data}: none of the checkpoint's {rec['images']} validation images (split {rec['name']!r}, "
                f"{rec['source']}) is in this dataset; "
                + (f"read with other options than the run's ({changed}); " if changed else "")
                + "choose images with --split NAME or --split all"
            )
        source = f"the checkpoint's validation split: {rec['source']}"
        source += f"; {missing} of its images are not in this dataset" if missing else ""
        return index.subset(rows), {"name": rec["name"], "images": len(rows), "source": source}
    name = split or "val"
    part, source = index.split(name), index.meta.get("split_sources", {}).get(name, "split file")
    return part, {"name": name, "images": len(part), "source": source}


def _seen(index: Any, train: Mapping[str, Any] | None) -> int | None:
    """How many images of ``index`` the checkpoint was trained on (None: not recorded)."""
    if train is None:
        return None
    trained = set(train["paths"].split("\n"))
    return sum(p in trained for p in index.image_paths())
