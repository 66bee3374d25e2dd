"""Tuning results and the load: stored, re-checked on reuse, re-tuned or warned about; the
user's own dataset (transform chain included) finds its result through num_workers="auto"."""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

import detloader
from detloader import _system
from detloader.dataset import DetectionDataset, Sample
from detloader.loader import make_loader
from detloader.transforms import Compose, RandomHorizontalFlip, Resize
from detloader.tune import TuneWarning, auto_loader_kwargs, saved, tune_loader, tuner
from detloader.tune.measure import loader_kwargs
from detloader.tune.saved import LoadCheck, StaleTuneWarning, check_load, fit_to_load, load_tolerance


class Load:
    """The busy-CPU probe, set by the test."""

    def __init__(self) -> None:
        self.busy = 0.0

    def __call__(self, window_s: float = 0.5) -> float:
        return self.busy


@pytest.fixture
def load(monkeypatch: pytest.MonkeyPatch) -> Load:
    probe = Load()
    monkeypatch.setattr(_system, "busy_cpus", probe)  # the tuner's probe
    monkeypatch.setattr(_system, "busy_now", probe)  # the instant figure of reuses
    monkeypatch.setattr(tuner, "BUSY_WINDOW_S", 0.05)
    return probe


class Brighten:
    """A user transform with the default ``<X object>`` repr: its parameter must still count."""

    def __init__(self, amount: int) -> None:
        self.amount = amount

    def __call__(self, data: Any, rng: np.random.Generator) -> Any:
        data.image = np.clip(data.image.astype(np.int16) + self.amount, 0, 255).astype(np.uint8)
        return data


class MyDataset(torch.utils.data.Dataset):
    """A user's own dataset: wraps a DetectionDataset and runs its own chain on each Sample."""

    def __init__(self, base: DetectionDataset, transforms: list[Any]) -> None:
        self.base = base
        self.transforms = transforms

    def __len__(self) -> int:
        return len(self.base)

    def __getitem__(self, i: int) -> Sample:
        sample = self.base[i]
        for t in self.transforms:
            sample = t(sample)
        return sample


def keep(sample: Sample) -> Sample:
    return sample


def invert(sample: Sample) -> Sample:
    return Sample(**{**sample.__dict__, "image": 255 - sample.image})


def _tune(dataset: Any, **kwargs: Any) -> Any:
    return tune_loader(dataset, batch_size=4, max_workers=0, budget_s=1.0, **kwargs)


def _dataset(root: Path, amount: int = 10) -> DetectionDataset:
    chain = Compose([RandomHorizontalFlip(), Brighten(amount), Resize(64, mode="letterbox")])
    return DetectionDataset(detloader.read_annotations(root), chain, seed=0)


def test_load_is_stored_and_reuse_retunes_or_warns_when_it_changed(small_synth_root: Path, load: Load) -> None:
    ds = _dataset(small_synth_root)
    usable = _system.usable_cpus()
    first = _tune(ds)
    assert not first.from_cache and first.machine.free_cpus == pytest.approx(min(usable, _system.affinity_cpus()))
    stored = saved.load_result(first.key)
    assert stored is not None and stored.machine.free_cpus == first.machine.free_cpus  # the load seen
    assert _tune(ds).from_cache  # same load: reused
    load.busy = float(_system.affinity_cpus())  # every CPU busy with other jobs now
    with pytest.warns(StaleTuneWarning, match="busier") as said:
        warned = _tune(ds, on_load_change="warn")
    assert [w.filename for w in said if "stored tuning result" in str(w.message)] == [__file__]  # the caller
    assert warned.from_cache and warned.created == first.created
    assert _tune(ds, on_load_change="ignore").from_cache
    retuned = _tune(ds)  # the default: measure again under this load, and replace the result
    assert not retuned.from_cache and retuned.machine.free_cpus == 0.0
    assert saved.load_result(first.key).machine.free_cpus == 0.0
    assert _tune(ds).from_cache  # and that one is now fresh
    with pytest.raises(ValueError, match="on_load_change='maybe'"):
        _tune(ds, on_load_change="maybe")


