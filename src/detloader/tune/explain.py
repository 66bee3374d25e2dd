"""The recommendation in plain language, with the numbers that led to it.

One short line per decision: what the CPUs allow, what one image costs, why this many workers
(and not one more), what memory allows, and why each of ``prefetch_factor``, ``pin_memory``
and ``persistent_workers`` has its value; with a consumer, whether the loader is the
bottleneck.
"""

from __future__ import annotations

from typing import Any, Sequence

from detloader.tune.measure import Trial
from detloader.tune.result import TuneResult
from detloader.tune.search import setting_rates, settings_key

__all__ = [
    "cap_reason_text", "choice_line", "consumer_line", "cost_line", "cpu_line", "describe_settings",
    "explain", "extras_lines", "memory_line", "noise_line", "search_line", "summary",
]


def _gib(n: float | None) -> str:
    if n is None:
        return "?"
    return f"{n / 2**30:.1f} GiB" if n >= 2**30 else f"{n / 2**20:.0f} MiB"


def _bytes(n: float) -> str:
    for unit, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= size:
            return f"{n / size:.1f} {unit}"
    return f"{n:.0f} B"


def _seconds(s: float) -> str:
    return f"{s:.0f} s" if s >= 10 else f"{s:.1f} s"


def _num(x: float) -> str:
    """A CPU count: whole numbers without decimals."""
    return f"{x:.0f}" if abs(x - round(x)) < 0.05 else f"{x:.1f}"


def _rate(x: float) -> str:
    return f"{x:.0f} img/s" if x >= 10 else f"{x:.1f} img/s"


def _workers(n: int) -> str:
    return "0 workers (loading in the main process)" if n == 0 else f"{n} worker{'s' if n != 1 else ''}"


def _ordinal(n: int) -> str:
    suffix = "th" if 10 <= n % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")
    return f"{n}{suffix}"


def _gain(a: float, b: float) -> str:
    """Relative change from ``b`` to ``a`` as a signed percentage."""
    return f"{(a / b - 1.0) * 100:+.0f} %" if b > 0 else "n/a"


def _rate_of(r: TuneResult, settings: dict[str, Any]) -> float:
    """Images/s of a setting: its best window (some settings are measured more than once)."""
    return setting_rates(r.trials).get(settings_key(settings), 0.0)


def _best_per_workers(r: TuneResult) -> dict[int, tuple[float, Trial]]:
    """For each worker count, its fastest setting with the chosen pin_memory value."""
    pin = r.chosen_trial.settings.get("pin_memory")
    out: dict[int, tuple[float, Trial]] = {}
    for t in r.trials:
        if not t.ok or t.settings.get("pin_memory") != pin:
            continue
        rate = _rate_of(r, t.settings)
        if t.num_workers not in out or rate > out[t.num_workers][0]:
            out[t.num_workers] = (rate, t)
    return out


def cpu_line(r: TuneResult) -> str:
    m = r.machine
    cores = f"{m.logical_cpus} logical"
    if m.physical_cpus:
        cores += f", {m.physical_cpus} physical cores"
    limits = []
    if m.affinity_cpus < m.logical_cpus:
        limits.append(f"affinity allows {m.affinity_cpus}")
    if m.cgroup_cpu_quota is not None:
        limits.append(f"cgroup quota {m.cgroup_cpu_quota:g} CPUs")
    limit = f"; {', '.join(limits)}" if limits else ""
    return (
        f"CPUs: {m.usable_cpus} usable ({cores}{limit}); {_num(m.busy_cpus)} busy with other "
        f"processes over {m.busy_window_s:g} s -> {_num(m.free_cpus)} free."
    )


def cost_line(r: TuneResult) -> str | None:
    d = r.data
    if d is None:
        return None
    text = (
        f"Cost: one image takes {d.ms_per_image:.1f} ms to load, decode and transform on one core "
        f"(collate {d.collate_ms_per_image:.2f} ms) -> about {_rate(d.images_per_s_per_core)} per "
        f"worker; a batch of {d.batch_size} is {_bytes(d.batch_bytes)}."
    )
    if d.read_ms_per_file is not None and d.read_mb_per_s is not None:
        text += (f" Reading a file takes {d.read_ms_per_file:.2f} ms ({d.read_mb_per_s:.0f} MB/s, "
                 f"{d.read_files} sampled).")
    return text


