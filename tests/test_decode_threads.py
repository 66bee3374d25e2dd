"""Loading a batch on threads (``decode_threads``): same batches for any threads and workers,
the make_loader pass-through, the tuner's search over it, and the channel-first canvases."""

from __future__ import annotations

import dataclasses
import functools
import gc
import threading
import time
from collections.abc import Mapping
from typing import Any

import numpy as np
import pytest
import torch
from torch.utils.data import Dataset
from tune_helpers import model

from detloader import DetectionDataset, make_loader, read_annotations, set_epoch, tune_loader
from detloader.collate import Batch, collate_detection
from detloader.transforms import ColorJitter, Compose, RandomHorizontalFlip, Resize
from detloader.transforms.base import Annotated
from detloader.transforms.functional import chw_tensor, crop_image, pad_image, resize_image
from detloader.tune import TuneResult, auto_loader_kwargs, tuner
from detloader.tune import search as search_module
from detloader.tune.search import choose, search_settings, thread_ladder


def _augment() -> Compose:
    return Compose([RandomHorizontalFlip(), ColorJitter(0.3, 0.3, 0.3), Resize(96, mode="letterbox")])


def _batches(loader: Any, epochs: int = 2) -> list[Batch]:
    out = []
    for epoch in range(epochs):
        set_epoch(loader, epoch)
        out += list(loader)
    return out


def _same(a: Batch, b: Batch) -> bool:
    for f in dataclasses.fields(Batch):
        x, y = getattr(a, f.name), getattr(b, f.name)
        if isinstance(x, torch.Tensor):
            if x.dtype != y.dtype or x.shape != y.shape or not torch.equal(x, y):
                return False
        elif x != y:
            return False
    return True


def test_batches_are_identical_for_any_workers_and_threads(small_synth_root) -> None:
    index = read_annotations(small_synth_root)
    dataset = DetectionDataset(index, _augment(), seed=5)
    runs = {
        (w, t): _batches(make_loader(dataset, batch_size=5, shuffle=True, seed=1, num_workers=w,
                                     decode_threads=t))
        for w in (0, 2) for t in (0, 2)
    }
    reference = runs[(0, 0)]
    assert len(reference) == 2 * 5  # 24 images in batches of 5, two epochs
    assert not _same(reference[0], reference[5])  # epochs differ (order and augmentation)
    for setting, batches in runs.items():
        assert len(batches) == len(reference), setting
        assert all(_same(a, b) for a, b in zip(reference, batches)), setting


class _Recording(Compose):
    """Records the thread each sample is transformed on."""

    def __init__(self, transforms: list[Any]) -> None:
        super().__init__(transforms)
        self.threads: list[str] = []

    def __call__(self, data: Annotated, rng: np.random.Generator) -> Annotated:
        self.threads.append(threading.current_thread().name)
        return super().__call__(data, rng)


def test_getitems_loads_on_threads_and_matches_getitem(small_synth_root) -> None:
    index = read_annotations(small_synth_root)
    transform = _Recording([RandomHorizontalFlip(), Resize(64, mode="letterbox")])
    dataset = DetectionDataset(index, transform, seed=2, decode_threads=3)
    ids = [3, 0, -1, 7, 7, 12]
    got = dataset.__getitems__(ids)
    assert len(transform.threads) == len(ids)
    assert all(name.startswith("detloader-decode") for name in transform.threads)
    assert threading.active_count() == 1 or not any(
        t.name.startswith("detloader-decode") for t in threading.enumerate()
    )  # no thread outlives the call
    for i, sample in zip(ids, got):
        one = dataset[i]
        assert sample.image_id == one.image_id == i % len(index)
        assert torch.equal(sample.image, one.image)
        assert np.array_equal(sample.boxes, one.boxes) and sample.scale == one.scale
    with pytest.raises(IndexError, match="i=24"):
        dataset.__getitems__([0, 24])
    sequential = DetectionDataset(index, transform, seed=2)
    transform.threads.clear()
    sequential.__getitems__([1, 2])
    assert transform.threads == [threading.current_thread().name] * 2


class _Timed(Compose):
    """Records when each image starts its transform (a slow one: 20 ms)."""

    def __init__(self, transforms: list[Any]) -> None:
        super().__init__(transforms)
        self.started: list[float] = []

    def __call__(self, data: Annotated, rng: np.random.Generator) -> Annotated:
        self.started.append(time.monotonic())
        time.sleep(0.02)
        return super().__call__(data, rng)


def _decode_threads_alive() -> int:
    return sum(t.name.startswith("detloader-decode") for t in threading.enumerate())


