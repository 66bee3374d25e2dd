"""Why a run stops before its last step, agreed on by every rank: a stop signal (SIGTERM, SIGINT)
noted and obeyed after the step in progress (:class:`StopRequest`), or a loss term that went NaN
or infinite (:func:`check_loss`, before the backward pass). docs/training.md, "Stopping" and
"Non-finite loss". A loader worker that died (:func:`worker_died`) or another rank that ended
(:func:`rank_lost`) stops the run at once, with one named error.
"""

from __future__ import annotations

import math
import signal
import threading
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from detloader.errors import LoaderWorkerError, NonFiniteLossError, RankLostError
from detloader.loader.workers import loader_worker_error
from detloader.train.config import TrainConfig
from detloader.train.distributed import DistEnv, all_gather_objects


class StopRequest:
    """SIGTERM and SIGINT noted from :meth:`listen` to :meth:`close` instead of obeyed at
    once (the loop stops after its step)."""

    SIGNALS = (signal.SIGTERM, signal.SIGINT)

    def __init__(self, env: DistEnv) -> None:
        self.env = env
        self.signum = 0
        self._previous: dict[int, Any] = {}

    def listen(self) -> None:
        if threading.current_thread() is threading.main_thread():
            self._previous = {s: signal.signal(s, self._note) for s in self.SIGNALS}

    def _note(self, signum: int, frame: Any) -> None:
        if self.signum == signal.SIGINT and signum == signal.SIGINT:
            raise KeyboardInterrupt  # a second Ctrl-C: now
        self.signum = signum

    def close(self) -> None:
        for s, handler in self._previous.items():
            signal.signal(s, handler)
        self._previous = {}

    def agreed(self) -> int:
        """The signal to stop for, the same on every rank (0: go on)."""
        if not self.env.distributed:
            return self.signum
        flag = torch.tensor([self.signum], device=self.env.device)
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        return int(flag.item())


def _non_finite_terms(terms: Any, loss: torch.Tensor) -> dict[str, float]:
    """The loss terms (and ``total``) that hold a NaN or an infinity, with their values."""
    named = {k: v for k, v in terms.items() if k != "total"}
    named["total"] = loss
    values = {k: float(torch.as_tensor(v).detach().float().sum()) for k, v in named.items()}
    return {k: v for k, v in values.items() if not math.isfinite(v)}


def check_loss(
    terms: Any,
    loss: torch.Tensor,
    env: DistEnv,
    config: TrainConfig,
    amp: bool,
    *,
    step: int,
    epoch: int,
    step_in_epoch: int,
    steps_per_epoch: int,
    lr: float,
    warmup: int,
    last_good: str,
) -> None:
    """:class:`NonFiniteLossError` on every rank when a loss term went NaN or infinite on any
    rank at this step (before its backward: DDP would spread a NaN gradient to every rank's
    weights). The loss is per rank, so under DDP the ranks agree with one all-reduce of a flag
    a step (and gather the terms only when it is set). ``last_good``: the checkpoint that
    stays good, as the message names it; ``warmup``: the warm-up steps in effect."""
    bad = _non_finite_terms(terms, loss)
    if env.distributed:
        flag = torch.tensor([1 if bad else 0], device=env.device)
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        if not int(flag.item()):
            return
        per_rank = all_gather_objects(env, bad)
        bad = {f"rank {r}: {k}": v for r, got in enumerate(per_rank) for k, v in got.items()}
    if not bad:
        return
    shown = ", ".join(f"{k} {v}" for k, v in bad.items())
    tips = [f"a lower --lr (now {lr:g} at this step, {config.lr:g} at its peak)",
            f"more warm-up (--warmup-steps, now {config.warmup_steps}"
            + (f", {warmup} in effect: at most a quarter of the run's steps)" if warmup < config.warmup_steps else ")")]
    if amp:
        tips.append("AMP off (--no-amp): float16 can overflow")
    tips.append("a look at the data: boxes or landmarks far outside their images (detloader validate PATH)")
    raise NonFiniteLossError(
        f"non-finite loss at step {step} (epoch {epoch + 1}, step {step_in_epoch} of {steps_per_epoch}): {shown}. "
        f"Training stopped before this step's update; {last_good}. Try {', '.join(tips[:-1])}, or {tips[-1]}",
        step,
        bad,
    )


#: What the gloo and NCCL transports say when the process at the other end of a collective is gone.
_PEER_GONE = ("Connection reset by peer", "Connection closed by peer", "Connection refused", "Broken pipe",
              "Socket closed", "NCCL communicator was aborted", "remote process exited")


def rank_lost(err: RuntimeError, env: DistEnv, out: Path) -> RankLostError | None:
    """``err`` as the :class:`RankLostError` that stops a rank whose collective lost its peer
    (another rank killed or out of memory): one line naming this rank, the lost one, the
    backend's words and ``out/last.pt``, without the 30-line traceback; None for any other
    error, or outside a distributed run."""
    text = str(err)
    if not env.distributed or not any(words in text for words in _PEER_GONE):
        return None
    lost = f"rank {1 - env.rank}" if env.world_size == 2 else f"another of the {env.world_size} ranks"
    said = next(words for words in _PEER_GONE if words in text)
    last = out / "last.pt"
    kept = (f"{last} is the last checkpoint saved (continue with --resume {last} once every rank can run)"
            if last.is_file() else f"no checkpoint was saved in {out}")
    return RankLostError(
        f"rank {env.rank} of {env.world_size}: {lost} ended during training ({_backend()}: {said}); "
        f"training stopped: {kept}", env.rank, env.world_size,
    )


def _backend() -> str:
    try:
        return str(torch.distributed.get_backend())
    except (RuntimeError, ValueError):
        return "the process group"


def worker_died(err: RuntimeError, out: Path) -> LoaderWorkerError | None:
    """``err`` as the :class:`LoaderWorkerError` that stops a run when it reports a loader worker
    that died (raised by the loader, or by torch's SIGCHLD handler wherever the step was), its
    message saying what became of ``out/last.pt``: nothing is saved after such a failure. A
    write the death cut short (its own error following the worker's) counts too. None for any
    other error."""
    named = err if isinstance(err, LoaderWorkerError) else loader_worker_error(err)
    if named is None and isinstance(err.__context__, LoaderWorkerError):
        named = err.__context__  # raised inside a write (torch.save), whose own error followed it
    if named is None:
        return None
    last = out / "last.pt"
    kept = (f"; training stopped without saving: {last} is as the run last saved it (continue with --resume {last})"
            if last.is_file() else f"; training stopped before any checkpoint was saved in {out}")
    return LoaderWorkerError(f"{named}{kept}", named.worker_id, named.pid, named.signal, named.exitcode)
