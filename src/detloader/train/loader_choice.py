"""The loader settings of a training run and the one line that says what was chosen and why
(docs/training.md, "The loader a run uses").

With ``num_workers="auto"`` a run takes, in this order: a stored ``tune_loader`` result for its own
training dataset, transform and batch size; a stored result for this machine and the run's dataset
whatever the transform and batch size (what ``detloader tune DATA`` saves), the one at the run's batch
size first, then the newest; else the untuned default (:func:`detloader.tune.saved.untuned_loader_kwargs`).
A stored result measured on a quieter machine keeps at most as many workers as are free now.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class LoaderChoice:
    """``kwargs`` for ``make_loader`` (``num_workers``, ``decode_threads`` and, with workers,
    ``prefetch_factor`` and ``persistent_workers``; ``pin_memory`` is the run's device's) and
    ``line``: what was chosen and why, in one line (``"loader: num_workers=2, ...: ..."``)."""

    kwargs: dict[str, Any]
    line: str


def _settings(kwargs: dict[str, Any], pin: bool) -> str:
    threads = kwargs.get("decode_threads") or 0
    return (f"loader: num_workers={kwargs['num_workers']}" + (f", decode_threads={threads}" if threads else "")
            + f", pin_memory={pin}")


def choose_loader(dataset: Any, data_hash: str, num_workers: int | str, batch_size: int, pin: bool,
                  data: str | None = None) -> LoaderChoice:
    """The loader settings of a run training on ``dataset`` (its training part) at ``batch_size``;
    ``data_hash``: :func:`detloader.tune.saved.dataset_hash` of the whole dataset (what ``detloader
    tune`` files its result under); ``num_workers``: the run's setting (an int is taken as it is);
    ``pin``: whether batches are pinned; ``data``: the dataset path the line names."""
    from detloader.tune import saved

    if num_workers != "auto":
        kwargs: dict[str, Any] = {"num_workers": int(num_workers)}
        return LoaderChoice(kwargs, f"{_settings(kwargs, pin)}: set by num_workers={num_workers}")
    result = saved.load_result(saved.cache_key(dataset, batch_size)) or saved.find_result(data_hash, batch_size)
    if result is not None:
        check = saved.check_load(result)
        kwargs = saved.fit_to_load(result.recommended, check)
        kwargs["decode_threads"] = int(result.decode_threads) if kwargs["num_workers"] == 0 else 0
        kwargs.pop("pin_memory", None)
        rate = result.chosen_trial.images_per_s
        when = f" of {result.created[:10]}" if result.created else ""
        why = (f"the saved tune result{when} for this machine and dataset ({rate:.0f} img/s at batch size "
               f"{result.batch_size})")
        if check.busier and kwargs["num_workers"] != result.recommended.get("num_workers"):
            why += f", capped to the free CPUs: {check.describe()}"
        return LoaderChoice(kwargs, f"{_settings(kwargs, pin)}: {why}")
    kwargs, _ = saved.untuned_loader_kwargs()
    kwargs.pop("pin_memory", None)
    usable = _usable()
    where = data if data is not None else "DATA"
    return LoaderChoice(kwargs, f"{_settings(kwargs, pin)}: untuned default for {usable} usable CPUs "
                                f"(`detloader tune {where}` measures this machine)")


def _usable() -> int:
    from detloader import _system

    return _system.usable_cpus()
