"""The training loop: data -> model -> loss -> optimiser, with checkpoints, exact resume,
the data-wait / compute split of every step, DDP and a final evaluation, for any model that
meets the :class:`~detloader.train.task.Task` protocol (the reference CenterNet by default).
:func:`train` is quiet: progress goes to the optional callbacks (:class:`StartInfo`,
:class:`StepInfo`, :class:`EpochInfo`).

*Data wait* is ``next(loader)`` and the host -> device copy, *compute* the rest of the step
(synchronised on CUDA). Why and how a run stops early (signals, a non-finite loss, a dead
loader worker, a lost rank): :mod:`detloader.train.stopping`; docs/training.md, "The loop",
"Stopping", "Non-finite loss".
"""

from __future__ import annotations

import json
import math
import signal
import time
import warnings
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import dataclass, field
from typing import Any

import torch

from detloader._system.files import write_file
from detloader.errors import (
    DataMismatchError,
    DetloaderRuntimeWarning,
    DetloaderValueError,
    NonFiniteLossError,
    RunDirError,
)
from detloader.loader.workers import worker_deaths_held
from detloader.train.checkpoint import (
    apply_settings,
    check_finite_state,
    check_resume_settings,
    describe,
    load_checkpoint,
    load_weights,
    save_checkpoint,
    setting_changes,
)
from detloader.train.config import TrainConfig
from detloader.train.distributed import DistEnv, all_gather_objects, broadcast_object, running_distributed
from detloader.train.inference import evaluate_model
from detloader.train.model import CenterNet, ModelConfig
from detloader.train.run_data import (
    RunData,
    RunLock,
    check_out_dir,
    data_changes,
    describe_read_changes,
    prepare_data,
    read_option_changes,
    train_loader,
)
from detloader.train.stopping import StopRequest, check_loss, rank_lost, worker_died
from detloader.train.task import REFERENCE, EpochInfo, StartInfo, StepInfo, Task, as_task, centernet_task


