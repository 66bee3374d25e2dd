"""TuneResult: what the tuner measured, what it recommends and why; JSON in and out; its picture
(matplotlib, imported only when drawing)."""

from __future__ import annotations

import dataclasses
import json
import os
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from detloader._system.plotting import new_figure
from detloader.errors import DetloaderTypeError, DetloaderValueError
from detloader.tune.measure import Trial
from detloader.tune.probe import DatasetProbe, MachineProbe

#: Bumped when the JSON layout changes; older stored results are then measured again.
RESULT_VERSION = 1


@dataclass
class TuneResult:
    """The outcome of :func:`detloader.tune_loader` (fields: docs/tuning.md, "API").

    ``recommended`` is ready for ``DataLoader(dataset, **result.recommended)``; ``trials``:
    every measured setting in order, ``chosen`` indexes the recommended one; ``stop``: why the
    search ended (as :class:`~detloader.tune.search.SearchOutcome`); ``cap_reason``: ``usable``,
    ``busy``, ``max_workers`` or ``candidates``; ``key``: what the store files it under.
    """

    recommended: dict[str, Any]
    explanation: str
    summary: str
    machine: MachineProbe
    data: DatasetProbe | None
    trials: list[Trial]
    chosen: int
    batch_size: int
    dataset_size: int
    budget_s: float
    spent_s: float
    window_s: float
    stop: str
    worker_cap: int
    cap_reason: str
    tolerance: float
    step_time: float | str | None = None
    device: str | None = None
    decode_threads: int = 0
    key: dict[str, Any] = field(default_factory=dict)
    created: str = ""
    version: int = RESULT_VERSION
    #: True when this object was read from the store (not part of the JSON).
    from_cache: bool = field(default=False, repr=False, compare=False)

    @property
    def chosen_trial(self) -> Trial:
        return self.trials[self.chosen]

    @property
    def cpus(self) -> dict[str, Any]:
        """The CPU counts of :attr:`machine` (``busy``: by other processes during the probe)."""
        m = self.machine
        return {"usable": m.usable_cpus, "busy": m.busy_cpus, "free": m.free_cpus, "logical": m.logical_cpus,
                "physical": m.physical_cpus}

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-ready dict, with ``cpus`` for readers of the JSON."""
        out = {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name != "from_cache"}
        out.update(machine=self.machine.to_dict(), data=self.data.to_dict() if self.data is not None else None,
                   trials=[t.to_dict() for t in self.trials], cpus=self.cpus)
        return out

    def to_json(self, indent: int | None = 2) -> str:
        return json.dumps(self.to_dict(), indent=indent, ensure_ascii=False, allow_nan=False, default=_json_default)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> TuneResult:
        """Inverse of :meth:`to_dict`; ValueError naming a missing field or a version this
        detloader does not read."""
        if data.get("version") != RESULT_VERSION:
            raise DetloaderValueError(f"TuneResult: version={data.get('version')!r}, this detloader reads "
                                      f"{RESULT_VERSION}")
        fields = [f for f in dataclasses.fields(cls) if f.name != "from_cache"]
        missing = sorted(f.name for f in fields if f.name not in data and f.default is dataclasses.MISSING
                         and f.default_factory is dataclasses.MISSING)
        if missing:
            raise DetloaderValueError(f"TuneResult: missing field(s) {missing}")
        values = {f.name: data[f.name] for f in fields if f.name in data}
        values.update(machine=MachineProbe.from_dict(data["machine"]),
                      trials=[Trial.from_dict(t) for t in data["trials"]],
                      data=DatasetProbe.from_dict(data["data"]) if data["data"] is not None else None)
        result = cls(**values)
        if not 0 <= result.chosen < len(result.trials):
            raise DetloaderValueError(
                f"TuneResult: chosen={result.chosen} is not a trial index (0..{len(result.trials) - 1})")
        return result

    @classmethod
    def from_json(cls, text: str) -> TuneResult:
        try:
            data = json.loads(text)
        except json.JSONDecodeError as err:
            raise DetloaderValueError(f"TuneResult: not JSON ({err})") from None
        if not isinstance(data, dict):
            raise DetloaderValueError(f"TuneResult: expected a JSON object, got {type(data).__name__}")
        return cls.from_dict(data)

    def plot(self, path: str) -> str:
        """Save images/s and worker memory against ``num_workers`` to ``path`` (needs
        matplotlib); returns the path."""
        c = self.cpus
        title = f"batch {self.batch_size}: {c['usable']} usable CPUs, {c['busy']:.1f} busy -> {c['free']:.1f} free"
        return plot_trials(self.trials, self.chosen_trial, title, path)


def _json_default(value: Any) -> Any:
    if hasattr(value, "item"):  # numpy scalars that slipped into settings or figures
        return value.item()
    raise DetloaderTypeError(f"not JSON serialisable: {type(value).__name__}")


def plot_trials(trials: Sequence[Trial], chosen: Trial, title: str, path: str | os.PathLike[str]) -> str:
    """Images/s per family of settings (prefetch x pinning; the line joins best windows, dots
    are every window, ``chosen`` is circled) and worker memory (USS x workers) over
    ``num_workers``, saved to ``path``; returns the path. Raises
    :class:`~detloader._system.plotting.MissingExtraError` without matplotlib."""
    windows: dict[str, list[tuple[int, float]]] = defaultdict(list)
    best: dict[str, dict[int, float]] = defaultdict(dict)
    memory: dict[str, dict[int, float]] = defaultdict(dict)
    for t in (t for t in trials if t.ok):
        s, w = t.settings, t.num_workers
        family = f"prefetch {s.get('prefetch_factor') or 2}" + (", pinned" if s.get("pin_memory") else "")
        windows[family].append((w, t.images_per_s))
        best[family][w] = max(best[family].get(w, 0.0), t.images_per_s)
        if t.worker_uss_mib is not None or w == 0:
            memory[family][w] = max(memory[family].get(w, 0.0), (t.worker_uss_mib or 0.0) * w)
    fig = new_figure(figsize=(7, 6), layout="constrained")
    ax_rate, ax_mem = fig.subplots(2, 1, sharex=True)
    for family in sorted(best):
        xs = sorted(best[family])
        line = ax_rate.plot(xs, [best[family][x] for x in xs], marker="o", label=family)[0]
        ax_rate.scatter(*zip(*windows[family]), s=12, color=line.get_color(), alpha=0.35)
        if memory[family]:
            ms = sorted(memory[family])
            ax_mem.plot(ms, [memory[family][x] for x in ms], marker="s", color=line.get_color(), label=family)
    ax_rate.scatter([chosen.num_workers], [chosen.images_per_s], s=220, facecolors="none", edgecolors="crimson",
                    linewidths=2, label="recommended", zorder=5)
    from matplotlib.ticker import MaxNLocator  # the optional plot extra: imported when drawing

    ax_rate.set(ylabel="images / s", title=title, ylim=(0, None))
    ax_mem.set(xlabel="num_workers", ylabel="worker memory, MiB (USS x workers)", ylim=(0, None))
    ax_mem.xaxis.set_major_locator(MaxNLocator(integer=True))
    for ax in (ax_rate, ax_mem):
        ax.grid(alpha=0.3)
    ax_rate.legend(fontsize=8)
    fig.savefig(path, dpi=110)
    return os.fspath(path)
