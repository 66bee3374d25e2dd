"""The training loop: data -> model -> loss -> optimiser, with checkpoints, exact resume,
the data-wait / compute split of every step, DDP, and a final evaluation.

``train(config) -> metrics`` is the one entry point (the CLI and the demo call it). The
library stays quiet: progress goes to the optional callbacks ``on_step(info)`` (after every
step) and ``on_epoch(info)`` (after every epoch); see :class:`StepInfo` and
:class:`EpochInfo`.

Step time is split at the moment the loop receives a batch: *data wait* is the time spent
in ``next(loader)`` (and the host -> device copy), *compute* the forward, loss, backward and
optimiser step (synchronised on CUDA so that asynchronous kernels are not counted as waiting).
``data_wait_fraction = wait / (wait + compute)``: near 0 the loader keeps up; near 1 the
model starves and ``num_workers`` (see ``detloader tune``) is the lever.
"""

from __future__ import annotations

import json
import math
import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import torch

from detloader.train.checkpoint import load_checkpoint, save_checkpoint
from detloader.train.config import TrainConfig
from detloader.train.distributed import (
    DistEnv, all_gather_objects, barrier, broadcast_object, init_distributed, running_distributed,
)
from detloader.train.evaluate import compute_metrics
from detloader.train.inference import predict, val_loader
from detloader.train.losses import multitask_loss
from detloader.train.model import STRIDE, CenterNet, ModelConfig
from detloader.train.targets import encode_targets

__all__ = ["EpochInfo", "StepInfo", "prepare_data", "train", "train_transform"]


@dataclass(frozen=True)
class StepInfo:
    """What ``on_step`` gets after each optimiser step.

    ``losses``: unweighted loss terms and ``total`` (weighted); ``image_ids``: index rows
    of the batch's images (this rank); ``wait_s`` / ``compute_s``: this step's split."""

    epoch: int
    step_in_epoch: int
    steps_in_epoch: int
    global_step: int
    losses: dict[str, float]
    lr: float
    image_ids: list[int]
    wait_s: float
    compute_s: float
    rank: int


@dataclass(frozen=True)
class EpochInfo:
    """What ``on_epoch`` gets after each epoch (this rank's figures)."""

    epoch: int
    epochs: int
    steps: int
    samples: int
    losses: dict[str, float]
    data_wait_fraction: float
    wait_s: float
    compute_s: float
    rank: int


def train_transform(size: int) -> Any:
    """Training augmentation: horizontal flip (left/right landmarks swapped), colour jitter,
    letterbox to ``size``."""
    from detloader.transforms import ColorJitter, Compose, RandomHorizontalFlip, Resize

    return Compose([RandomHorizontalFlip(), ColorJitter(), Resize(size, mode="letterbox")])


def _synthetic_root(config: TrainConfig, env: DistEnv) -> Path:
    """The synthetic dataset in ``out/synthetic``, written by rank 0 once per parameters."""
    from detloader.synth import make_synthetic

    root = config.out_dir / "synthetic"
    stamp = root / "detloader-synthetic.json"
    params = {"images": config.synthetic_images, "seed": config.synthetic_seed}
    if env.is_main:
        current = json.loads(stamp.read_text()) if stamp.is_file() else None
        if current != params:
            make_synthetic(root, config.synthetic_images, seed=config.synthetic_seed)
            stamp.write_text(json.dumps(params))
    barrier(env)
    return root


def prepare_data(config: TrainConfig, env: DistEnv | None = None) -> tuple[Any, Any]:
    """(train index, val index) of the configured dataset; rank 0 builds the index cache
    first, the other ranks then read it."""
    import detloader

    env = env or init_distributed("cpu")
    root = Path(config.data) if config.data is not None else _synthetic_root(config, env)
    options = dict(config.read_options)
    if env.is_main:
        index = detloader.read_annotations(root, **options)
    barrier(env)
    if not env.is_main:
        index = detloader.read_annotations(root, **options)
    if config.train_split in index.splits and config.val_split in index.splits:
        return index.split(config.train_split), index.split(config.val_split)
    stratify = "image_class" if index.image_classes else None
    parts = index.random_split({"train": 0.8, "val": 0.2}, seed=config.seed, stratify=stratify)
    return parts["train"], parts["val"]


def _train_loader(config: TrainConfig, index: Any, env: DistEnv) -> Any:
    import detloader

    dataset = detloader.DetectionDataset(
        index, train_transform(config.size), seed=config.seed, on_decode_error=config.on_decode_error  # type: ignore[arg-type]
    )
    common = {
        "batch_size": config.batch_size,
        "num_workers": config.num_workers,
        "pin_memory": env.device.type == "cuda",
        "drop_last": True,  # equal, full steps on every rank
        "seed": config.seed,
    }
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "auto" without a tuning result says so; fine here
        if config.balance == "none":
            # A seeded shuffle that is distributed and resumable like the balanced samplers.
            from torch.utils.data import RandomSampler

            shuffle = detloader.DistributedSamplerWrapper(RandomSampler(dataset), seed=config.seed)
            loader = detloader.make_loader(dataset, sampler=shuffle, **common)
        else:
            loader = detloader.make_loader(dataset, balance=config.balance, balance_by=config.balance_by, **common)
    return detloader.ResumableLoader(loader)