def _warmup_steps(config: TrainConfig, total_steps: int) -> int:
    """The warm-up steps in effect: ``config.warmup_steps``, at most a quarter of the run."""
    return min(config.warmup_steps, max(total_steps // 4, 1))


def _schedule(config: TrainConfig, total_steps: int) -> Callable[[int], float]:
    warm = _warmup_steps(config, total_steps)

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
    task: Task | Callable[[Any], Task] | None = None,
    on_step: Callable[[StepInfo], None] | None = None,
    on_epoch: Callable[[EpochInfo], None] | None = None,
    on_start: Callable[[StartInfo], None] | None = None,
) -> dict[str, Any]:
    """Train (or continue ``config.resume``), evaluate, write ``out/metrics.json``,
    ``out/config.json``, ``out/last.pt`` (the one it replaces kept as ``previous.pt``) and
    ``out/predictions.png`` (validation images, truth beside prediction); return the metrics
    (every rank gets rank 0's).

    ``task``: None, the reference model (``CenterNet`` built from the training index and
    ``config.width``, ``loss_weights``, ``landmark_loss``); a :class:`~detloader.train.task.Task`;
    or a function of the training index returning one, called after seeding with
    ``config.seed`` (the model starts the same in every run). A resume must train the class
    its checkpoint records (``task``).

    ``out`` is locked for the run and refused when it holds another run, unless
    ``config.resume`` is a checkpoint in it or ``config.exist_ok`` (:class:`RunDirError`); a
    resume on data other than the checkpoint's is refused with what differs
    (:class:`DataMismatchError`) unless ``config.allow_data_change``.

    A loader worker that dies (the out-of-memory killer) stops the run at once with a
    :class:`~detloader.errors.LoaderWorkerError`; nothing is saved after it, so ``last.pt`` stays
    the last checkpoint the run saved. An error a worker raises (an undecodable image) comes as
    itself; every worker is ended first.

    The metrics: :func:`~detloader.train.metrics.compute_metrics`' (without ``config.evaluate``, none of
    them) and the run's figures: the ``metrics.json`` keys of docs/training.md, "Evaluation".
    """
    with running_distributed(config.device) as env, ExitStack() as stack:
        refusal = None
        if env.is_main:
            try:
                stack.enter_context(RunLock(config.out_dir))
                check_out_dir(config.out_dir, resume=config.resume, exist_ok=config.exist_ok)
            except RunDirError as err:
                refusal = str(err)
        refusal = broadcast_object(env, refusal)
        if refusal:
            raise RunDirError(refusal)
        stop = StopRequest(env)
        stack.callback(stop.close)
        try:
            return _train(config, env, task, on_step, on_epoch, on_start, stop)
        except NonFiniteLossError as err:  # the frames hold the DDP model, which holds the process group:
            failed: Exception = err.with_traceback(None)  # let them go before the group is destroyed
        except RuntimeError as err:
            died = worker_died(err, config.out_dir) or rank_lost(err, env, config.out_dir)
            if died is None:
                raise
            failed = died
        raise failed  # outside the except clause: torch's error and the frames it holds are let go


def _batches(loader: Any, stop: StopRequest) -> Any:
    """The loader's batches; after a stop signal, a loader that fails (its workers ended by
    the same signal) just ends: the loop stops there anyway."""
    it = iter(loader)
    while True:
        try:
            yield next(it)
        except StopIteration:
            return
        except Exception:
            if stop.signum:
                return
            raise


@dataclass
class _Run:
    """One run's state, handed between the parts of :func:`_train`: what is built once (model,
    optimiser, loader, ...) and what the steps advance (``step``, ``history``, the time split,
    ``last_good``: the checkpoint a failure message names as the last good one)."""

    config: TrainConfig
    env: DistEnv
    data: RunData
    task: Task
    model: torch.nn.Module
    loader: Any
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LambdaLR
    scaler: torch.amp.GradScaler | None
    amp_dtype: torch.dtype | None
    steps_per_epoch: int
    total_steps: int
    warmup: int
    start_epoch: int = 0
    step: int = 0
    history: list[dict[str, Any]] = field(default_factory=list)
    resumed_with: str = ""
    last_good: str = ""
    stopped: bool = False
    stopped_by: str | None = None
    wait: float = 0.0
    compute: float = 0.0
    samples_seen: int = 0

    def lr(self) -> float:
        return float(self.scheduler.get_last_lr()[0])

    def checkpoint_due(self) -> bool:
        """Whether ``config.checkpoint_every`` saves at this step."""
        every = self.config.checkpoint_every
        return bool(every and self.step % every == 0)

    def checkpoint(self, epoch: int) -> None:
        """Save ``out/last.pt`` at this step (rank 0), ``epoch`` the one to continue with; every
        rank first checks its own copy of the weights (DDP keeps them equal), so all stop
        together on a bad one."""
        out = self.config.out_dir
        weights = {"model": _unwrap(self.model).state_dict(), "optimizer": self.optimizer.state_dict()}
        check_finite_state(weights, f"{out / 'last.pt'} at step {self.step}")
        saved = f"{out / 'last.pt'} (step {self.step}) is the last good checkpoint, unchanged"
        if not self.env.is_main:
            self.last_good = saved  # rank 0 wrote it
            return
        index = self.data.train
        state = {
            "model": weights["model"],
            "model_config": dict(self.task.config),
            "task": self.task.name,
            "optimizer": weights["optimizer"],
            "scheduler": self.scheduler.state_dict(),
            "loader": self.loader.state_dict(),
            "epoch": epoch,
            "step": self.step,
            "config": self.config.to_dict(),
            "classes": list(index.classes),
            "image_classes": list(index.image_classes),
            "landmark_schema": index.landmark_schema.to_dict(),
            "history": self.history,
            "data": self.data.record,
        }
        if self.scaler is not None:
            state["scaler"] = self.scaler.state_dict()
        with worker_deaths_held():  # a worker that dies now stops the run once last.pt is whole
            save_checkpoint(out / "last.pt", state)
            self.last_good = saved


@dataclass
class _EpochTally:
    """One epoch's figures on this rank, as the steps add to them."""

    steps: int = 0
    samples: int = 0
    wait: float = 0.0
    compute: float = 0.0
    sums: dict[str, float] = field(default_factory=dict)

    def add(self, wait: float, compute: float, samples: int, parts: dict[str, float]) -> None:
        self.wait, self.compute = self.wait + wait, self.compute + compute
        self.steps += 1
        self.samples += samples
        for k, v in parts.items():
            self.sums[k] = self.sums.get(k, 0.0) + v

    def fraction(self) -> float:
        """The data-wait share of the epoch's step time."""
        return self.wait / max(self.wait + self.compute, 1e-12)


def _train(
    config: TrainConfig,
    env: DistEnv,
    task: Task | Callable[[Any], Task] | None,
    on_step: Callable[[StepInfo], None] | None,
    on_epoch: Callable[[EpochInfo], None] | None,
    on_start: Callable[[StartInfo], None] | None,
    stop: StopRequest,
) -> dict[str, Any]:
    data = prepare_data(config, env)
    state = load_checkpoint(config.resume, map_location=env.device) if config.resume else None
    settings = setting_changes(state["config"], config, reference=task is None) if state is not None else {}
    check_resume_settings(str(config.resume), settings, config.allow_setting_change)  # before anything is built
    run = _build(config, env, data, task)
    if state is not None:
        _resume(run, state, settings)
    if env.distributed:
        ddp_kwargs = {"device_ids": [env.device.index]} if env.device.type == "cuda" else {}
        run.model = torch.nn.parallel.DistributedDataParallel(run.model, **ddp_kwargs)
    run.last_good = (
        f"nothing was saved in this run: {config.resume} (step {run.step}), the checkpoint it resumed from, "
        "is unchanged"
        if config.resume else "no checkpoint was written yet"
    )
    if env.is_main:
        config.save(config.out_dir / "config.json")
    run.stopped = config.max_steps is not None and run.step >= config.max_steps  # reached before a resume
    if on_start is not None:
        on_start(StartInfo(data.split_info("train"), data.split_info("val"), run.step, run.total_steps, env.rank,
                           run.loader.choice.line))
    began = time.perf_counter()
    run.model.train()
    stop.listen()
    for epoch in range(run.start_epoch, config.epochs):
        if run.stopped:
            break
        _epoch(run, epoch, stop, on_step, on_epoch)
    stop.close()  # signals act as usual again
    return _finish(run, time.perf_counter() - began)


def _build(config: TrainConfig, env: DistEnv, data: RunData, task: Task | Callable[[Any], Task] | None) -> _Run:
    """The run's task (the reference CenterNet when None), built after seeding with
    ``config.seed``, its model on the device, the loader, optimiser, schedule and AMP scaler."""
    index = data.train
    torch.manual_seed(config.seed)
    if task is None:
        shape = ModelConfig(len(index.classes), len(index.landmark_schema), len(index.image_classes), config.width)
        task = centernet_task(CenterNet(shape), config.loss_weights, config.landmark_loss)  # type: ignore[arg-type]
    task = as_task(task, index)
    model = task.model.to(env.device)
    loader = train_loader(config, index, env, data.data_hash)
    steps_per_epoch = len(loader)
    if steps_per_epoch == 0:
        raise DetloaderValueError(
            f"batch_size={config.batch_size} exceeds the {len(index)} training images "
            f"of this rank's share (drop_last): lower batch_size"
        )
    total_steps = steps_per_epoch * config.epochs
    optimizer = torch.optim.AdamW(model.parameters(), lr=config.lr, weight_decay=config.weight_decay)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, _schedule(config, total_steps))
    warmup = _warmup_steps(config, total_steps)
    amp_dtype = _amp(config, env.device)
    scaler = torch.amp.GradScaler("cuda") if amp_dtype is torch.float16 else None
    return _Run(config, env, data, task, model, loader, optimizer, scheduler, scaler, amp_dtype,
                steps_per_epoch, total_steps, warmup)


