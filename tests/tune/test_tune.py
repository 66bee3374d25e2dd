"""The loader tuner: search logic against machine models, real loaders on tiny data, the
explanation, the heuristic, TuneResult JSON and the cache."""

from __future__ import annotations

import functools
import json
import statistics
import time
import warnings
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import psutil
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from torch.utils.data import DataLoader, Dataset
from tune_helpers import model

from detloader import _system, read_annotations
from detloader.dataset import DetectionDataset
from detloader.loader import make_loader
from detloader.transforms import Resize
from detloader.tune import (
    MachineProbe,
    Trial,
    TuneResult,
    TuneWarning,
    auto_loader_kwargs,
    probe_dataset,
    probe_machine,
    saved,
    tune_loader,
    tuner,
)
from detloader.tune import search as search_module
from detloader.tune.measure import loader_kwargs, measure_setting
from detloader.tune.saved import WORKER_MEMORY_GUESS, heuristic_loader_kwargs
from detloader.tune.search import choose, search_settings, worker_ladder
from detloader.tune.tuner import grid_candidates, normalise_candidate, worker_cap

GIB = 2**30


# -- fixtures -----------------------------------------------------------------------------------
class SpinDataset(Dataset):
    """Each item burns ``ms`` of CPU time (a stand-in for decode + transform) and returns a
    small uint8 image, as the real dataset does."""

    def __init__(self, n: int = 96, ms: float = 1.0) -> None:
        self.n, self.ms = n, ms

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> torch.Tensor:
        end = time.thread_time() + self.ms / 1000.0
        while time.thread_time() < end:
            pass
        return torch.full((3, 16, 16), i % 256, dtype=torch.uint8)

    def __repr__(self) -> str:
        return f"SpinDataset(n={self.n}, ms={self.ms})"


class FileDataset(Dataset):
    """Reads the image files of an index (exposes ``index`` as DetectionDataset does)."""

    def __init__(self, index: Any) -> None:
        self.index = index

    def __len__(self) -> int:
        return len(self.index)

    def __getitem__(self, i: int) -> torch.Tensor:
        return torch.tensor(len(self.index.image_path(i).read_bytes()))


def machine(usable: int = 2, busy: float = 0.0, can_pin: bool = False, available: int = 16 * GIB) -> MachineProbe:
    return MachineProbe(
        logical_cpus=usable, physical_cpus=usable, affinity_cpus=usable, cgroup_cpu_quota=None,
        usable_cpus=usable, busy_cpus=busy, free_cpus=max(0.0, usable - busy), busy_window_s=1.0,
        memory_total=32 * GIB, memory_available=available, cgroup_memory_limit=None,
        accelerator="cuda" if can_pin else None, accelerator_name="model GPU" if can_pin else None,
        accelerator_count=1 if can_pin else 0,
    )


def knee(at: int, per_worker: float = 100.0, fall: float = 0.0) -> Callable[[Mapping[str, Any]], float]:
    """Throughput rising linearly to ``at`` workers, then flat (or falling by ``fall`` per worker)."""

    def rate(s: Mapping[str, Any]) -> float:
        w = s["num_workers"]
        if w == 0:
            return 0.9 * per_worker
        return per_worker * min(w, at) - fall * max(0, w - at)

    return rate


# -- search logic against machine models --------------------------------------------------------
def test_worker_ladder() -> None:
    assert worker_ladder(0) == [0]
    assert worker_ladder(1) == [0, 1]
    assert worker_ladder(2) == [0, 1, 2]
    assert worker_ladder(6) == [0, 1, 2, 4, 6]
    assert worker_ladder(64) == [0, 1, 2, 4, 8, 16, 32, 64]
    with pytest.raises(ValueError, match="cap=-1"):
        worker_ladder(-1)


def test_search_on_64_cpus_finds_the_knee_with_few_trials() -> None:
    calls: list[dict] = []
    out = search_settings(None, batch_size=32, cap=64, budget_s=60, measure_fn=model(knee(12), calls=calls))
    assert out.chosen_trial.num_workers == 12
    assert out.stop == "converged"
    distinct = {tuple(sorted(t.settings.items())) for t in out.trials}
    assert len(distinct) <= 12  # 0 1 2 4 8 16 32 | 12 10 11 + prefetch: not 65 x 2
    assert len(out.trials) <= len(distinct) + 3  # + the recheck windows
    assert [t.phase for t in out.trials][:7] == ["climb"] * 7
    assert {t.phase for t in out.trials} == {"climb", "refine", "prefetch", "recheck"}
    grid = search_settings(None, batch_size=32, cap=64, budget_s=60, measure_fn=model(knee(12)),
                  candidates=grid_candidates(64))
    assert grid.chosen_trial.num_workers == 12
    assert len(grid.trials) == 129


