"""Images/s and worker memory against ``num_workers`` (matplotlib, imported only here)."""

from __future__ import annotations

import os
from collections import defaultdict
from collections.abc import Sequence

from detloader._plotting import new_figure
from detloader.tune.measure import Trial


def plot_trials(trials: Sequence[Trial], chosen: Trial, title: str, path: str | os.PathLike[str]) -> str:
    """Two panels sharing the x axis (``num_workers``): images/s per setting family
    (prefetch_factor x pin_memory; the line joins each setting's best window, dots are all
    windows, ``chosen`` is circled) and the memory all workers hold (USS per worker x
    workers). Saved to ``path`` with the Agg backend; returns the path.
    Raises :class:`~detloader._plotting.MissingExtraError` when matplotlib is missing."""
    # per family (prefetch x pinning): every window as a faint dot, each setting's best window
    # (how the tuner ranks) as the line, its workers' memory below
    windows: dict[str, list[tuple[int, float]]] = defaultdict(list)
    best: dict[str, dict[int, float]] = defaultdict(dict)
    memory: dict[str, dict[int, float]] = defaultdict(dict)
    for t in trials:
        if not t.ok:
            continue
        s = t.settings
        label = f"prefetch {s.get('prefetch_factor') or 2}" + (", pinned" if s.get("pin_memory") else "")
        w = t.num_workers
        windows[label].append((w, t.images_per_s))
        best[label][w] = max(best[label].get(w, 0.0), t.images_per_s)
        if t.worker_uss_mib is not None:
            memory[label][w] = max(memory[label].get(w, 0.0), t.worker_uss_mib * w)
        elif w == 0:
            memory[label][w] = 0.0
    fig = new_figure(figsize=(7, 6), layout="constrained")
    ax_rate, ax_mem = fig.subplots(2, 1, sharex=True)
    for label in sorted(best):
        xs = sorted(best[label])
        line = ax_rate.plot(xs, [best[label][x] for x in xs], marker="o", label=label)[0]
        ax_rate.scatter([p[0] for p in windows[label]], [p[1] for p in windows[label]], s=12,
                        color=line.get_color(), alpha=0.35)
        ms = sorted(memory[label])
        if ms:
            ax_mem.plot(ms, [memory[label][x] for x in ms], marker="s", color=line.get_color(), label=label)
    ax_rate.scatter([chosen.num_workers], [chosen.images_per_s], s=220, facecolors="none",
                    edgecolors="crimson", linewidths=2, label="recommended", zorder=5)
    from matplotlib.ticker import MaxNLocator  # the optional plot extra: imported when drawing

    ax_rate.set_ylabel("images / s")
    ax_rate.set_ylim(bottom=0)
    ax_mem.set_ylim(bottom=0)
    ax_mem.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax_rate.set_title(title)
    ax_rate.grid(alpha=0.3)
    ax_rate.legend(fontsize=8)
    ax_mem.set_xlabel("num_workers")
    ax_mem.set_ylabel("worker memory, MiB (USS x workers)")
    ax_mem.grid(alpha=0.3)
    fig.savefig(path, dpi=110)
    return os.fspath(path)