def _schedule(config: TrainConfig, total_steps: int) -> Callable[[int], float]:
    warm = min(config.warmup_steps, max(total_steps // 4, 1))

    def factor(step: int) -> float:
        if step < warm:
            return (step + 1) / warm
        t = (step - warm) / max(total_steps - warm, 1)
        return 0.05 + 0.95 * 0.5 * (1 + math.cos(math.pi * min(t, 1.0)))

    return factor


def _amp(config: TrainConfig, device: torch.device) -> torch.dtype | None:
    if not config.amp or device.type != "cuda":
        return None
    return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16


def _unwrap(model: torch.nn.Module) -> torch.nn.Module:
    return model.module if hasattr(model, "module") else model


def train(
    config: TrainConfig,
    *,
    on_step: Callable[[StepInfo], None] | None = None,
    on_epoch: Callable[[EpochInfo], None] | None = None,
) -> dict[str, Any]:
    """Train (or continue ``config.resume``), evaluate, write ``out/metrics.json``,
    ``out/config.json`` and ``out/last.pt``; return the metrics (every rank gets rank 0's).

    The metrics are those of :func:`~detloader.train.evaluate.compute_metrics` plus
    ``data_wait_fraction`` (all steps of this run, rank 0), ``epochs`` (per-epoch history),
    ``samples_per_rank`` (training samples each rank processed in this run), ``world_size``,
    ``device``, ``train_seconds`` and ``stopped_early`` (``max_steps`` reached). Without
    ``config.evaluate`` the box / landmark / image-class figures are left out.
    """
    with running_distributed(config.device) as env:
        return _train(config, env, on_step, on_epoch)


def _train(
    config: TrainConfig,
    env: DistEnv,
    on_step: Callable[[StepInfo], None] | None,
    on_epoch: Callable[[EpochInfo], None] | None,
) -> dict[str, Any]:
    out = config.out_dir
    if env.is_main:
        out.mkdir(parents=True, exist_ok=True)
    train_index, val_index = prepare_data(config, env)
    schema = train_index.landmark_schema
    model_config = ModelConfig(
        num_classes=len(train_index.classes),
        num_landmarks=len(schema),
        num_image_classes=len(train_index.image_classes),
        width=config.width,
    )
    torch.manual_seed(config.seed)
    model = CenterNet(model_config).to(env.device)
    loader = _train_loader(config, train_index, env)
    steps_per_epoch = len(loader)
    if steps_per_epoch == 0:
        raise ValueError(
            f"batch_size={config.batch_size} exceeds the {len(train_index)} training images "
            f"of this rank's share (drop_last): lower batch_size"
        )
    total_steps = steps_per_epoch * config.epochs
    optimizer = torch.optim.AdamW(model.parameters(), lr=config.lr, weight_decay=config.weight_decay)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, _schedule(config, total_steps))
    amp_dtype = _amp(config, env.device)
    scaler = torch.amp.GradScaler("cuda") if amp_dtype is torch.float16 else None
    start_epoch, step, history = 0, 0, []
    if config.resume:
        state = load_checkpoint(config.resume, map_location=env.device)
        if list(state["classes"]) != list(train_index.classes):
            raise ValueError(
                f"resume={config.resume!r}: checkpoint classes {list(state['classes'])} differ from "
                f"the dataset's {list(train_index.classes)}"
            )
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        scheduler.load_state_dict(state["scheduler"])
        if scaler is not None and "scaler" in state:
            scaler.load_state_dict(state["scaler"])
        loader_state = dict(state["loader"])
        loader_state["sampler"] = {**loader_state["sampler"], "rank": env.rank}  # rank 0 saved it
        loader.load_state_dict(loader_state)
        start_epoch, step, history = int(state["epoch"]), int(state["step"]), list(state["history"])
    if env.distributed:
        ddp_kwargs = {"device_ids": [env.device.index]} if env.device.type == "cuda" else {}
        model = torch.nn.parallel.DistributedDataParallel(model, **ddp_kwargs)

    def checkpoint(epoch: int) -> None:
        if not env.is_main:
            return
        state = {
            "model": _unwrap(model).state_dict(),
            "model_config": model_config.to_dict(),
            "optimizer": optimizer.state_dict(),
            "scheduler": scheduler.state_dict(),
            "loader": loader.state_dict(),
            "epoch": epoch,
            "step": step,
            "config": config.to_dict(),
            "classes": list(train_index.classes),
            "image_classes": list(train_index.image_classes),
            "landmark_schema": schema.to_dict(),
            "history": history,
        }
        if scaler is not None:
            state["scaler"] = scaler.state_dict()
        save_checkpoint(out / "last.pt", state)

    if env.is_main:
        config.save(out / "config.json")
    cuda = env.device.type == "cuda"
    run_wait = run_compute = 0.0
    samples_seen = 0
    stopped = False
    began = time.perf_counter()
    model.train()
    for epoch in range(start_epoch, config.epochs):
        loader.set_epoch(epoch)
        first = loader.batches_consumed  # > 0 when resuming mid-epoch
        sums: dict[str, float] = {}
        wait = compute = 0.0
        n_steps = n_samples = 0
        tick = time.perf_counter()
        for batch in loader:
            batch = batch.to(env.device, non_blocking=True)
            x = batch.normalize()
            got = time.perf_counter()
            with torch.autocast(env.device.type, dtype=amp_dtype or torch.bfloat16, enabled=amp_dtype is not None):
                outputs = model(x)
            h, w = outputs["heatmap"].shape[-2:]
            targets = encode_targets(
                boxes=batch.boxes, batch_index=batch.batch_index, labels=batch.labels,
                landmarks=batch.landmarks, visibility=batch.visibility, image_labels=batch.image_labels,
                num_classes=model_config.num_classes, grid=(int(h), int(w)), stride=STRIDE,
            )
            loss, parts = multitask_loss(outputs, targets, config.loss_weights, config.landmark_loss)  # type: ignore[arg-type]
            optimizer.zero_grad(set_to_none=True)
            if scaler is not None:
                scaler.scale(loss).backward()
                scaler.step(optimizer)
                scaler.update()
            else:
                loss.backward()
                optimizer.step()
            scheduler.step()
            if cuda:
                torch.cuda.synchronize(env.device)
            done = time.perf_counter()
            step += 1
            step_wait, step_compute = got - tick, done - got
            wait, compute = wait + step_wait, compute + step_compute
            n_steps += 1
            n_samples += len(batch)
            parts["total"] = float(loss.detach())
            for k, v in parts.items():
                sums[k] = sums.get(k, 0.0) + v
            if on_step is not None:
                on_step(
                    StepInfo(
                        epoch, first + n_steps, steps_per_epoch, step, parts,
                        float(scheduler.get_last_lr()[0]), batch.image_ids.tolist(),
                        step_wait, step_compute, env.rank,
                    )
                )
            if config.checkpoint_every and step % config.checkpoint_every == 0:
                checkpoint(epoch)
            if config.max_steps is not None and step >= config.max_steps:
                stopped = True
                break
            tick = time.perf_counter()
        run_wait, run_compute = run_wait + wait, run_compute + compute
        samples_seen += n_samples
        fraction = wait / max(wait + compute, 1e-12)
        if stopped:
            checkpoint(epoch)
            break
        record = {
            "epoch": epoch,
            "steps": n_steps,
            "samples": n_samples,
            "losses": {k: v / max(n_steps, 1) for k, v in sums.items()},
            "data_wait_fraction": fraction,
            "wait_s": wait,
            "compute_s": compute,
        }
        history.append(record)
        checkpoint(epoch + 1)
        if on_epoch is not None:
            on_epoch(EpochInfo(epoch, config.epochs, n_steps, n_samples, record["losses"], fraction, wait, compute, env.rank))
    train_seconds = time.perf_counter() - began

    metrics: dict[str, Any] = {}
    if config.evaluate and not stopped:
        preds = predict(_unwrap(model), val_loader(val_index, config.size, config.batch_size, env), env.device, amp_dtype=amp_dtype)
        gathered = all_gather_objects(env, preds)
        if env.is_main:
            metrics = compute_metrics(
                val_index, [p for part in gathered for p in part],
                score_threshold=config.score_threshold, backend=config.eval_backend,  # type: ignore[arg-type]
            )
    counts = all_gather_objects(env, samples_seen)
    if env.is_main:
        metrics.update(
            {
                "data_wait_fraction": run_wait / max(run_wait + run_compute, 1e-12),
                "epochs": history,
                "samples_per_rank": counts,
                "world_size": env.world_size,
                "device": str(env.device),
                "num_workers": loader.loader.num_workers,
                "train_seconds": train_seconds,
                "steps": step,
                "stopped_early": stopped,
                "classes": list(train_index.classes),
                "config": config.to_dict(),
            }
        )
        (out / "metrics.json").write_text(json.dumps(metrics, indent=2) + "\n", encoding="utf-8")
    return broadcast_object(env, metrics)