def test_search_stops_below_a_falling_curve() -> None:
    # contention: more than 8 workers get slower
    out = search_settings(None, batch_size=8, cap=32, budget_s=60, measure_fn=model(knee(8, fall=40.0)))
    assert out.chosen_trial.num_workers == 8
    assert {t.num_workers for t in out.trials} >= {0, 1, 2, 4, 8, 16}
    assert 32 not in {t.num_workers for t in out.trials}


def test_search_on_two_cpus_measures_every_count() -> None:
    out = search_settings(None, batch_size=8, cap=2, budget_s=60, measure_fn=model(knee(4)))
    assert [t.num_workers for t in out.trials if t.phase == "climb"] == [0, 1, 2]
    assert out.chosen_trial.num_workers == 2
    assert out.stop == "cap"


def test_flat_throughput_keeps_the_loading_in_the_main_process() -> None:
    # an I/O-bound or trivial dataset: workers add nothing, so none are recommended
    out = search_settings(
        None, batch_size=8, cap=16, budget_s=60, measure_fn=model(lambda s: 1000.0 + s["num_workers"])
    )
    assert out.chosen_trial.num_workers == 0
    assert out.chosen_trial.settings == loader_kwargs(0)


def test_prefetch_win_is_confirmed_and_kept() -> None:

    def rate(s):
        return knee(4)(s) * (1.2 if s.get("prefetch_factor") == 4 else 1.0)

    out = search_settings(None, batch_size=8, cap=4, budget_s=60, measure_fn=model(rate))
    assert out.chosen_trial.settings["prefetch_factor"] == 4
    assert [t.phase for t in out.trials].count("confirm") == 2


def test_small_prefetch_gain_is_not_worth_it() -> None:

    def rate(s):
        return knee(4)(s) * (1.02 if s.get("prefetch_factor") == 4 else 1.0)

    out = search_settings(None, batch_size=8, cap=4, budget_s=60, measure_fn=model(rate))
    assert out.chosen_trial.settings["prefetch_factor"] == 2
    assert "confirm" not in {t.phase for t in out.trials}


@pytest.mark.parametrize("pinned_gain", [1.3, 0.7])
def test_pin_memory_is_measured_both_ways(pinned_gain: float) -> None:

    def rate(s):
        return knee(2)(s) * (pinned_gain if s["pin_memory"] else 1.0)

    out = search_settings(None, batch_size=8, cap=2, can_pin=True, budget_s=60, measure_fn=model(rate))
    assert out.chosen_trial.settings["pin_memory"] is (pinned_gain > 1)
    assert {t.settings["pin_memory"] for t in out.trials} == {True, False}


def test_memory_stops_the_climb() -> None:
    # 1000 MiB per worker, 5 GiB available: 4 workers fit (80 % rule), 8 do not
    out = search_settings(None, batch_size=8, cap=64, budget_s=60, measure_fn=model(knee(32), uss=1000.0),
                 memory_available=5 * GIB)
    assert out.stop == "memory"
    assert max(t.num_workers for t in out.trials) == 4
    assert out.chosen_trial.num_workers == 4
    assert out.skipped and out.skipped[0]["reason"] == "memory"


def test_budget_stops_the_search() -> None:
    fake = model(knee(32))

    def slow(*args: Any, **kwargs: Any) -> Trial:
        time.sleep(0.05)
        return fake(*args, **kwargs)

    out = search_settings(None, batch_size=8, cap=64, budget_s=0.2, window_s=0.1, measure_fn=slow)
    assert out.stop == "budget"
    assert 1 <= len(out.trials) < len(worker_ladder(64))


def test_choose_takes_the_cheapest_setting_within_tolerance() -> None:
    fake = model(lambda s: {0: 100.0, 1: 180.0, 2: 300.0, 3: 305.0, 4: 310.0}[s["num_workers"]])
    trials = [fake(None, loader_kwargs(w), batch_size=1, window_s=1, min_batches=1, consumer=None,
                   deadline=None, phase="") for w in range(5)]
    assert trials[choose(trials, 0.04)].num_workers == 2  # 300 * 1.04 >= 310
    assert trials[choose(trials, 0.01)].num_workers == 4
    failed = measure_failure = Trial(loader_kwargs(1), 0.0, 0, 0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0, None,
                                     None, 0.0, error="RuntimeError: worker died")
    assert not measure_failure.ok
    with pytest.raises(ValueError, match="worker died"):
        choose([failed], 0.04)


def test_choose_takes_the_best_window_of_a_repeated_setting() -> None:
    # other processes only slow a window down: 1 worker measured 100 and, disturbed, 60
    fake = model(lambda s: 100.0)
    a, b = (fake(None, loader_kwargs(1), batch_size=1, window_s=1, min_batches=1, consumer=None,
                 deadline=None, phase="") for _ in range(2))
    c = fake(None, loader_kwargs(2), batch_size=1, window_s=1, min_batches=1, consumer=None, deadline=None, phase="")
    a.images_per_s, b.images_per_s, c.images_per_s = 100.0, 60.0, 103.0
    assert [a, b, c][choose([a, b, c], 0.04)].num_workers == 1  # a mean (80) would pick 2
    assert search_module.setting_rates([a, b, c])[search_module.settings_key(a.settings)] == 100.0