def choice_line(r: TuneResult) -> str:
    chosen = r.chosen_trial
    w = chosen.num_workers
    rate = _rate_of(r, chosen.settings)
    by_w = _best_per_workers(r)
    threads = int(chosen.settings.get("decode_threads", 0))
    with_threads = f" with {threads} decode threads each" if threads and w else (
        f" and {threads} decode threads" if threads else "")
    text = (
        f"Choice: {_workers(w)}{with_threads} give{'s' if w <= 1 else ''} {_rate(rate)} "
        f"(wait per batch p50 {chosen.latency_p50_ms:.0f} ms, p95 {chosen.latency_p95_ms:.0f} ms)"
    )
    above = sorted(n for n in by_w if n > w)
    below = sorted((n for n in by_w if n < w), reverse=True)
    reasons: list[str] = []
    if above:
        n = above[0]
        more = "1 worker" if n == 1 else (f"a {_ordinal(n)}" if n == w + 1 else f"{n} workers")
        other = by_w[n][0]
        reasons.append(f"{more}: {_rate(other)} ({_gain(other, rate)}), not more than the "
                       f"{r.tolerance * 100:.0f} % a process must add")
    elif w == r.worker_cap:
        reasons.append(cap_reason_text(r))
    if below:
        n = below[0]
        reasons.append(f"{_workers(n)}: {_rate(by_w[n][0])}")
    if reasons:
        text += "; " + "; ".join(reasons)
    return text + "."


def cap_reason_text(r: TuneResult) -> str:
    m = r.machine
    cap = r.worker_cap
    if r.cap_reason == "busy":
        return (
            f"no more than {cap} tried: only {_num(m.free_cpus)} of {m.usable_cpus} CPUs are free, "
            f"more workers would take CPU time from the other processes (and slow down with them)"
        )
    if r.cap_reason == "max_workers":
        return f"{cap} is the max_workers given"
    if r.cap_reason == "candidates":
        return f"{cap} is the most among the candidates given"
    return f"{cap} is the most worth trying with {m.usable_cpus} usable CPUs"


def memory_line(r: TuneResult) -> str | None:
    t = r.chosen_trial
    m = r.machine
    per = t.worker_uss_mib
    if per is None:
        per = max((x.worker_uss_mib or 0.0 for x in r.trials if x.ok), default=0.0) or None
    limit = f" (cgroup limit {_gib(m.cgroup_memory_limit)})" if m.cgroup_memory_limit else ""
    if per is None:
        return f"Memory: {_gib(m.memory_available)} available{limit}."
    pss = f", PSS {t.worker_pss_mib:.0f} MiB" if t.worker_pss_mib is not None else ""
    room = int(0.8 * m.memory_available / (per * 2**20)) if per > 0 else 0
    verdict = (f"room for about {room} workers" if room < 4 * max(1, m.usable_cpus)
               else "memory does not limit the worker count here")
    return (
        f"Memory: each worker holds {per:.0f} MiB of its own (USS{pss}); {_gib(m.memory_available)} "
        f"available{limit}: {verdict}."
    )


def _threads_line(r: TuneResult, rate: float) -> str | None:
    """What ``decode_threads`` did, when the search measured it."""
    threaded = [t for t in r.trials if t.ok and t.settings.get("decode_threads")]
    if not threaded:
        return None
    chosen = r.chosen_trial.settings
    n = int(chosen.get("decode_threads", 0))
    if n:
        plain = {k: v for k, v in chosen.items() if k != "decode_threads"}
        other = _rate_of(r, plain)
        if not other:
            return f"decode_threads={n}: loads each batch on {n} threads."
        return (f"decode_threads={n}: {_gain(rate, other)} over the same setting without threads "
                f"({_rate(other)}).")
    best = max(threaded, key=lambda t: _rate_of(r, t.settings))
    other = _rate_of(r, best.settings)
    return (f"decode_threads=0: the best with threads, {describe_settings(best.settings)}, gave "
            f"{_rate(other)} ({_gain(other, rate)}), not more than the tolerance.")


def extras_lines(r: TuneResult) -> list[str]:
    chosen = r.chosen_trial
    s = r.recommended
    rate = _rate_of(r, chosen.settings)
    lines = []
    w = chosen.num_workers
    same_w = [t for t in r.trials if t.ok and t.num_workers == w]
    pin = chosen.settings.get("pin_memory")
    threads_line = _threads_line(r, rate)
    if threads_line:
        lines.append(threads_line)
    pf_others = {t.settings.get("prefetch_factor"): _rate_of(r, t.settings) for t in same_w
                 if t.settings.get("pin_memory") == pin
                 and t.settings.get("prefetch_factor") != chosen.settings.get("prefetch_factor")}
    if w == 0:
        lines.append("prefetch_factor=None: it only applies to worker processes.")
    elif pf_others:
        pf, other = sorted(pf_others.items())[0]
        if s["prefetch_factor"] > pf:
            lines.append(f"prefetch_factor={s['prefetch_factor']}: {_gain(rate, other)} over "
                         f"prefetch_factor={pf} ({_rate(other)}), more than the tolerance.")
        else:
            lines.append(f"prefetch_factor={s['prefetch_factor']}: prefetch_factor={pf} gave "
                         f"{_rate(other)} ({_gain(other, rate)}), not worth its memory.")
    else:
        lines.append(f"prefetch_factor={s['prefetch_factor']}: DataLoader's default; "
                     "no other value was measured.")
    m = r.machine
    if not m.can_pin:
        other = f" (a {m.accelerator} device does not use it)" if m.accelerator else ""
        lines.append(f"pin_memory=False: no CUDA/XPU device{other}, nothing to copy to.")
    else:
        parts = []
        if m.h2d_pinned_gbps and m.h2d_pageable_gbps:
            parts.append(f"host-to-device copies run at {m.h2d_pinned_gbps:.1f} GB/s pinned vs "
                         f"{m.h2d_pageable_gbps:.1f} GB/s pageable")
        po = [t for t in same_w if t.settings.get("pin_memory") != pin]
        if po:
            other = _rate_of(r, po[0].settings)
            parts.append(f"{'without' if s['pin_memory'] else 'with'} pinning the loop gave "
                         f"{_rate(other)} ({_gain(other, rate)})")
        lines.append(f"pin_memory={s['pin_memory']}" + (": " + "; ".join(parts) if parts else "") + ".")
    if w > 0 and s.get("persistent_workers"):
        epoch = r.dataset_size / rate if rate > 0 else 0.0
        lines.append(
            f"persistent_workers=True: starting the workers took {chosen.startup_s:.2f} s, saved at every "
            f"epoch (an epoch of {r.dataset_size} images takes about {_seconds(epoch)} at this rate)."
        )
    elif w > 0:
        lines.append("persistent_workers=False: as given.")
    return lines