def _resume(run: _Run, state: dict[str, Any], settings: dict[str, Any]) -> None:
    """Continue from the checkpoint ``state``: refused when it holds another task, other
    classes or (unless ``allow_data_change``) other data; weights, optimiser, schedule, scaler
    and the loader's place restored; changed ``settings`` applied from this step on, said in
    one warning."""
    config, loader = run.config, run.loader
    if state.get("task", REFERENCE) != run.task.name:
        raise DetloaderValueError(
            f"resume={config.resume!r}: the checkpoint holds a {state.get('task', REFERENCE)}, "
            f"this run trains a {run.task.name}"
        )
    read = read_option_changes(state["config"].get("read_options", {}), config.read_options)
    read_note = f" (read with other options than the run's: {describe_read_changes(read)})" if read else ""
    classes = list(run.data.train.classes)
    if list(state["classes"]) != classes:
        raise DetloaderValueError(
            f"resume={config.resume!r}: checkpoint classes {list(state['classes'])} differ from "
            f"the dataset's {classes}{read_note}"
        )
    changes = data_changes(state["data"], run.data.record) if "data" in state else []
    if changes and not config.allow_data_change:
        raise DataMismatchError(
            f"resume={config.resume!r}: the checkpoint was trained on other data: {'; '.join(changes)}"
            f"{read_note}. Resume on its own data, or pass --allow-data-change "
            "(TrainConfig(allow_data_change=True)) to continue on this data knowingly"
        )
    load_weights(run.model, state["model"], config.resume)
    load_weights(run.optimizer, state["optimizer"], config.resume, "optimizer")
    run.scheduler.load_state_dict(state["scheduler"])
    if run.scaler is not None and "scaler" in state:
        run.scaler.load_state_dict(state["scaler"])
    loader_state = dict(state["loader"])
    loader_state["sampler"] = {**loader_state["sampler"], "rank": run.env.rank}  # rank 0 saved it
    loader.load_state_dict(loader_state)
    run.start_epoch, run.step, run.history = int(state["epoch"]), int(state["step"]), list(state["history"])
    if settings:  # applied from this step on, said in one line (resume_settings)
        if "batch_size" in settings:  # the steps left at the new batch size: the schedule ends with the run
            done = loader.batches_consumed if loader.epoch == run.start_epoch else 0
            run.total_steps = run.step + max((config.epochs - run.start_epoch) * run.steps_per_epoch - done, 0)
            run.warmup = _warmup_steps(config, run.total_steps)
        rates = apply_settings(run.optimizer, run.scheduler, config, _schedule(config, run.total_steps), run.step)
        run.resumed_with = describe(settings, run.step, run.total_steps, rates)
        warnings.warn(run.resumed_with, DetloaderRuntimeWarning, stacklevel=4)  # train()'s caller