@given(st.lists(st.floats(1.0, 1e4), min_size=1, max_size=10), st.floats(0.0, 0.5))
def test_choice_is_within_tolerance_of_the_best(rates: list[float], tolerance: float) -> None:
    fake = model(lambda s: rates[s["num_workers"]])
    trials = [fake(None, loader_kwargs(w), batch_size=1, window_s=1, min_batches=1, consumer=None,
                   deadline=None, phase="") for w in range(len(rates))]
    chosen = trials[choose(trials, tolerance)]
    assert chosen.images_per_s * (1 + tolerance) >= max(rates)
    # and nothing cheaper would have been
    assert all(r * (1 + tolerance) < max(rates) for r in rates[: chosen.num_workers])


def test_search_arguments_are_checked() -> None:
    with pytest.raises(ValueError, match="budget_s=0"):
        search_settings(None, batch_size=1, cap=2, budget_s=0)
    with pytest.raises(ValueError, match="tolerance=1.5"):
        search_settings(None, batch_size=1, cap=2, tolerance=1.5)


# -- settings -----------------------------------------------------------------------------------
def test_loader_kwargs_are_valid_for_dataloader() -> None:
    for kwargs in [loader_kwargs(0, pin_memory=True), *grid_candidates(2, can_pin=True)]:
        DataLoader(list(range(4)), **kwargs)  # DataLoader refuses invalid combinations
    assert loader_kwargs(0) == {"num_workers": 0, "pin_memory": False, "prefetch_factor": None,
                                "persistent_workers": False}
    with pytest.raises(ValueError, match="num_workers=-1"):
        loader_kwargs(-1)
    with pytest.raises(ValueError, match="prefetch_factor=0"):
        loader_kwargs(2, prefetch_factor=0)


def test_candidates_are_completed_and_checked() -> None:
    assert normalise_candidate({"num_workers": 3}) == loader_kwargs(3)
    assert normalise_candidate({"num_workers": 0, "prefetch_factor": 4})["prefetch_factor"] is None
    with pytest.raises(ValueError, match=r"unknown key\(s\) \['workers'\]"):
        normalise_candidate({"workers": 2})


def test_grid_candidates_cover_the_search_space() -> None:
    grid = grid_candidates(3, can_pin=True)
    assert len(grid) == 2 * (1 + 3 * 2)
    assert {g["num_workers"] for g in grid} == {0, 1, 2, 3}


# -- busy machines: fewer workers, and the explanation says why ----------------------------------
def test_worker_cap_follows_free_cpus() -> None:
    assert worker_cap(machine(8), None, True) == (8, "usable")
    assert worker_cap(machine(8, busy=3.0), None, True) == (5, "busy")
    assert worker_cap(machine(2, busy=2.0), None, True) == (1, "busy")
    assert worker_cap(machine(8, busy=3.0), None, False) == (8, "usable")
    assert worker_cap(machine(8, busy=3.0), 12, True) == (12, "max_workers")


def _tune_on_model(monkeypatch: pytest.MonkeyPatch, probe: MachineProbe, rate: Callable, **kwargs: Any) -> TuneResult:
    monkeypatch.setattr(tuner, "probe_machine", lambda busy_window_s: probe)
    monkeypatch.setattr(
        tuner, "search_settings", functools.partial(search_module.search_settings, measure_fn=model(rate))
    )
    ds = SpinDataset(64, ms=0.0)
    return tune_loader(ds, batch_size=8, loader_factory=lambda **kw: None, cache=False, **kwargs)


def test_busy_machine_gets_fewer_workers_and_is_told_why(monkeypatch: pytest.MonkeyPatch) -> None:
    # a CPU-hungry loader that, greedily measured, would take every CPU it can get
    idle = _tune_on_model(monkeypatch, machine(8), knee(16))
    busy = _tune_on_model(monkeypatch, machine(8, busy=5.0), knee(16))
    assert idle.recommended["num_workers"] == 8
    assert busy.recommended["num_workers"] == 3
    assert busy.cap_reason == "busy"
    assert "5 busy with other processes" in busy.explanation
    assert "3 free" in busy.explanation
    assert "only 3 of 8 CPUs are free" in busy.explanation
    assert busy.cpus == {"usable": 8, "busy": 5.0, "free": 3.0, "logical": 8, "physical": 8}


def test_explanation_gives_the_numbers(monkeypatch: pytest.MonkeyPatch) -> None:
    r = _tune_on_model(monkeypatch, machine(64), knee(12))
    text = r.explanation
    assert r.recommended["num_workers"] == 12
    assert "Choice: 12 workers: 1200 img/s" in text
    assert "16 workers: 1200 img/s (+0 %)" in text and "11 workers: 1100 img/s (-8 %)" in text
    assert "each worker holds 100 MiB" in text
    assert "pin_memory=False: no CUDA/XPU device" in text
    assert "persistent_workers=True" in text
    assert text.count("\n") >= 5
    assert "1200 img/s" in r.summary