def consumer_line(r: TuneResult) -> str | None:
    t = r.chosen_trial
    if t.wait_fraction is None or t.step_ms is None:
        return None
    step = f"{t.step_ms:.1f} ms per batch of {r.batch_size}"
    need = 1000.0 * r.batch_size / t.step_ms if t.step_ms > 0 else float("inf")
    what = "your step" if r.step_time is not None else f"the copy to {r.device}"
    verdict = (
        "the loader is not the bottleneck" if t.wait_fraction < 0.05
        else "the loader is the bottleneck: the step waits for data"
    )
    return (
        f"Consumer: {what} takes {step} (it could use {_rate(need)}); it waited for data "
        f"{t.wait_fraction * 100:.0f} % of the time: {verdict}."
    )


def search_line(r: TuneResult) -> str:
    ok = sum(1 for t in r.trials if t.ok)
    failed = len(r.trials) - ok
    why = {
        "converged": "throughput stopped rising",
        "cap": f"throughput still rose at the cap of {_workers(r.worker_cap)} ("
        + {"usable": "the usable CPUs", "busy": "the free CPUs", "max_workers": "max_workers"}.get(
            r.cap_reason, r.cap_reason) + ")",
        "budget": "the time budget ran out",
        "memory": "more workers would not fit in memory",
        "grid": "every candidate was measured",
    }.get(r.stop, r.stop)
    fail = f", {failed} failed" if failed else ""
    scope = f"0..{r.worker_cap} workers"
    if r.cap_reason == "busy" and r.stop != "cap":
        scope += f" ({cap_reason_text(r)})"
    return (
        f"Search: {scope}; {ok} settings measured{fail} in {r.spent_s:.0f} s of a {r.budget_s:.0f} s "
        f"budget, {r.window_s:.1f} s windows; stopped: {why}."
    )


def noise_line(r: TuneResult) -> str | None:
    """A warning when other processes' CPU use changed a lot while the settings were measured
    (then one setting may have been measured on a quieter machine than another)."""
    others = [t.others_cpu for t in r.trials if t.ok and t.others_cpu is not None]
    if len(others) < 2:
        return None
    lo, hi = min(others), max(others)
    if hi - lo < max(0.5, 0.25 * r.machine.usable_cpus):
        return None
    return (
        f"Noise: other processes took between {lo:.1f} and {hi:.1f} CPUs while the settings were "
        f"measured; the figures compare settings measured under different loads (run again when "
        f"the machine is quieter: cache='refresh', or detloader tune --refresh)."
    )


def explain(r: TuneResult) -> str:
    """The explanation text of a result (the ``explanation`` field is built with this)."""
    parts: Sequence[str | None] = [
        cpu_line(r),
        cost_line(r),
        choice_line(r),
        memory_line(r),
        *extras_lines(r),
        consumer_line(r),
        search_line(r),
        noise_line(r),
    ]
    return "\n".join(p for p in parts if p)


def summary(r: TuneResult) -> str:
    """One line: the setting, its throughput and the CPU situation when measured."""
    s = r.recommended
    rate = _rate_of(r, r.chosen_trial.settings)
    extras = f", prefetch_factor={s['prefetch_factor']}" if s["num_workers"] else ""
    if r.decode_threads:
        extras += f", decode_threads={r.decode_threads}"
    when = f" on {r.created[:10]}" if r.created else ""
    return (
        f"num_workers={s['num_workers']}, pin_memory={s['pin_memory']}{extras}: "
        f"{_rate(rate)} measured{when} with {_num(r.machine.free_cpus)} of "
        f"{r.machine.usable_cpus} CPUs free"
    )


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
