"""Images/s and worker memory against ``num_workers`` (matplotlib, imported only here)."""

from __future__ import annotations

import os
from collections import defaultdict
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from detloader.tune.result import TuneResult


def plot_result(result: "TuneResult", path: str | os.PathLike[str]) -> str:
    """Two panels sharing the x axis (``num_workers``): images/s per setting family
    (prefetch_factor x pin_memory; the recommendation circled) and the memory all workers hold
    (mean USS per worker x workers). Saved to ``path`` with the Agg backend; returns the path.
    Raises ModuleNotFoundError naming the ``plot`` extra when matplotlib is missing."""
    try:
        import matplotlib

        matplotlib.use("Agg", force=False)
        import matplotlib.pyplot as plt
    except ModuleNotFoundError as err:
        raise ModuleNotFoundError(
            "plotting needs matplotlib: pip install 'detloader[plot]'"
        ) from err

    families: dict[str, list[tuple[int, float, float | None]]] = defaultdict(list)
    for t in result.trials:
        if not t.ok:
            continue
        s = t.settings
        label = f"prefetch {s.get('prefetch_factor') or 2}" + (", pinned" if s.get("pin_memory") else "")
        if t.worker_uss_mib is not None:
            mem: float | None = t.worker_uss_mib * t.num_workers
        else:
            mem = 0.0 if t.num_workers == 0 else None
        families[label].append((t.num_workers, t.images_per_s, mem))
    fig, (ax_rate, ax_mem) = plt.subplots(2, 1, sharex=True, figsize=(7, 6), constrained_layout=True)
    for label, points in sorted(families.items()):
        points.sort()
        xs = [p[0] for p in points]
        ax_rate.plot(xs, [p[1] for p in points], marker="o", label=label)
        mem = [(p[0], p[2]) for p in points if p[2] is not None]
        if mem:
            ax_mem.plot([m[0] for m in mem], [m[1] for m in mem], marker="s", label=label)
    chosen = result.chosen_trial
    ax_rate.scatter([chosen.num_workers], [chosen.images_per_s], s=220, facecolors="none",
                    edgecolors="crimson", linewidths=2, label="recommended", zorder=5)
    from matplotlib.ticker import MaxNLocator

    ax_rate.set_ylabel("images / s")
    ax_rate.set_ylim(bottom=0)
    ax_mem.set_ylim(bottom=0)
    ax_mem.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax_rate.set_title(
        f"batch {result.batch_size}: {result.cpus['usable']} usable CPUs, "
        f"{result.cpus['busy']:.1f} busy -> {result.cpus['free']:.1f} free"
    )
    ax_rate.grid(alpha=0.3)
    ax_rate.legend(fontsize=8)
    ax_mem.set_xlabel("num_workers")
    ax_mem.set_ylabel("worker memory, MiB (USS x workers)")
    ax_mem.grid(alpha=0.3)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return os.fspath(path)