def test_explanation_with_an_accelerator(monkeypatch: pytest.MonkeyPatch) -> None:

    def rate(s):
        return knee(2)(s) * (1.25 if s["pin_memory"] else 1.0)

    r = _tune_on_model(monkeypatch, machine(2, can_pin=True), rate, device=None)
    assert r.recommended["pin_memory"] is True
    assert "pin_memory=True: 250 img/s against 200 img/s unpinned" in r.explanation
    assert "Choice: 2 workers, pinned: 250 img/s" in r.explanation and "2 workers: 200 img/s (-20 %)" in r.explanation


# -- real loaders, tiny data --------------------------------------------------------------------
def _children() -> set[int]:
    return {p.pid for p in psutil.Process().children(recursive=True)}


def test_measure_a_real_loader() -> None:
    ds = SpinDataset(48, ms=0.5)
    factory = functools.partial(DataLoader, ds, batch_size=4)
    before = _children()
    t0 = measure_setting(factory, loader_kwargs(0), batch_size=4, window_s=0.1)
    t1 = measure_setting(factory, loader_kwargs(1), batch_size=4, window_s=0.1)
    assert t0.ok and t1.ok
    assert t0.images == 4 * t0.batches and t0.images_per_s > 0
    assert t0.workers == 0 and t0.worker_uss_mib is None and t0.main_cpu > 0
    assert t1.workers == 1 and t1.worker_uss_mib is not None and t1.worker_uss_mib > 0
    assert t1.latency_p95_ms >= t1.latency_p50_ms >= 0
    assert t1.startup_s > 0
    assert _children() == before  # workers were stopped


def test_rate_is_counted_between_waited_for_batches() -> None:
    from detloader.tune.measure import steady_rate

    # 3 workers in step: a burst of 3 batches of 10 images per second -> 30 img/s. The window
    # starts inside a burst (two queued batches), so counting everything says 35 img/s.
    arrivals = [0.0, 0.01, 0.99, 1.0, 1.01, 1.99, 2.0, 2.01]
    waits = [0.0, 0.0, 0.97, 0.0, 0.0, 0.97, 0.0, 0.0]
    images, batches, seconds = steady_rate(arrivals, waits, [10] * 8, wall=2.01)
    assert (images, batches) == (30, 3) and seconds == pytest.approx(1.0)
    # a consumer slower than the loader never waits: the whole window counts
    assert steady_rate([0.0, 0.1, 0.2], [0.0, 0.0, 0.0], [10] * 3, wall=0.3) == (30, 3, 0.3)
    # every batch waited for (loading in the main process): first to last arrival
    images, batches, seconds = steady_rate([0.0, 0.1, 0.2], [0.1, 0.1, 0.1], [10] * 3, wall=0.3)
    assert (images, batches) == (20, 2) and seconds == pytest.approx(0.2)
    # waited-for batches too close together to span a third of the window: the whole window
    assert steady_rate([0.0, 0.01, 1.0], [0.5, 0.5, 0.0], [10] * 3, wall=1.0) == (30, 3, 1.0)
    assert steady_rate([0.0], [0.0], [10], wall=0.1) == (10, 1, 0.1)


def test_measure_records_a_failing_setting() -> None:
    def broken(**kwargs: Any) -> DataLoader:
        return DataLoader(SpinDataset(8, 0.0), batch_size=4, multiprocessing_context="nope", **kwargs)

    t = measure_setting(broken, loader_kwargs(1), batch_size=4, window_s=0.05)
    assert not t.ok and "nope" in (t.error or "")


def test_measure_with_a_consumer_reports_the_wait() -> None:
    from detloader.tune.measure import make_consumer

    ds = SpinDataset(32, ms=0.0)
    consumer = make_consumer(0.01, None, False)  # a 10 ms step, data is free
    t = measure_setting(functools.partial(DataLoader, ds, batch_size=4), loader_kwargs(0), batch_size=4,
                window_s=0.1, consumer=consumer)
    assert t.step_ms is not None and t.step_ms >= 9.0
    assert t.wait_fraction is not None and t.wait_fraction < 0.5
    with pytest.raises(ValueError, match="step_time=-1"):
        make_consumer(-1, None, False)


def test_probe_dataset_times_items(small_synth_root) -> None:
    from detloader import read_annotations

    index = read_annotations(small_synth_root)
    probe = probe_dataset(FileDataset(index), batch_size=4, max_images=8)
    assert probe.images >= 1 and probe.ms_per_image > 0
    assert probe.batch_bytes == 4 * 8  # four int64 sizes
    plain = probe_dataset(SpinDataset(3, ms=1.0), batch_size=2)
    assert plain.ms_per_image >= 0.9
    assert plain.batch_bytes == 2 * 3 * 16 * 16
    with pytest.raises(ValueError, match="empty"):
        probe_dataset(SpinDataset(0), batch_size=2)