def _epoch(
    run: _Run,
    epoch: int,
    stop: StopRequest,
    on_step: Callable[[StepInfo], None] | None,
    on_epoch: Callable[[EpochInfo], None] | None,
) -> None:
    """Train one epoch (from where a resume left it), ``run.stopped`` set when a signal or
    ``max_steps`` ends it (saved at that step); a full epoch goes into ``run.history`` and is
    saved to continue with the next."""
    config, loader, env = run.config, run.loader, run.env
    loader.set_epoch(epoch)
    first = loader.batches_consumed  # > 0 when resuming mid-epoch
    tally = _EpochTally()
    tick = time.perf_counter()
    for batch in _batches(loader, stop):
        batch, parts, got, done = _step(run, batch, epoch, first + tally.steps + 1)
        run.step += 1
        tally.add(got - tick, done - got, len(batch), parts)
        if on_step is not None:
            on_step(
                StepInfo(
                    epoch, first + tally.steps, run.steps_per_epoch, run.step, parts, run.lr(),
                    batch.image_ids.tolist(), got - tick, done - got, env.rank,
                )
            )
        if run.checkpoint_due():
            run.checkpoint(epoch)
        signum = stop.agreed()
        if signum or (config.max_steps is not None and run.step >= config.max_steps):
            run.stopped, run.stopped_by = True, signal.Signals(signum).name if signum else None
            break
        tick = time.perf_counter()
    if stop.signum and not run.stopped:  # the loader ended under a signal
        run.stopped, run.stopped_by = True, signal.Signals(stop.signum).name
    run.wait, run.compute = run.wait + tally.wait, run.compute + tally.compute
    run.samples_seen += tally.samples
    if run.stopped:
        if not run.checkpoint_due():  # not saved at it yet
            run.checkpoint(epoch)
        return
    record = {
        "epoch": epoch,
        "steps": tally.steps,
        "samples": tally.samples,
        "losses": {k: v / max(tally.steps, 1) for k, v in tally.sums.items()},
        "data_wait_fraction": tally.fraction(),
        "wait_s": tally.wait,
        "compute_s": tally.compute,
    }
    run.history.append(record)
    run.checkpoint(epoch + 1)
    if on_epoch is not None:
        on_epoch(
            EpochInfo(epoch, config.epochs, tally.steps, tally.samples, record["losses"], tally.fraction(),
                      tally.wait, tally.compute, env.rank)
        )


