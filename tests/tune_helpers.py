"""A stand-in for the tuner's measurement, shared by the tuning tests: every trial is
computed from a rate function, no time is spent."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from detloader.tune.measure import Trial


def model(rate: Callable[[Mapping[str, Any]], float], uss: float = 100.0, calls: list | None = None):
    """A ``measure`` replacement: images/s from ``rate(settings)``, no time spent."""

    def fake(factory: Any, settings: Mapping[str, Any], *, batch_size: int, window_s: float,
             min_batches: int, consumer: Any, deadline: float | None, phase: str) -> Trial:
        if calls is not None:
            calls.append(dict(settings))
        w = int(settings["num_workers"])
        r = float(rate(settings))
        return Trial(
            settings=dict(settings), images_per_s=r, images=max(1, int(r * window_s)),
            batches=min_batches, seconds=window_s, startup_s=0.05 * w, latency_p50_ms=1000 * batch_size / r,
            latency_p95_ms=2000 * batch_size / r, main_cpu=1.0 if w == 0 else 0.1, workers_cpu=float(w),
            workers=w, worker_uss_mib=uss if w else None, worker_pss_mib=uss * 1.5 if w else None,
            main_rss_mib=300.0, phase=phase,
        )

    return fake