def test_probe_machine_is_consistent() -> None:
    m = probe_machine(busy_window_s=0.05)
    assert 1 <= m.usable_cpus <= m.affinity_cpus <= m.logical_cpus
    assert 0.0 <= m.free_cpus <= m.usable_cpus
    assert m.memory_available > 0 and m.memory_total > 0
    assert MachineProbe.from_dict(m.to_dict()) == m


@pytest.fixture
def fast_probe(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(tuner, "BUSY_WINDOW_S", 0.1)
    # a steady load: these tests reuse cached results, which re-checks the load (freshness)
    monkeypatch.setattr(_system, "busy_cpus", lambda window_s=0.5: 0.0)
    monkeypatch.setattr(_system, "busy_now", lambda: 0.0)


def test_tune_loader_on_a_tiny_dataset(fast_probe: None) -> None:
    ds = SpinDataset(64, ms=1.0)
    factory = functools.partial(DataLoader, ds, batch_size=8, shuffle=True)
    seen: list[tuple[int, int]] = []
    r = tune_loader(ds, batch_size=8, loader_factory=factory, budget_s=2.5,
                    progress=lambda done, total: seen.append((done, total)))
    assert set(r.recommended) == {"num_workers", "pin_memory", "prefetch_factor", "persistent_workers"}
    DataLoader(ds, batch_size=8, **r.recommended)  # valid as given
    assert r.trials and all(t.ok for t in r.trials)
    assert r.recommended["num_workers"] <= r.worker_cap
    rates = search_module.setting_rates(r.trials)
    chosen_rate = rates[search_module.settings_key(r.chosen_trial.settings)]
    assert chosen_rate * (1 + r.tolerance) >= max(rates.values())
    assert r.spent_s < 2.5 + 4.0  # the first setting always runs, even past a tiny budget
    assert seen and all(total == 2 for _, total in seen)
    assert "img/s" in r.explanation and "CPUs:" in r.explanation
    # JSON round trip
    again = TuneResult.from_json(r.to_json())
    assert again.to_dict() == r.to_dict()
    assert again.recommended == r.recommended and again.trials == r.trials
    # cached: the same call returns the stored result without measuring
    assert saved.cache_file(r.key).is_file()
    t = time.perf_counter()
    cached = tune_loader(ds, batch_size=8, loader_factory=factory, budget_s=2.5)
    assert time.perf_counter() - t < 1.0
    assert cached.created == r.created and cached.recommended == r.recommended
    assert cached.from_cache and not r.from_cache
    # a different batch size or transform is another entry
    assert saved.cache_key(ds, 16)["batch_size"] == 16
    assert saved.load_result(saved.cache_key(ds, 16)) is None
    # make_loader(num_workers="auto") uses it
    kwargs, reason = auto_loader_kwargs(ds, 8)
    assert kwargs == r.recommended and reason.startswith("tuned:")


@pytest.mark.slow
def test_tune_loader_refresh_and_grid(fast_probe: None) -> None:
    ds = SpinDataset(64, ms=1.0)
    factory = functools.partial(DataLoader, ds, batch_size=8)
    first = tune_loader(ds, batch_size=8, loader_factory=factory, budget_s=2.0)
    time.sleep(1.1)
    fresh = tune_loader(ds, batch_size=8, loader_factory=factory, budget_s=2.0, cache="refresh")
    assert fresh.created != first.created
    assert saved.load_result(first.key).created == fresh.created
    grid = tune_loader(ds, batch_size=8, loader_factory=factory, budget_s=60.0,
                       candidates=[{"num_workers": 0}, {"num_workers": 1}, {"num_workers": 2, "prefetch_factor": 4}])
    assert grid.stop == "grid" and [t.num_workers for t in grid.trials] == [0, 1, 2]
    assert grid.cap_reason == "candidates"


def test_tune_loader_checks_its_arguments() -> None:
    ds = SpinDataset(4)
    with pytest.raises(ValueError, match="batch_size=0"):
        tune_loader(ds, batch_size=0)
    with pytest.raises(ValueError, match="budget_s=-1"):
        tune_loader(ds, budget_s=-1)
    with pytest.raises(ValueError, match="cache='always'"):
        tune_loader(ds, cache="always")
    with pytest.raises(ValueError, match="empty"):
        tune_loader(SpinDataset(0))
    with pytest.raises(ValueError, match="candidates=\\[\\]"):
        tune_loader(ds, candidates=[])


def test_plot_is_written(tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("matplotlib")
    r = _tune_on_model(monkeypatch, machine(8), knee(4))
    out = r.plot(str(tmp_path / "tune.png"))
    assert (tmp_path / "tune.png").stat().st_size > 1000 and out.endswith("tune.png")


# -- JSON and cache -----------------------------------------------------------------------------
def test_result_json_refuses_other_versions_and_missing_fields(monkeypatch: pytest.MonkeyPatch) -> None:
    r = _tune_on_model(monkeypatch, machine(4), knee(2))
    data = json.loads(r.to_json())
    assert set(data["cpus"]) >= {"usable", "busy"}
    assert data["trials"][0]["images_per_s"] > 0
    with pytest.raises(ValueError, match="version=99"):
        TuneResult.from_dict({**data, "version": 99})
    broken = dict(data)
    del broken["trials"]
    with pytest.raises(ValueError, match="trials"):
        TuneResult.from_dict(broken)
    with pytest.raises(ValueError, match="not JSON"):
        TuneResult.from_json("{")
    bad = len(data["trials"])
    with pytest.raises(ValueError, match=f"chosen={bad}"):
        TuneResult.from_dict({**data, "chosen": bad})


def test_cache_round_trip_and_damage(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:
    r = _tune_on_model(monkeypatch, machine(4), knee(2))
    ds = SpinDataset(64, ms=0.0)
    r.key = saved.cache_key(ds, 8)
    path = saved.save_result(r)
    assert path.parent == saved.tune_cache_dir()
    assert saved.load_result(r.key).to_dict() == r.to_dict()
    path.write_text("{ damaged")
    assert saved.load_result(r.key) is None  # measured again, not an error
    assert saved.load_result({**r.key, "batch_size": 9}) is None
    r.key = {}
    with pytest.raises(ValueError, match="no key"):
        saved.save_result(r)


def test_keys_ignore_memory_addresses() -> None:
    class WithTransform(SpinDataset):
        def __init__(self, transform: Any) -> None:
            super().__init__(8)
            self.transform = transform

    key = saved.cache_key(WithTransform(lambda x: x), 4)
    assert " at 0x" not in key["transform"] and "lambda" in key["transform"]
    assert saved.cache_key(SpinDataset(8), 4) == saved.cache_key(SpinDataset(8), 4)
    assert saved.cache_key(SpinDataset(8), 4)["dataset"] != saved.cache_key(SpinDataset(9), 4)["dataset"]
    assert saved.cache_key(SpinDataset(8), 4)["transform"] == "None"


def test_index_key_follows_the_annotations(small_synth_root) -> None:
    from detloader import read_annotations

    index = read_annotations(small_synth_root)
    key = saved.cache_key(FileDataset(index), 4)["dataset"]
    assert key == saved.cache_key(FileDataset(read_annotations(small_synth_root)), 4)["dataset"]
    assert key != saved.cache_key(FileDataset(index.subset(np.arange(5))), 4)["dataset"]


# -- heuristic ----------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("free", "processes", "memory", "workers", "threads"),
    [
        (16.0, 1, 64 * GIB, 8, 0),  # one CPU stays with the training process, at most 8 workers
        (4.0, 1, 64 * GIB, 3, 0),
        (3.0, 1, 64 * GIB, 2, 0),
        (2.0, 1, 64 * GIB, 2, 0),  # 2 CPUs: 2 workers (measured fastest, with their reused buffers)
        (1.5, 1, 64 * GIB, 2, 0),  # 1.5 free CPUs count as 2
        (1.4, 1, 64 * GIB, 0, 0),  # a single CPU: loading in the main process
        (1.0, 1, 64 * GIB, 0, 0),
        (0.0, 1, 64 * GIB, 0, 0),
        (64.0, 8, 64 * GIB, 7, 0),  # torchrun with 8 processes: 8 CPUs each
        (32.0, 1, 2 * WORKER_MEMORY_GUESS * 3, 3, 0),  # memory for 3 workers at half the available
        (32.0, 1, WORKER_MEMORY_GUESS, 0, 2),  # memory for no worker: threads
    ],
)
def test_heuristic(free: float, processes: int, memory: int, workers: int, threads: int) -> None:
    kwargs, reason = heuristic_loader_kwargs(free=free, memory_available=memory, can_pin=False, processes=processes)
    assert kwargs == {**loader_kwargs(workers, prefetch_factor=2, persistent_workers=True), "decode_threads": threads}
    assert reason.startswith("heuristic:") and f"num_workers={workers}, decode_threads={threads}" in reason


@pytest.mark.parametrize(
    ("affinity", "quota", "load", "workers", "threads"),
    [
        (1, None, 0.0, 0, 0),
        (2, None, 0.0, 2, 0),
        (2, None, 1.0, 2, 0),  # our own process is the load's one task
        (2, None, 2.0, 2, 0),  # another job keeps one CPU busy: the load is not read, the choice stays
        (2, None, 5.0, 2, 0),
        (4, None, 0.0, 3, 0),
        (16, None, 0.0, 8, 0),
        (16, 2.0, 0.0, 2, 0),  # 16 CPUs in the affinity mask, a cgroup quota of 2
        (16, None, 9.0, 8, 0),  # 8 CPUs' worth of other tasks: the same as on the quiet machine
    ],
)
def test_auto_default_on_fake_machines(monkeypatch: pytest.MonkeyPatch, affinity: int, quota: float | None,
                                       load: float, workers: int, threads: int) -> None:
    """The untuned default from the usable CPUs (affinity, cgroup quota), whatever the load."""
    from detloader._system import cpus

    monkeypatch.setattr(cpus.os, "sched_getaffinity", lambda _pid: set(range(affinity)))
    monkeypatch.setattr(cpus.os, "cpu_count", lambda: affinity)
    monkeypatch.setattr(cpus, "load_figures", lambda: (load, int(load) + 1))  # averaged, running now
    monkeypatch.setattr(cpus, "cgroup_cpu_limit", lambda: quota)
    monkeypatch.setattr(_system, "busy_cpus", _never_watch)
    monkeypatch.setattr(_system, "accelerator_info", lambda: (None, None, 0))
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "1")
    kwargs, _ = auto_loader_kwargs(SpinDataset(8), 4, warn=False, decode_threads=True)
    assert (kwargs["num_workers"], kwargs["decode_threads"]) == (workers, threads)


@pytest.mark.parametrize("affinity", [2, 4, 16])
def test_untuned_default_is_stable_under_a_fluctuating_load(monkeypatch: pytest.MonkeyPatch, affinity: int) -> None:
    """The same choice on every call while the load figures jump around the busy thresholds
    (one other task more or less at each instant, averages on both sides of half a CPU)."""
    from detloader._system import cpus

    readings = iter([(0.4, 1), (1.6, 2), (1.4, 1), (2.6, 3), (0.9, 2), (1.51, 1), (3.0, 4), (1.49, 2)] * 2)
    monkeypatch.setattr(cpus.os, "sched_getaffinity", lambda _pid: set(range(affinity)))
    monkeypatch.setattr(cpus.os, "cpu_count", lambda: affinity)
    monkeypatch.setattr(cpus, "load_figures", lambda: next(readings))
    monkeypatch.setattr(cpus, "cgroup_cpu_limit", lambda: None)
    monkeypatch.setattr(_system, "busy_cpus", _never_watch)
    monkeypatch.setattr(_system, "accelerator_info", lambda: (None, None, 0))
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "1")
    choices = {tuple(auto_loader_kwargs(SpinDataset(8), 4, warn=False, decode_threads=True)[0].items())
               for _ in range(16)}
    assert len(choices) == 1, choices
    assert dict(choices.pop())["num_workers"] == min(affinity - 1, 8) if affinity > 2 else 2


