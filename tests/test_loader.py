"""make_loader: reproducible batches for any num_workers, option checks, worker setup."""

from __future__ import annotations

import os
import random
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader, Dataset

from detloader import read_annotations
from detloader._system import accelerator_available
from detloader.collate import Batch
from detloader.dataset import DetectionDataset
from detloader.loader import LoaderOptions, make_loader
from detloader.transforms import ColorJitter, Compose, RandomHorizontalFlip, RandomResizedCrop, Resize


@pytest.fixture
def dataset(small_synth_root: Path) -> DetectionDataset:
    index = read_annotations(small_synth_root)
    augment = Compose(
        [RandomHorizontalFlip(), ColorJitter(0.3, 0.3, 0.3), RandomResizedCrop(48, scale=(0.3, 1.0))]
    )
    return DetectionDataset(index, augment, seed=11)


def _epochs(ds: DetectionDataset, num_workers: int, epochs: int, **kw: object) -> list[list[Batch]]:
    loader = make_loader(ds, batch_size=5, shuffle=True, num_workers=num_workers, seed=3, **kw)  # type: ignore[arg-type]
    out = []
    for epoch in range(epochs):
        ds.set_epoch(epoch)
        out.append(list(loader))
    ds.set_epoch(0)
    return out


def _same(a: Batch, b: Batch) -> bool:
    tensors = [f for f in a.__dataclass_fields__ if isinstance(getattr(a, f), torch.Tensor)]
    return a.object_counts == b.object_counts and all(torch.equal(getattr(a, f), getattr(b, f)) for f in tensors)


def test_batches_are_bitwise_identical_for_any_num_workers(dataset: DetectionDataset) -> None:
    reference = _epochs(dataset, 0, 2)
    assert len(reference[0]) == 5 and reference[0][-1].images.shape[0] == 4
    assert not _same(reference[0][0], reference[1][0])  # epochs differ (order and augmentation)
    for workers in (1, 2):
        got = _epochs(dataset, workers, 2)
        for ref_epoch, got_epoch in zip(reference, got):
            assert len(ref_epoch) == len(got_epoch)
            assert all(_same(r, g) for r, g in zip(ref_epoch, got_epoch)), f"num_workers={workers}"


def test_persistent_workers_see_set_epoch(dataset: DetectionDataset) -> None:
    reference = _epochs(dataset, 0, 2)
    got = _epochs(dataset, 2, 2, persistent_workers=True, prefetch_factor=1)
    for ref_epoch, got_epoch in zip(reference, got):
        assert all(_same(r, g) for r, g in zip(ref_epoch, got_epoch))


def test_seed_fixes_the_order_and_none_leaves_it_random(dataset: DetectionDataset) -> None:
    plain = DetectionDataset(dataset.index, Resize(16), seed=0)

    def order(seed: int | None) -> list[int]:
        return [i for b in make_loader(plain, batch_size=8, shuffle=True, seed=seed) for i in b.image_ids.tolist()]

    assert order(1) == order(1) and order(1) != order(2)
    assert sorted(order(None)) == list(range(len(plain)))


