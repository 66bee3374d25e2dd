"""make_loader's links to the other stages: balance= (samplers), num_workers="auto" (tune),
set_epoch over dataset and sampler."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch

from detloader import DetectionDataset, WeightedSampler, make_loader, read_annotations, set_epoch
from detloader.balance import RepeatFactorSampler
from detloader.transforms import Resize


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    from detloader.synth import make_synthetic

    root = make_synthetic(tmp_path_factory.mktemp("loadint") / "s", 120, seed=7, size=(96, 72))
    index = read_annotations(root, cache=False)
    return DetectionDataset(index, Resize((64, 48)), seed=1)


def _rare_share(loader, dataset) -> float:
    rare = dataset.index.classes.index("sunglasses")
    labels = torch.cat([batch.labels for batch in loader])
    return float((labels != 0).float().mean()), float((labels == rare).float().mean())


@pytest.mark.filterwarnings("ignore:WeightedSampler. epoch 0 is drawn again")
def test_balance_by_strategy_name_shifts_classes_towards_rare(dataset):
    plain = make_loader(dataset, batch_size=16, shuffle=True, seed=0)
    balanced = make_loader(dataset, batch_size=16, balance="inverse", seed=0)
    assert isinstance(balanced.sampler, WeightedSampler)
    (_, rare_plain), (_, rare_bal) = _rare_share(plain, dataset), _rare_share(balanced, dataset)
    assert rare_bal > 2 * rare_plain
    again = make_loader(dataset, batch_size=16, balance="inverse", seed=0)
    assert list(again.sampler) == list(balanced.sampler)


def test_balance_other_forms(dataset):
    loader = make_loader(dataset, batch_size=4, balance="repeat_factor:0.5", seed=3)
    assert isinstance(loader.sampler, RepeatFactorSampler)
    mine = WeightedSampler(np.ones(len(dataset)), seed=5)
    assert make_loader(dataset, batch_size=4, balance=mine).sampler is mine
    by_image = make_loader(
        dataset, batch_size=4, balance={"night": 5.0, "indoor": 1.0, "outdoor": 1.0}, balance_by="image_class", seed=0
    )
    assert len(list(by_image.sampler)) == len(dataset)


def test_balance_conflicts_are_named(dataset):
    with pytest.raises(ValueError, match=r"balance='sqrt' builds the sampler, so shuffle=True must be left out"):
        make_loader(dataset, balance="sqrt", shuffle=True)
    with pytest.raises(ValueError, match="sampler must be left out"):
        make_loader(dataset, balance="sqrt", sampler=[0, 1])
    plain = torch.utils.data.TensorDataset(torch.zeros(4, 3))
    with pytest.raises(ValueError, match="needs the dataset's annotation index"):
        make_loader(plain, balance="sqrt", collate_fn=None)
    with pytest.raises(ValueError, match="is not one of"):
        make_loader(dataset, balance="loudest")


@pytest.mark.filterwarnings("ignore:WeightedSampler. epoch 0 is drawn again")
def test_set_epoch_reaches_dataset_and_sampler(dataset):
    loader = make_loader(dataset, batch_size=8, balance="sqrt", seed=0)
    set_epoch(loader, 0)
    first = [b.images.clone() for b in loader]
    order0 = list(loader.sampler)
    set_epoch(loader, 1)
    assert dataset.epoch == 1 and loader.sampler.epoch == 1
    assert list(loader.sampler) != order0
    set_epoch(loader, 0)
    again = [b.images for b in loader]
    assert all(torch.equal(a, b) for a, b in zip(first, again))


def test_num_workers_auto_uses_the_heuristic_and_says_so(dataset):
    from detloader.tune import TuneWarning  # the test's cache folder holds no tuning result

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        loader = make_loader(dataset, batch_size=8, num_workers="auto")
    assert any(issubclass(w.category, TuneWarning) for w in caught)
    assert isinstance(loader.num_workers, int) and loader.num_workers >= 0
    assert len(next(iter(loader))) == 8
    with pytest.raises(ValueError, match="num_workers='many' must be an int >= 0 or 'auto'"):
        make_loader(dataset, num_workers="many")  # type: ignore[arg-type]


@pytest.mark.slow
def test_num_workers_auto_uses_a_cached_tuning_result(dataset, monkeypatch):
    from detloader import tune_loader
    from detloader.loader import auto

    result = tune_loader(dataset, batch_size=8, budget_s=8, max_workers=1)
    # the load as it was when tuned (a load that changed is the staleness tests' subject)
    machine = result.machine
    monkeypatch.setattr(auto, "current_free_cpus", lambda: (machine.free_cpus, machine.usable_cpus))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a cached result: no heuristic warning
        loader = make_loader(dataset, batch_size=8, num_workers="auto")
    rec = result.recommended
    assert loader.num_workers == rec["num_workers"]
    if rec["num_workers"]:
        assert loader.prefetch_factor == rec["prefetch_factor"]
        assert loader._persistent_workers == rec["persistent_workers"]


def test_resumable_loader_set_epoch_reaches_the_dataset(dataset):
    from detloader import ResumableLoader

    loader = ResumableLoader(make_loader(dataset, batch_size=8, balance="sqrt", seed=0))
    loader.set_epoch(3)
    assert dataset.epoch == 3 and loader.loader.sampler.epoch == 3
    dataset.set_epoch(0)


def test_balance_none_is_no_balancing(dataset):
    for given in (None, "none"):
        ordered = make_loader(dataset, batch_size=8, balance=given)
        assert isinstance(ordered.sampler, torch.utils.data.SequentialSampler)
        shuffled = make_loader(dataset, batch_size=8, balance=given, shuffle=True, seed=4)  # no clash: nothing built
        assert list(shuffled.sampler) == list(make_loader(dataset, batch_size=8, shuffle=True, seed=4).sampler)


def test_an_unknown_balance_or_num_workers_gets_one_message_everywhere(dataset, small_synth_root, capsys):
    from detloader.balance import BALANCE_CHOICES
    from detloader.cli import main
    from detloader.train import TrainConfig

    def message(call) -> str:
        with pytest.raises(ValueError) as err:
            call()
        return str(err.value)

    listed = f"is not one of {', '.join(BALANCE_CHOICES)}"
    for bad in ("bogus", "sqr"):
        library = message(lambda bad=bad: make_loader(dataset, balance=bad))
        assert library.startswith(f"balance={bad!r} {listed}")
        assert message(lambda bad=bad: TrainConfig(balance=bad)) == library
        for command in ("stats", "train"):
            assert main([command, str(small_synth_root), "--balance", bad]) == 2
            err = capsys.readouterr().err.strip().splitlines()[-1]
            assert err.endswith(library), (command, err)  # '--balance=...' (stats) or 'balance=...' (train)
    for bad in (-1, "many"):
        library = message(lambda bad=bad: make_loader(dataset, num_workers=bad))
        assert library == f"num_workers={bad!r} must be an int >= 0 or 'auto'"
        assert message(lambda bad=bad: TrainConfig(num_workers=bad)) == library
        assert main(["train", str(small_synth_root), "--num-workers", str(bad)]) == 2
        assert capsys.readouterr().err.strip().endswith(library)