@pytest.mark.parametrize(
    ("figures", "logical", "busy"),
    [
        ((3.0, 1), 2, 0.0),  # the average remembers work that just ended; nothing else runs now
        ((3.0, 3), 2, 2.0),  # steady: two tasks besides this process
        ((3.0, None), 2, 2.0),  # no instant count (not Linux): the average alone
        ((1.0, 1), 2, 0.0),  # this process alone
        ((33.0, 40), 64, 1.0),  # 32 tasks of others on 64 CPUs: half of our 2
    ],
)
def test_busy_now(
    monkeypatch: pytest.MonkeyPatch, figures: tuple[float, int | None], logical: int, busy: float
) -> None:
    from detloader._system import cpus

    monkeypatch.setattr(cpus, "load_figures", lambda: figures)
    monkeypatch.setattr(cpus, "affinity_cpus", lambda: 2)
    monkeypatch.setattr(cpus, "logical_cores", lambda: logical)
    assert cpus.busy_now() == pytest.approx(busy)


def _never_watch(window_s: float = 0.5) -> float:
    raise AssertionError("num_workers='auto' must not watch the CPUs")


def test_make_loader_auto_is_quick_and_never_watches_the_cpus(monkeypatch: pytest.MonkeyPatch,
                                                               small_synth_root: Path) -> None:
    from detloader.tune import probe

    monkeypatch.setattr(_system, "busy_cpus", _never_watch)
    monkeypatch.setattr(probe, "probe_machine", _never_watch)
    dataset = DetectionDataset(read_annotations(small_synth_root), Resize(32), seed=0)
    times = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", TuneWarning)  # no tuning result: the heuristic
        make_loader(dataset, batch_size=4, num_workers="auto")  # imports and first-time work
        for _ in range(5):
            t0 = time.perf_counter()
            make_loader(dataset, batch_size=4, num_workers="auto")
            times.append(time.perf_counter() - t0)
    assert statistics.median(times) <= 0.15, times


