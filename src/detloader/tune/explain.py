"""The recommendation in plain language, from the measured figures.

One line each: the CPUs, what one image costs, the choice, every other setting measured with
its images/s and its difference to the choice (the figures every decision rests on), memory,
what ``pin_memory`` and ``persistent_workers`` save, the consumer when there is one, the
search, and a warning when other processes' load moved while measuring.
"""

from __future__ import annotations

from typing import Any

from detloader.tune.result import TuneResult
from detloader.tune.search import setting_rates, settings_key

_CAPS = {
    "usable": "the usable CPUs",
    "busy": "the free CPUs: more workers would take CPU time from the other processes",
    "max_workers": "max_workers",
    "candidates": "the candidates given",
}
_STOPS = {
    "converged": "throughput stopped rising",
    "cap": "throughput still rose at the cap",
    "budget": "the time budget ran out",
    "memory": "more workers would not fit in memory",
    "grid": "every candidate was measured",
}


def _num(x: float) -> str:
    """A CPU count: whole numbers without decimals."""
    return f"{x:.0f}" if abs(x - round(x)) < 0.05 else f"{x:.1f}"


def _rate(x: float) -> str:
    return f"{x:.0f} img/s" if x >= 10 else f"{x:.1f} img/s"


def _mib(n: float) -> str:
    return f"{n / 2**30:.1f} GiB" if n >= 2**30 else f"{n / 2**20:.1f} MiB"


def _label(s: dict[str, Any]) -> str:
    """``2 workers, 2 decode threads, prefetch_factor=4, pinned`` (defaults left out)."""
    w = int(s.get("num_workers", 0))
    parts = [f"{w} worker{'' if w == 1 else 's'}"]
    if s.get("decode_threads"):
        parts.append(f"{s['decode_threads']} decode threads")
    if w and s.get("prefetch_factor") not in (None, 2):
        parts.append(f"prefetch_factor={s['prefetch_factor']}")
    if s.get("pin_memory"):
        parts.append("pinned")
    if w and not s.get("persistent_workers", True):
        parts.append("not persistent")
    return ", ".join(parts)