def test_returns_a_plain_dataloader_with_the_options(dataset: DetectionDataset) -> None:
    loader = make_loader(dataset, batch_size=4, drop_last=True, num_workers=1, timeout=30, prefetch_factor=3)
    assert isinstance(loader, DataLoader)
    assert loader.batch_size == 4 and loader.drop_last and loader.num_workers == 1
    assert loader.timeout == 30 and loader.prefetch_factor == 3
    assert len(loader) == len(dataset) // 4
    sampler_loader = make_loader(dataset, batch_sampler=[[0, 1], [2]])
    assert [len(b) for b in sampler_loader] == [2, 1]


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"shuffle": True, "sampler": [0, 1]}, "shuffle=True and sampler are exclusive"),
        ({"batch_sampler": [[0]], "batch_size": 4}, "batch_sampler is given, so batch_size=4 must be left out"),
        (
            {"batch_sampler": [[0]], "shuffle": True, "drop_last": True},
            "so shuffle=True, drop_last=True must be left out",
        ),
        ({"batch_sampler": [[0]], "sampler": [0]}, "so sampler must be left out"),
        ({"prefetch_factor": 2}, "num_workers=0 .* prefetch_factor=2 cannot apply"),
        ({"persistent_workers": True, "timeout": 5}, "persistent_workers=True, timeout=5 cannot apply"),
        ({"num_workers": -1}, "num_workers=-1 must be an int >= 0"),
        ({"batch_size": 0}, "batch_size=0 must be a positive int"),
        ({"batch_size": None}, "batch_size=None turns batching off"),
        ({"num_workers": 1, "prefetch_factor": 0}, "prefetch_factor=0 must be a positive int"),
        ({"timeout": -1}, "timeout=-1 must be >= 0"),
        ({"seed": "abc"}, "seed='abc' must be an int"),
    ],
)
def test_conflicting_options_are_refused_by_name(dataset: DetectionDataset, kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        make_loader(dataset, **kwargs)


@pytest.mark.skipif(accelerator_available(), reason="an accelerator is present: pinning applies")
def test_pin_memory_without_accelerator_warns_and_is_dropped(dataset: DetectionDataset) -> None:
    with pytest.warns(RuntimeWarning, match="pin_memory=True ignored: no accelerator"):
        loader = make_loader(dataset, pin_memory=True)
    assert loader.pin_memory is False
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        make_loader(dataset, pin_memory=False)


class _Probe(Dataset):  # type: ignore[type-arg]
    """Reports the worker's thread settings and global random state."""

    def __len__(self) -> int:
        return 4

    def __getitem__(self, i: int) -> tuple[int, str, int, int, int]:
        marker = int(os.environ.get("DETLOADER_TEST_MARK", "0"))
        return (
            torch.get_num_threads(),
            os.environ.get("OMP_NUM_THREADS", ""),
            int(np.random.randint(1 << 30)),
            random.randrange(1 << 30),
            marker,
        )


def _mark(worker_id: int) -> None:
    os.environ["DETLOADER_TEST_MARK"] = str(100 + worker_id)


def _identity(items: list) -> list:  # type: ignore[type-arg]
    return items


def test_workers_run_single_threaded_and_seeded() -> None:
    def run(seed: int) -> list:  # type: ignore[type-arg]
        loader = make_loader(
            _Probe(), batch_size=2, num_workers=2, seed=seed, collate_fn=_identity, worker_init_fn=_mark
        )
        return [item for batch in loader for item in batch]

    items = run(5)
    assert all(threads == 1 and omp == "1" for threads, omp, *_ in items)
    assert sorted({mark for *_, mark in items}) == [100, 101]  # the user's init ran too
    assert [i[2:4] for i in items] == [i[2:4] for i in run(5)]  # numpy and random seeded
    assert [i[2:4] for i in items] != [i[2:4] for i in run(6)]


def test_loader_options_are_make_loaders_keywords() -> None:
    # LoaderOptions is derived from make_loader's signature: the same names and defaults, less
    # the keywords that build the order (balance, mosaic...); the DataLoader keywords among them
    import dataclasses
    import inspect

    from detloader.loader.make import _DATALOADER_OPTIONS

    params = inspect.signature(make_loader).parameters
    options = {f.name: f.default for f in dataclasses.fields(LoaderOptions)}
    assert options == {name: p.default for name, p in params.items() if p.kind is p.KEYWORD_ONLY
                       and name not in ("balance", "balance_by", "mosaic", "mixup", "group_by_aspect")}
    assert set(options) - set(_DATALOADER_OPTIONS) == {"seed", "decode_threads"}
    assert set(_DATALOADER_OPTIONS) <= set(inspect.signature(DataLoader).parameters)
    with pytest.raises(dataclasses.FrozenInstanceError):
        LoaderOptions().num_workers = 2  # type: ignore[misc]