def test_heuristic_on_a_busy_machine_keeps_decode_threads() -> None:
    """Others keep half a CPU or more busy: threads in the main process instead of 2 workers."""
    kwargs, reason = heuristic_loader_kwargs(free=0.4, usable=2, memory_available=8 * GIB, can_pin=False)
    assert (kwargs["num_workers"], kwargs["decode_threads"]) == (0, 2) and "0.4 of 2 CPUs free" in reason
    kwargs, _ = heuristic_loader_kwargs(free=1.6, usable=2, memory_available=8 * GIB, can_pin=False)
    assert (kwargs["num_workers"], kwargs["decode_threads"]) == (2, 0)
    assert heuristic_loader_kwargs(free=0.4, usable=1, memory_available=GIB, can_pin=False)[0]["decode_threads"] == 0
    assert heuristic_loader_kwargs(free=8.0, usable=8, processes=8, memory_available=GIB,
                                   can_pin=False)[0]["decode_threads"] == 0  # 1 CPU per loader


def test_heuristic_pins_with_an_accelerator() -> None:
    kwargs, reason = heuristic_loader_kwargs(free=4.0, memory_available=8 * GIB, can_pin=True)
    assert kwargs["pin_memory"] is True and "pin_memory=True" in reason
    with pytest.raises(ValueError, match="processes=0"):
        heuristic_loader_kwargs(free=4.0, memory_available=GIB, can_pin=False, processes=0)