def test_loader_loads_the_next_batch_while_the_loop_uses_this_one(small_synth_root) -> None:
    """num_workers=0 with decode threads: batch k + 1 is loading on the threads before the
    loop asks for it; the threads have ended when the epoch ends or the iterator is dropped
    (a thread still running when a later loader forks its workers aborted some at exit)."""
    index = read_annotations(small_synth_root)
    transform = _Timed([Resize(32)])
    dataset = DetectionDataset(index, transform, seed=0, decode_threads=2)
    loader = make_loader(dataset, batch_size=4, decode_threads=2)
    it = iter(loader)
    next(it)
    time.sleep(0.3)  # the training step
    asked = time.monotonic()
    next(it)
    assert sum(t < asked for t in transform.started) == 8  # batches 0 and 1: 1 loaded during the step
    assert _decode_threads_alive() == 2
    assert len(list(it)) == len(index) // 4 - 2
    assert _decode_threads_alive() == 0  # joined before the epoch ends: a fork right after finds none
    it = iter(loader)
    next(it)
    del it
    gc.collect()
    assert _decode_threads_alive() == 0


def test_load_ahead_collates_on_the_threads(small_synth_root) -> None:
    """The collate runs on the decode threads too: the loop's thread only waits for batches
    (with torch's intra-op threads on busy cores, a collate in the loop's thread made the
    threads wait for it, docs/tuning.md)."""
    index = read_annotations(small_synth_root)
    seen: list[str] = []

    def collate(samples: list[Any]) -> Batch:
        seen.append(threading.current_thread().name)
        return collate_detection(samples)

    loader = make_loader(DetectionDataset(index, Resize(32)), batch_size=8, decode_threads=2, collate_fn=collate)
    assert len(list(loader)) == 3
    assert len(seen) == 3 and all(name.startswith("detloader-decode") for name in seen), seen


def test_set_epoch_between_batches_loads_the_new_epoch(small_synth_root) -> None:
    index = read_annotations(small_synth_root)
    dataset = DetectionDataset(index, _augment(), seed=3, decode_threads=2)
    loader = make_loader(dataset, batch_size=4, decode_threads=2)
    it = iter(loader)
    next(it)
    loader.dataset.set_epoch(1)  # the second batch was loading for epoch 0
    got = next(it)
    loader.dataset.set_epoch(1)
    expected = collate_detection(loader.dataset.__getitems__(list(range(4, 8))))
    assert _same(got, expected)


@pytest.mark.parametrize("bad", [-1, 1.5, True, "2"])
def test_decode_threads_is_checked(small_synth_root, bad: Any) -> None:
    index = read_annotations(small_synth_root)
    with pytest.raises(ValueError, match="decode_threads="):
        DetectionDataset(index, decode_threads=bad)
    with pytest.raises(ValueError, match="decode_threads="):
        make_loader(DetectionDataset(index), batch_size=2, decode_threads=bad)


class _Plain(Dataset):
    def __len__(self) -> int:
        return 4

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        return torch.zeros(3, 8, 8, dtype=torch.uint8), torch.zeros(0, 4), torch.zeros(0)


def test_make_loader_passes_decode_threads_on_a_copy(small_synth_root) -> None:
    index = read_annotations(small_synth_root)
    dataset = DetectionDataset(index, Resize(32), seed=0)
    loader = make_loader(dataset, batch_size=4, decode_threads=2)
    assert loader.dataset is not dataset and loader.dataset.decode_threads == 2
    assert dataset.decode_threads == 0  # the caller's dataset is not changed
    dataset.set_epoch(3)
    assert loader.dataset.epoch == 3  # the copy shares the epoch
    assert "decode_threads=2" in repr(loader.dataset)
    assert make_loader(dataset, batch_size=4).dataset is dataset
    assert make_loader(dataset, batch_size=4, decode_threads=0).dataset is dataset
    # a dataset without threads: 0 is fine, more is refused by name
    assert len(list(make_loader(_Plain(), batch_size=2, decode_threads=0))) == 2
    with pytest.raises(ValueError, match="decode_threads=2: _Plain has no with_decode_threads"):
        make_loader(_Plain(), batch_size=2, decode_threads=2)


# -- the tuner -----------------------------------------------------------------------------
def _two_cores(s: Mapping[str, Any]) -> float:
    """A 2-core machine: one worker is slower than the main process, two threads in the main
    process beat two workers."""
    w, t = s["num_workers"], s.get("decode_threads", 0)
    return {(0, 0): 500.0, (1, 0): 450.0, (2, 0): 700.0, (0, 2): 900.0, (2, 2): 720.0}.get((w, t), 100.0)


def test_search_climbs_decode_threads_and_prefers_them_to_workers() -> None:
    calls: list[dict[str, Any]] = []
    out = search_settings(None, batch_size=8, cap=2, budget_s=60, threads_cap=2,
                          measure_fn=model(_two_cores, calls=calls))
    chosen = out.chosen_trial.settings
    assert chosen["num_workers"] == 0 and chosen["decode_threads"] == 2
    tried = {(c["num_workers"], c.get("decode_threads", 0)) for c in calls}
    assert {(0, 0), (1, 0), (2, 0), (0, 2), (2, 2)} <= tried
    assert thread_ladder(2) == [2] and thread_ladder(12) == [2, 4, 8, 12] and thread_ladder(1) == []
    # without threads_cap the search never sets decode_threads (a user's loader factory)
    calls.clear()
    search_settings(None, batch_size=8, cap=2, budget_s=60, measure_fn=model(_two_cores, calls=calls))
    assert calls and not any("decode_threads" in c for c in calls)