def test_make_loader_auto_warns_and_caps_workers_when_busier(small_synth_root: Path, load: Load) -> None:
    ds = _dataset(small_synth_root)
    result = _tune(ds)
    result.recommended = loader_kwargs(3, prefetch_factor=2, persistent_workers=True)  # as if measured so
    saved.save_result(result)
    with warnings.catch_warnings():
        warnings.simplefilter("error", TuneWarning)
        kwargs, reason = auto_loader_kwargs(ds, 4)
    assert kwargs["num_workers"] == 3 and reason.startswith("tuned:")
    load.busy = float(_system.affinity_cpus())
    with pytest.warns(StaleTuneWarning, match="num_workers=1 instead of the tuned 3"):
        kwargs, reason = auto_loader_kwargs(ds, 4)
    assert kwargs == loader_kwargs(1, prefetch_factor=2, persistent_workers=True)
    assert "load changed" in reason
    with pytest.warns(StaleTuneWarning):
        loader = make_loader(ds, batch_size=4, num_workers="auto")
    assert loader.num_workers == 1


def test_fit_to_load_rules() -> None:
    assert load_tolerance(2) == 1.0 and load_tolerance(64) == 16.0
    busier = LoadCheck(then=8.0, now=2.4, usable=8, tolerance=2.0)
    assert busier.changed and busier.busier and "busier" in busier.describe()
    assert fit_to_load(loader_kwargs(6), busier)["num_workers"] == 2
    assert fit_to_load(loader_kwargs(0), busier) == loader_kwargs(0)
    quieter = LoadCheck(then=2.0, now=8.0, usable=8, tolerance=2.0)
    assert quieter.changed and not quieter.busier
    assert fit_to_load(loader_kwargs(1), quieter) == loader_kwargs(1)  # kept, with a warning
    assert not LoadCheck(then=4.0, now=4.9, usable=8, tolerance=2.0).changed


def test_check_load_reads_the_instant_figure_and_never_watches(monkeypatch: pytest.MonkeyPatch) -> None:
    def watch(window_s: float = 0.5) -> float:
        raise AssertionError("the load re-check must not watch the CPUs")

    monkeypatch.setattr(_system, "busy_cpus", watch)
    monkeypatch.setattr(_system, "busy_now", lambda: 2.0)
    monkeypatch.setattr(_system, "usable_cpus", lambda: 2)
    monkeypatch.setattr(_system, "affinity_cpus", lambda: 2)

    class Result:
        class machine:
            free_cpus = 2.0

    check = check_load(Result())
    assert check.now == 0.0 and check.changed and check.busier


def test_auto_finds_the_result_of_a_dataset_with_its_transform_chain(small_synth_root: Path, load: Load) -> None:
    ds = _dataset(small_synth_root, amount=10)
    result = _tune(ds)
    with warnings.catch_warnings():
        warnings.simplefilter("error", TuneWarning)  # a heuristic fallback would fail here
        loader = make_loader(_dataset(small_synth_root, amount=10), batch_size=4, num_workers="auto")
    assert loader.num_workers == result.recommended["num_workers"]
    with pytest.warns(TuneWarning, match="heuristic"):  # another parameter: another chain
        auto_loader_kwargs(_dataset(small_synth_root, amount=20), 4)


def test_auto_finds_the_result_of_a_users_own_dataset(small_synth_root: Path, load: Load) -> None:
    base = _dataset(small_synth_root)
    mine = MyDataset(base, [keep, invert])
    result = _tune(mine)  # Samples: measured with collate_detection, as make_loader batches them
    assert result.trials[0].ok, result.trials[0].error
    with warnings.catch_warnings():
        warnings.simplefilter("error", TuneWarning)
        loader = make_loader(MyDataset(_dataset(small_synth_root), [keep, invert]), batch_size=4, num_workers="auto")
    assert loader.num_workers == result.recommended["num_workers"]
    assert next(iter(loader)).images.shape == (4, 3, 64, 64)
    for other in (MyDataset(base, [keep]), MyDataset(_dataset(small_synth_root, amount=30), [keep, invert]),
                  torch.utils.data.Subset(mine, range(5))):
        assert saved.cache_key(other, 4) != result.key
        with pytest.warns(TuneWarning, match="heuristic"):
            auto_loader_kwargs(other, 4)