def _step(run: _Run, batch: Any, epoch: int, step_in_epoch: int) -> tuple[Any, dict[str, float], float, float]:
    """One optimiser step on ``batch`` (checked for a non-finite loss before its backward):
    the batch on the device, the loss terms and ``total`` as floats, and the times its data
    arrived on the device and its compute ended (``time.perf_counter``)."""
    env, amp_dtype = run.env, run.amp_dtype
    batch = batch.to(env.device, non_blocking=True)
    x = batch.normalize()
    got = time.perf_counter()
    with torch.autocast(env.device.type, dtype=amp_dtype or torch.bfloat16, enabled=amp_dtype is not None):
        outputs = run.model(x)
    terms = run.task.loss(outputs, batch)
    loss = run.task.total(terms)
    check_loss(
        terms, loss, env, run.config, amp_dtype is not None, step=run.step + 1, epoch=epoch,
        step_in_epoch=step_in_epoch, steps_per_epoch=run.steps_per_epoch,
        lr=run.lr(), warmup=run.warmup, last_good=run.last_good,
    )
    parts = {k: float(v.detach()) for k, v in terms.items() if k != "total"}
    run.optimizer.zero_grad(set_to_none=True)
    if run.scaler is not None:
        run.scaler.scale(loss).backward()
        run.scaler.step(run.optimizer)
        run.scaler.update()
    else:
        loss.backward()
        run.optimizer.step()
    run.scheduler.step()
    if env.device.type == "cuda":
        torch.cuda.synchronize(env.device)
    done = time.perf_counter()
    parts["total"] = float(loss.detach())
    return batch, parts, got, done


def _finish(run: _Run, train_seconds: float) -> dict[str, Any]:
    """The final evaluation (``config.evaluate``, not after an early stop) and the run's
    figures, written to ``out/metrics.json`` by rank 0; every rank returns rank 0's."""
    config, env, data = run.config, run.env, run.data
    metrics: dict[str, Any] = {}
    if config.evaluate and not run.stopped:
        from detloader.stats.describe import class_frequency  # lazy: the loop needs stats only here

        # APr / APc / APf: the classes' groups by the run's own training images, as detloader evaluate counts them
        per_class = data.train.class_counts("images")
        frequency = data.train.meta.get("frequency") or class_frequency(  # the dataset's own (LVIS) first
            data.train.classes, [per_class[name] for name in data.train.classes])
        metrics = evaluate_model(
            _unwrap(run.model), run.task.decode, data.val, config.size, env, batch_size=config.batch_size,
            score_threshold=config.score_threshold, backend=config.eval_backend, amp_dtype=run.amp_dtype,
            picture=config.out_dir / "predictions.png", frequency=frequency,
        )
        if isinstance(metrics.get("frequency_groups"), dict):
            metrics["frequency_groups"]["source"] = ("the dataset's frequency field" if data.train.meta.get("frequency")
                                                     else f"the run's {len(data.train)} training images")
    counts = all_gather_objects(env, run.samples_seen)
    if env.is_main:
        metrics.update(
            {
                "data_wait_fraction": run.wait / max(run.wait + run.compute, 1e-12),
                "epochs": run.history,
                "samples_per_rank": counts,
                "world_size": env.world_size,
                "device": str(env.device),
                "num_workers": run.loader.loader.num_workers,
                "loader": run.loader.choice.line,
                "train_seconds": train_seconds,
                "steps": run.step,
                "stopped_early": run.stopped,
                "stopped_by": run.stopped_by,
                "split": data.split_info("val"),
                "train_split": data.split_info("train"),
                "classes": list(data.train.classes),
                "config": config.to_dict(),
                **({"resume_changes": run.resumed_with} if run.resumed_with else {}),
            }
        )
        write_file(config.out_dir / "metrics.json", json.dumps(metrics, indent=2) + "\n", durable=True, no_follow=True)
    return broadcast_object(env, metrics)