def test_threads_that_do_not_help_are_not_chosen() -> None:
    def rate(s: Mapping[str, Any]) -> float:  # threads add 1 %: below the tolerance
        return 100.0 * (1 + s["num_workers"]) * (1.01 if s.get("decode_threads") else 1.0)

    calls: list[dict[str, Any]] = []
    out = search_settings(None, batch_size=8, cap=8, budget_s=60, threads_cap=8, measure_fn=model(rate, calls=calls))
    assert "decode_threads" not in out.chosen_trial.settings
    # the thread climb stopped at its first rung
    assert [c.get("decode_threads") for c in calls if c["num_workers"] == 0 and c.get("decode_threads")] == [2]
    # cost: workers first, then threads
    cheap = model(lambda s: 100.0)(None, {"num_workers": 0, "decode_threads": 4}, batch_size=1,
                                   window_s=1.0, min_batches=1, consumer=None, deadline=None, phase="")
    dear = model(lambda s: 100.0)(None, {"num_workers": 1}, batch_size=1, window_s=1.0,
                                  min_batches=1, consumer=None, deadline=None, phase="")
    assert choose([dear, cheap], 0.04) == 1


def test_tune_result_records_decode_threads_and_auto_applies_them(small_synth_root, monkeypatch) -> None:
    from detloader import _system

    monkeypatch.setattr(tuner, "BUSY_WINDOW_S", 0.05)
    monkeypatch.setattr(_system, "busy_cpus", lambda window_s=0.5: 0.0)
    monkeypatch.setattr(_system, "busy_now", lambda: 0.0)
    monkeypatch.setattr(tuner, "worker_cap", lambda machine, max_workers, respect_busy: (2, "usable"))
    monkeypatch.setattr(tuner, "search_settings",
                        functools.partial(search_module.search_settings, measure_fn=model(_two_cores)))
    dataset = DetectionDataset(read_annotations(small_synth_root), Resize(32), seed=0)
    result = tune_loader(dataset, batch_size=4, budget_s=5, device=None)
    assert result.decode_threads == 2 and result.recommended["num_workers"] == 0
    assert set(result.recommended) == {"num_workers", "pin_memory", "prefetch_factor", "persistent_workers"}
    assert "decode_threads=2" in result.summary
    assert "Choice: 0 workers, 2 decode threads: 900 img/s" in result.explanation
    assert "0 workers: 500 img/s (-44 %)" in result.explanation  # the same setting without threads
    assert TuneResult.from_json(result.to_json()).decode_threads == 2
    kwargs, _ = auto_loader_kwargs(dataset, 4, decode_threads=True)
    assert kwargs["decode_threads"] == 2
    assert "decode_threads" not in auto_loader_kwargs(dataset, 4)[0]
    loader = make_loader(dataset, batch_size=4, num_workers="auto")
    assert loader.num_workers == 0 and loader.dataset.decode_threads == 2
    # an explicit value wins over the tuned one
    assert make_loader(dataset, batch_size=4, num_workers="auto", decode_threads=0).dataset is dataset


# -- canvases keep the resize's layout --------------------------------------------------------
def test_pad_and_crop_keep_a_channel_first_layout() -> None:
    rng = np.random.default_rng(0)
    image = rng.integers(0, 256, (37, 53, 3), dtype=np.uint8)
    planar = resize_image(image, 40, 30)  # an [H, W, 3] view of [3, H, W] memory
    assert planar.strides[2] > planar.strides[1]
    # pad at (left 3, top 2); a crop window starting at (-4, -3) puts the image at (4, 3)
    for out, (left, top) in [(pad_image(planar, 48, 36, 3, 2, fill=7), (3, 2)),
                             (crop_image(planar, -4, -3, 48, 36, fill=7), (4, 3))]:
        dense = np.full((36, 48, 3), 7, dtype=np.uint8)
        dense[top : top + 30, left : left + 40] = planar
        assert np.array_equal(out, dense)
        assert chw_tensor(out).is_contiguous()  # the Dataset's CHW tensor needs no copy
    hwc = pad_image(image, 60, 40, 1, 1)  # an [H, W, 3] image keeps its layout too
    assert hwc.flags.c_contiguous and np.array_equal(hwc[1:38, 1:54], image)


def test_tuner_tries_two_threads_when_busy_cpus_cap_the_workers(small_synth_root, monkeypatch) -> None:
    from detloader import _system

    monkeypatch.setattr(tuner, "BUSY_WINDOW_S", 0.05)
    monkeypatch.setattr(_system, "busy_cpus", lambda window_s=0.5: 1.8)  # 0.2 of 2 CPUs free
    monkeypatch.setattr(tuner, "worker_cap", lambda machine, max_workers, respect_busy: (1, "busy"))
    monkeypatch.setattr(tuner, "search_settings",
                        functools.partial(search_module.search_settings, measure_fn=model(_two_cores)))
    dataset = DetectionDataset(read_annotations(small_synth_root), Resize(32), seed=0)
    result = tune_loader(dataset, batch_size=4, budget_s=5, device=None, cache=False)
    assert result.recommended["num_workers"] == 0 and result.decode_threads == 2
