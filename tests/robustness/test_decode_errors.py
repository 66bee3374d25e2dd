"""Decode failures in the loader: on_decode_error="raise" names the file and the dataset index
(from workers too); "skip" substitutes an image of the same group, reports the skipped files
and gives the same batches for any num_workers and decode_threads."""

from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
from helpers import voc_dataset, voc_object, voc_xml

from detloader import ImageDecodeError, make_loader, read_annotations
from detloader.dataset import DetectionDataset
from detloader.train.config import TrainConfig

CAT, DOG = voc_object("cat", (2, 2, 20, 20)), voc_object("dog", (30, 10, 60, 40))
# cat has more objects than dog, so dog is the rarest class of "both"
FILES = {
    "c0": voc_xml("c0.jpg", [CAT, CAT]),
    "c1": voc_xml("c1.jpg", [CAT]),
    "c2": voc_xml("c2.jpg", [CAT]),  # truncated JPEG
    "d0": voc_xml("d0.jpg", [DOG]),
    "d1": voc_xml("d1.jpg", [DOG]),  # zero bytes
    "d2": voc_xml("d2.jpg", [DOG]),
    "e0": voc_xml("e0.jpg", [CAT, DOG]),
}


@pytest.fixture
def broken(tmp_path: Path):  # type: ignore[no-untyped-def]
    root = voc_dataset(tmp_path / "voc", FILES)
    images = root / "JPEGImages"
    data = (images / "c2.jpg").read_bytes()
    (images / "c2.jpg").write_bytes(data[: len(data) // 2])
    (images / "d1.jpg").write_bytes(b"")
    index = read_annotations(root)
    rows = {index.image_path(i).stem: i for i in range(len(index))}
    return index, rows


def _ids(loader) -> list[int]:  # type: ignore[no-untyped-def]
    return [int(i) for batch in loader for i in batch.image_ids]


def test_raise_names_the_file_and_the_dataset_index(broken) -> None:  # type: ignore[no-untyped-def]
    index, rows = broken
    ds = DetectionDataset(index, seed=0)
    with pytest.raises(ImageDecodeError, match=rf"c2\.jpg: .*\(dataset index {rows['c2']}\)"):
        ds[rows["c2"]]
    with pytest.raises(ImageDecodeError, match=rf"d1\.jpg: .*\(dataset index {rows['d1']}\)"):
        ds[rows["d1"]]
    assert ds[rows["c0"]].image_id == rows["c0"]


def test_raise_from_a_worker_reaches_the_main_process_as_a_decode_error(broken) -> None:  # type: ignore[no-untyped-def]
    index, rows = broken
    loader = make_loader(DetectionDataset(index, seed=0), batch_size=1, sampler=[rows["c0"], rows["d1"]], num_workers=2)
    with pytest.raises(ImageDecodeError, match=rf"d1\.jpg: .*\(dataset index {rows['d1']}\)") as info:
        _ids(loader)
    # the worker's own message, as num_workers=0 gives it: no traceback text of the worker
    assert str(info.value).startswith(f"{index.image_path(rows['d1'])}: cannot decode image: an empty file")
    assert "Traceback" not in str(info.value) and "\n" not in str(info.value)
    assert 'on_decode_error="skip"' in str(info.value) and "validate PATH --decode" in str(info.value)


def test_skip_substitutes_an_image_of_the_same_group_and_reports_it(broken) -> None:  # type: ignore[no-untyped-def]
    index, rows = broken
    ds = DetectionDataset(index, seed=0, on_decode_error="skip")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        samples = [ds[i] for i in range(len(ds))] + [ds[rows["c2"]], ds[rows["d1"]]]
    skipped = [str(w.message) for w in caught if "skipped" in str(w.message)]
    assert len(skipped) == 2  # once per file, though each failed twice
    assert any("c2.jpg" in m and f"dataset index {rows['c2']}" in m for m in skipped)
    assert any("d1.jpg" in m and f"dataset index {rows['d1']}" in m for m in skipped)
    assert ds.skipped == sorted(
        [(rows["c2"], str(index.image_path(rows["c2"]))), (rows["d1"], str(index.image_path(rows["d1"])))]
    )
    names = {v: k for k, v in rows.items()}
    cat_sub, dog_sub = samples[rows["c2"]], samples[rows["d1"]]
    # same rarest class (cat for c2; dog for d1, which e0 shares), never the broken file itself
    assert names[cat_sub.image_id] in {"c0", "c1"}
    assert names[dog_sub.image_id] in {"d0", "d2", "e0"}
    # the substitute is a whole sample: its own image, boxes and labels
    view = index.image(dog_sub.image_id)
    assert np.array_equal(dog_sub.labels, view.labels) and dog_sub.size == view.size
    # deterministic for (seed, epoch, index); the list restarts with the epoch
    again = DetectionDataset(index, seed=0, on_decode_error="skip")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert again[rows["d1"]].image_id == dog_sub.image_id
        ds.set_epoch(1)
        assert ds.skipped == []
        ds[rows["c2"]]
    assert [i for i, _ in ds.skipped] == [rows["c2"]]


@pytest.mark.parametrize("workers, threads", [(0, 0), (2, 0), (0, 2), (2, 2)])
def test_skip_gives_the_same_batches_for_any_num_workers(broken, workers: int, threads: int) -> None:  # type: ignore[no-untyped-def]
    index, rows = broken
    order = list(range(len(index))) * 2

    def run(num_workers: int, decode_threads: int) -> tuple[list[int], list[tuple[int, str]]]:
        ds = DetectionDataset(index, seed=5, on_decode_error="skip")
        ds.set_epoch(3)
        loader = make_loader(ds, batch_size=3, sampler=order, num_workers=num_workers, decode_threads=decode_threads)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return _ids(loader), ds.skipped

    ids, skipped = run(workers, threads)
    reference, _ = run(0, 0)
    assert ids == reference
    assert rows["c2"] not in ids and rows["d1"] not in ids and len(ids) == len(order)
    # reported in the main process, also when workers skipped them (shared flags)
    assert [i for i, _ in skipped] == sorted([rows["c2"], rows["d1"]])


def test_no_substitute_decodes(tmp_path: Path) -> None:
    root = voc_dataset(tmp_path / "voc", {"a": voc_xml("a.jpg", [CAT]), "b": voc_xml("b.jpg", [CAT])})
    for name in ("a.jpg", "b.jpg"):
        (root / "JPEGImages" / name).write_bytes(b"")
    ds = DetectionDataset(read_annotations(root), on_decode_error="skip")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with pytest.raises(
            ImageDecodeError, match=r"a\.jpg: cannot decode image \(dataset index 0\) and none of 1 substitutes"
        ):
            ds[0]


def test_substitute_from_another_group_when_the_group_has_none(tmp_path: Path) -> None:
    root = voc_dataset(tmp_path / "voc", {"a": voc_xml("a.jpg", [CAT]), "b": voc_xml("b.jpg", [DOG])})
    (root / "JPEGImages" / "a.jpg").write_bytes(b"")
    ds = DetectionDataset(read_annotations(root), on_decode_error="skip")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert ds[0].image_id == 1
    assert any("a.jpg" in str(w.message) and "substituted image 1 of another group" in str(w.message) for w in caught)


def test_policy_is_checked_and_reaches_the_trainer(broken) -> None:  # type: ignore[no-untyped-def]
    index, _ = broken
    with pytest.raises(ValueError, match="on_decode_error='ignore' is not one of raise, skip"):
        DetectionDataset(index, on_decode_error="ignore")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="on_decode_error='ignore'"):
        TrainConfig(on_decode_error="ignore")
    config = TrainConfig(on_decode_error="skip", num_workers=0, batch_size=2)
    assert TrainConfig.from_dict(config.to_dict()).on_decode_error == "skip"
    from detloader.train.distributed import init_distributed
    from detloader.train.run_data import train_loader

    loader = train_loader(config, index, init_distributed("cpu"))
    assert loader.loader.dataset.on_decode_error == "skip"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        batch = next(iter(loader))
    assert isinstance(batch.images, torch.Tensor)