@given(st.floats(0, 256), st.floats(0, 256), st.integers(1, 8))
def test_heuristic_is_monotone_in_free_cpus(a: float, b: float, processes: int) -> None:
    lo, hi = sorted((a, b))
    w_lo = heuristic_loader_kwargs(free=lo, memory_available=64 * GIB, can_pin=False, processes=processes)[0]
    w_hi = heuristic_loader_kwargs(free=hi, memory_available=64 * GIB, can_pin=False, processes=processes)[0]
    assert w_lo["num_workers"] <= w_hi["num_workers"] <= max(0, round(hi / processes + 1e-9))
    assert w_lo["num_workers"] + w_lo["decode_threads"] <= max(2, round(lo / processes + 1e-9))


def test_auto_without_a_result_warns_and_uses_the_heuristic(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "1")
    with pytest.warns(TuneWarning, match="heuristic"):
        kwargs, reason = auto_loader_kwargs(SpinDataset(8), 4)
    assert reason.startswith("heuristic:")
    DataLoader(SpinDataset(8), batch_size=4, **kwargs)
    with pytest.warns(TuneWarning) as record:  # the warning names the caller's line
        auto_loader_kwargs(SpinDataset(8), 4)
    assert record[0].filename == __file__
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        auto_loader_kwargs(SpinDataset(8), 4, warn=False)
    with pytest.raises(ValueError, match="batch_size=0"):
        auto_loader_kwargs(SpinDataset(8), 0)


# -- the real pipeline and the CLI --------------------------------------------------------------
def test_cli_tune_json_then_cached_text(small_synth_root, tmp_path, capsys, fast_probe: None) -> None:
    from detloader.cli import main

    plot = tmp_path / "tune.png"
    args = ["tune", str(small_synth_root), "--budget", "3", "--size", "96", "--batch-size", "4"]
    assert main([*args, "--json", "--plot", str(plot)]) == 0
    data = json.loads(capsys.readouterr().out)
    assert set(data["recommended"]) == {"num_workers", "pin_memory", "prefetch_factor", "persistent_workers"}
    assert data["explanation"].startswith("CPUs:")
    assert {"usable", "busy"} <= set(data["cpus"])
    assert data["trials"] and all("images_per_s" in t and "settings" in t for t in data["trials"])
    assert data["data"]["ms_per_image"] > 0 and data["data"]["batch_size"] == 4
    assert data["batch_size"] == 4 and "Resize" in data["key"]["transform"]
    assert plot.stat().st_size > 1000
    # the same question again: answered from the cache, as a table and the explanation
    assert main(args) == 0
    out = capsys.readouterr().out
    assert "recommended:" in out and "cached result" in out and "CPUs:" in out
    assert f"decode_threads={data['decode_threads']}" in out  # every setting that mattered


def test_cli_tune_refuses_bad_arguments(small_synth_root, capsys) -> None:
    from detloader.cli import main

    assert main(["tune", str(small_synth_root), "--size", "-1"]) == 2
    assert "--size=-1" in capsys.readouterr().err
    assert main(["tune", str(small_synth_root), "--budget", "0"]) == 2
    assert "budget_s=0" in capsys.readouterr().err


def test_explanation_warns_when_the_load_changed(monkeypatch: pytest.MonkeyPatch) -> None:
    loads = iter([0.1, 1.9, 0.2, 0.3, 1.5, 0.1, 0.2, 0.4, 0.1, 0.2])
    fake = model(knee(2))

    def noisy(*args: Any, **kwargs: Any) -> Trial:
        t = fake(*args, **kwargs)
        t.others_cpu = next(loads, 0.0)
        return t

    monkeypatch.setattr(tuner, "probe_machine", lambda busy_window_s: machine(2))
    monkeypatch.setattr(tuner, "search_settings", functools.partial(search_module.search_settings, measure_fn=noisy))
    r = tune_loader(SpinDataset(8, ms=0.0), batch_size=4, loader_factory=lambda **kw: None, cache=False)
    assert "Noise: other processes took between 0.1 and 1.9 CPUs" in r.explanation
    quiet = _tune_on_model(monkeypatch, machine(2), knee(2))
    assert "Noise" not in quiet.explanation