def explain(r: TuneResult) -> str:
    """The explanation text of a result (the ``explanation`` field is built with this)."""
    m, d, t = r.machine, r.data, r.chosen_trial
    rates = setting_rates(r.trials)
    rate = rates.get(settings_key(t.settings), 0.0)
    quota = f", cgroup quota {m.cgroup_cpu_quota:g}" if m.cgroup_cpu_quota is not None else ""
    lines = [f"CPUs: {m.usable_cpus} usable ({m.logical_cpus} logical, {m.physical_cpus or '?'} physical, "
             f"affinity {m.affinity_cpus}{quota}); {_num(m.busy_cpus)} busy with other processes over "
             f"{m.busy_window_s:g} s -> {_num(m.free_cpus)} free."]
    if d is not None:
        read = (f" Reading a file takes {d.read_ms_per_file:.2f} ms ({d.read_mb_per_s:.0f} MB/s, "
                f"{d.read_files} sampled)." if d.read_ms_per_file is not None and d.read_mb_per_s else "")
        lines.append(f"Cost: one image takes {d.ms_per_image:.1f} ms to load, decode and transform on one "
                     f"core (collate {d.collate_ms_per_image:.2f} ms) -> about {_rate(d.images_per_s_per_core)} "
                     f"per worker; a batch of {d.batch_size} is {_mib(d.batch_bytes)}.{read}")
    lines.append(f"Choice: {_label(t.settings)}: {_rate(rate)} (wait per batch p50 {t.latency_p50_ms:.0f} ms, "
                 f"p95 {t.latency_p95_ms:.0f} ms), the cheapest setting within {r.tolerance * 100:.0f} % "
                 "of the fastest.")
    others = sorted(((dict(k), v) for k, v in rates.items() if k != settings_key(t.settings)),
                    key=lambda sv: (sv[0].get("num_workers", 0), sv[0].get("decode_threads", 0), _label(sv[0])))
    if others:
        lines.append("Others: " + "; ".join(
            f"{_label(s)}: {_rate(v)} ({(v / rate - 1) * 100:+.0f} %)" if rate > 0 else f"{_label(s)}: {_rate(v)}"
            for s, v in others) + ".")
    if t.worker_uss_mib is not None:
        pss = f", PSS {t.worker_pss_mib:.0f} MiB" if t.worker_pss_mib is not None else ""
        lines.append(f"Memory: each worker holds {t.worker_uss_mib:.0f} MiB of its own (USS{pss}); "
                     f"{_mib(m.memory_available)} available.")
    if not m.can_pin:
        lines.append("pin_memory=False: no CUDA/XPU device, nothing to copy to.")
    elif m.h2d_pinned_gbps and m.h2d_pageable_gbps:
        lines.append(f"pin_memory={r.recommended['pin_memory']}: host-to-device copies run at "
                     f"{m.h2d_pinned_gbps:.1f} GB/s pinned vs {m.h2d_pageable_gbps:.1f} GB/s pageable.")
    if t.num_workers and r.recommended.get("persistent_workers") and rate > 0:
        lines.append(f"persistent_workers=True: starting the workers took {t.startup_s:.2f} s, saved at every "
                     f"epoch (an epoch of {r.dataset_size} images takes about {r.dataset_size / rate:.1f} s).")
    if t.wait_fraction is not None and t.step_ms is not None:
        what = "your step" if r.step_time is not None else f"the copy to {r.device}"
        verdict = "not the bottleneck" if t.wait_fraction < 0.05 else "the bottleneck: the step waits for data"
        lines.append(f"Consumer: {what} takes {t.step_ms:.1f} ms per batch of {r.batch_size}; it waited for data "
                     f"{t.wait_fraction * 100:.0f} % of the time: the loader is {verdict}.")
    failed = sum(1 for x in r.trials if not x.ok)
    cap = _CAPS.get(r.cap_reason, r.cap_reason)
    if r.cap_reason == "busy":
        cap = f"only {_num(m.free_cpus)} of {m.usable_cpus} CPUs are free; " + cap
    lines.append(f"Search: 0..{r.worker_cap} workers (the cap: {cap}); {len(rates)} settings measured"
                 f"{f', {failed} failed' if failed else ''} in {r.spent_s:.0f} s of a {r.budget_s:.0f} s budget, "
                 f"{r.window_s:.1f} s windows; stopped: {_STOPS.get(r.stop, r.stop)}.")
    load = [x.others_cpu for x in r.trials if x.ok and x.others_cpu is not None]
    if len(load) >= 2 and max(load) - min(load) >= max(0.5, 0.25 * m.usable_cpus):
        lines.append(f"Noise: other processes took between {min(load):.1f} and {max(load):.1f} CPUs while the "
                     "settings were measured; run again when the machine is quieter (detloader tune --refresh).")
    return "\n".join(lines)


def summary(r: TuneResult) -> str:
    """One line: the setting, its throughput and the CPU situation when measured."""
    s = r.recommended
    rate = setting_rates(r.trials).get(settings_key(r.chosen_trial.settings), 0.0)
    extras = f", prefetch_factor={s['prefetch_factor']}" if s["num_workers"] else ""
    if r.decode_threads:
        extras += f", decode_threads={r.decode_threads}"
    when = f" on {r.created[:10]}" if r.created else ""
    return (f"num_workers={s['num_workers']}, pin_memory={s['pin_memory']}{extras}: {_rate(rate)} measured{when} "
            f"with {_num(r.machine.free_cpus)} of {r.machine.usable_cpus} CPUs free")


def describe_settings(settings: dict[str, Any]) -> str:
    """``w=2 pf=4 pin`` style label for plots and tables."""
    label = f"w={settings.get('num_workers', 0)}"
    if settings.get("num_workers"):
        label += f" pf={settings.get('prefetch_factor')}"
    if settings.get("decode_threads"):
        label += f" t={settings['decode_threads']}"
    if settings.get("pin_memory"):
        label += " pin"
    if settings.get("num_workers") and not settings.get("persistent_workers", True):
        label += " np"
    return label
