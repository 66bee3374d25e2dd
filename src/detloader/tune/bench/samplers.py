"""The sampler section: :class:`~detloader.balance.WeightedSampler` against torch's
``WeightedRandomSampler`` over the same log-normal float64 weights: construction plus the first
``draws`` indices, one epoch as an array, and the peak memory over the weights. torch refuses
more than 2**24 categories; ours is then reported alone. See docs/benchmarks.md.
"""

from __future__ import annotations

import gc
import itertools
import threading
import time
from typing import Any

import numpy as np
import torch

from detloader.balance import WeightedSampler
from detloader.tune.bench.report import BenchReport

SECTION = "sampler"
TORCH_MAX_CATEGORIES = 1 << 24


class PeakRSS:
    """Largest resident set size seen while active (psutil, sampled every millisecond)."""

    def __init__(self) -> None:
        import psutil

        self._proc = psutil.Process()
        self.base = self._proc.memory_info().rss
        self.peak = self.base
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, self._proc.memory_info().rss)
            time.sleep(0.001)

    def __enter__(self) -> PeakRSS:
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, self._proc.memory_info().rss)

    @property
    def rise_mb(self) -> float:
        return (self.peak - self.base) / 2**20


def sampler_case(impl: str, weights: np.ndarray, draws: int, seed: int = 0) -> dict[str, Any]:
    """``{"first_s", "epoch_s", "peak_mb"}`` of one sampler (``impl`` "ours" or "torch")."""
    n = len(weights)
    gc.collect()
    gen = torch.Generator().manual_seed(seed)
    with PeakRSS() as mem:
        start = time.perf_counter()
        if impl == "torch":
            sampler: Any = torch.utils.data.WeightedRandomSampler(
                torch.from_numpy(weights), n, replacement=True, generator=gen
            )
        else:
            sampler = WeightedSampler(weights, n, seed=seed)
        head = list(itertools.islice(iter(sampler), draws))
        first_s = time.perf_counter() - start
    assert len(head) == draws
    del head
    start = time.perf_counter()
    if impl == "torch":
        idx = torch.multinomial(sampler.weights, n, True, generator=gen)
    else:
        sampler.set_epoch(1)
        idx = sampler.indices()
    epoch_s = time.perf_counter() - start
    assert len(idx) == n
    return {"first_s": first_s, "epoch_s": epoch_s, "peak_mb": mem.rise_mb}


def bench_samplers(report: BenchReport, n: int, draws: int) -> None:
    """Fill ``report``'s sampler figures for ``n`` weights and the first ``draws`` indices."""
    draws = min(draws, n)
    weights = np.random.default_rng(0).lognormal(0.0, 1.0, n)
    fig: dict[str, Any] = {"weights": n, "draws": draws, "ours": sampler_case("ours", weights, draws)}
    if n > TORCH_MAX_CATEGORIES:
        report.notes.append(
            f"sampler: torch WeightedRandomSampler refuses {n:,} weights (more than 2**24 categories); "
            f"detloader alone: first {draws:,} indices in {fig['ours']['first_s']:.2f} s, "
            f"peak {fig['ours']['peak_mb']:.0f} MB over the weights"
        )
    else:
        fig["torch"] = sampler_case("torch", weights, draws)
        t, o = fig["torch"], fig["ours"]
        what = f"{n:,} weights"
        for key, step in (("first_s", f"first {draws:,} indices"), ("epoch_s", "one epoch as an array")):
            report.add(SECTION, f"{what}, {step}: torch / detloader", ("torch", t[key]), ("detloader", o[key]), "s")
    report.figures[SECTION] = fig
