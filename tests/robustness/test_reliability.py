"""Issue 19: the data a run reads is the data on disk, and no input hangs or crashes a command.

One test (or two) per case of docs/reliability.md ("Files, folders and disks"), each on a
fixture made in tmp_path: FIFOs with os.mkfifo, a full disk by a fake ``os`` in
``detloader._system.files`` whose files raise ENOSPC, a 4 GiB image as a sparse file.
"""

from __future__ import annotations

import errno
import functools
import json
import os
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from helpers import voc_dataset, voc_object, voc_xml, write_image
from torch.utils.data import DataLoader, Dataset

from detloader import DetectionDataset, read_annotations
from detloader._system import files as _files
from detloader.annotations.writers.export import write_annotations
from detloader.cli import main
from detloader.images import MAX_IMAGE_BYTES, ImageDecodeError, image_bytes, read_image
from detloader.validate_images import check_image

BOX = voc_object("dog", (10, 10, 30, 30))


def _voc(root: Path, n: int = 3) -> Path:
    return voc_dataset(root, {f"{i:02d}": voc_xml(f"{i:02d}.jpg", [BOX]) for i in range(n)})


def _edit_in_place(path: Path, old: bytes, new: bytes) -> None:
    """Same size, mtime put back: what ``touch -r`` after an edit leaves."""
    st = path.stat()
    data = path.read_bytes()
    assert len(old) == len(new) and old in data
    path.write_bytes(data.replace(old, new))
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert path.stat().st_size == st.st_size and path.stat().st_mtime_ns == st.st_mtime_ns


# -- the cache sees what a user does to a file ----------------------------------------------
@pytest.mark.parametrize("verify", ["stat", "content"])
def test_same_size_edit_with_mtime_put_back_rebuilds(tmp_path: Path, verify: str) -> None:
    root = _voc(tmp_path / "ds")
    assert read_annotations(root, verify=verify).image(0).boxes[0, 2] == 30
    _edit_in_place(root / "Annotations" / "00.xml", b"<xmax>30</xmax>", b"<xmax>31</xmax>")
    assert read_annotations(root, verify=verify).image(0).boxes[0, 2] == 31


def test_a_copy_with_its_cache_rebuilds(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("DETLOADER_CACHE_DIR")  # the cache beside the data, copied with it
    root = _voc(tmp_path / "ds")
    first = read_annotations(root)
    assert Path(first.source_file).parent == root / ".detloader-cache"
    copy = tmp_path / "copy"
    shutil.copytree(root, copy, symlinks=True)  # cp -a: times kept, the cache file too
    _edit_in_place(copy / "Annotations" / "01.xml", b"<xmax>30</xmax>", b"<xmax>29</xmax>")
    again = read_annotations(copy)
    assert again.image(1).boxes[0, 2] == 29 and again.root == copy.resolve()
    assert read_annotations(root).image(1).boxes[0, 2] == 30  # the original's cache still serves it


def test_images_added_to_a_folder_of_the_index_rebuild(tmp_path: Path) -> None:
    root = _voc(tmp_path / "ds")
    (root / "Annotations" / "09.xml").write_text(voc_xml("09.jpg", [BOX]))
    assert len(read_annotations(root, on_error="skip")) == 3  # 09.jpg missing
    write_image(root / "JPEGImages" / "09.jpg")
    assert len(read_annotations(root)) == 4


def test_verify_is_checked(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="verify='sha'"):
        read_annotations(_voc(tmp_path / "ds"), verify="sha")


# -- special files and symlink loops --------------------------------------------------------
@pytest.mark.timeout(60)
def test_fifos_among_annotations_and_images_are_named_never_opened(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = _voc(tmp_path / "ds")
    os.mkfifo(root / "Annotations" / "x.xml")
    os.mkfifo(root / "JPEGImages" / "y.jpg")
    index = read_annotations(root, on_error="skip")
    assert len(index) == 3
    assert {(p.kind, p.file) for p in index.problems} == {
        ("not_a_regular_file", "Annotations/x.xml"), ("not_a_regular_file", "JPEGImages/y.jpg")}
    assert "a FIFO, not a regular file" in str(next(iter(index.problems)))
    assert main(["validate", str(root), "--decode"]) == 1
    assert "2 errors, 0 repaired: not_a_regular_file: 2" in capsys.readouterr().out
    with pytest.raises(ImageDecodeError, match="y.jpg: cannot read image: a FIFO, not a regular file"):
        image_bytes(root / "JPEGImages" / "y.jpg")
    assert [p.kind for p in check_image(root / "JPEGImages" / "y.jpg", "Annotations/y.xml", None)] == [
        "not_a_regular_file"
    ]
    with pytest.raises(ValueError, match="is a FIFO, not an annotation file"):
        read_annotations(root / "Annotations" / "x.xml")


@pytest.mark.timeout(60)
def test_a_fifo_an_annotation_names_is_named(tmp_path: Path) -> None:
    write_image(tmp_path / "images" / "a.jpg")
    os.mkfifo(tmp_path / "images" / "b.jpg")
    images = [
        {"id": 1, "file_name": "a.jpg", "width": 64, "height": 48},
        {"id": 2, "file_name": "b.jpg", "width": 64, "height": 48},
    ]
    (tmp_path / "annotations.json").write_text(json.dumps({"images": images, "annotations": [], "categories": []}))
    index = read_annotations(tmp_path / "annotations.json", on_error="skip")
    assert len(index) == 1
    assert [str(p) for p in index.problems] == [
        "annotations.json: images[1]/file_name: file_name='b.jpg': images/b.jpg is a FIFO, "
        "not a regular file (image skipped)"
    ]


@pytest.mark.parametrize("where", ["Annotations", "JPEGImages", "beside"])
def test_symlink_loops_are_named_not_followed(tmp_path: Path, where: str) -> None:
    root = _voc(tmp_path / "ds")
    if where == "beside":  # XML next to each image
        for xml in (root / "Annotations").iterdir():
            xml.rename(root / "JPEGImages" / xml.name)
        root = root / "JPEGImages"
        (root / "sub").mkdir()
        os.symlink("..", root / "sub" / "again")
    else:
        os.symlink(".", root / where / "again")
    index = read_annotations(root, on_error="raise")  # a loop is a repair: it never fails a read
    assert len(index) == 3
    loops = [p for p in index.problems if p.kind == "symlink_loop"]
    assert len(loops) == 1 and loops[0].severity == "repaired" and "a folder already read" in loops[0].message
    assert main(["validate", str(root)]) == 0


def test_a_dangling_link_is_named(tmp_path: Path) -> None:
    root = _voc(tmp_path / "ds")
    os.symlink("gone.xml", root / "Annotations" / "z.xml")
    index = read_annotations(root, on_error="skip")
    assert [(p.kind, p.file) for p in index.problems] == [("unreadable_file", "Annotations/z.xml")]


# -- files too large, and memory ------------------------------------------------------------
def _huge_jpeg(path: Path) -> Path:
    write_image(path)
    with open(path, "r+b") as fh:
        fh.truncate(4 * 2**30)  # sparse: 4 GiB of zeros after the JPEG, no disk used
    return path


def test_a_4gib_image_is_refused_by_its_size(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    root = _voc(tmp_path / "ds")
    _huge_jpeg(root / "JPEGImages" / "01.jpg")
    problems = check_image(root / "JPEGImages" / "01.jpg", "Annotations/01.xml", (64, 48), decode=True)
    assert [p.kind for p in problems] == ["file_too_large"]
    assert f"exceeds max_bytes={MAX_IMAGE_BYTES}" in problems[0].message
    assert main(["validate", str(root), "--decode", "--json"]) == 1
    assert json.loads(capsys.readouterr().out)["problems"] == {"file_too_large": 1}
    with pytest.raises(ImageDecodeError, match="size=4294967296 bytes exceeds max_bytes"):
        read_image(root / "JPEGImages" / "01.jpg")
    assert read_image(root / "JPEGImages" / "00.jpg", max_bytes=10_000).image.shape == (48, 64, 3)


def test_skip_policy_substitutes_a_huge_image_and_one_out_of_memory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = _voc(tmp_path / "ds", 4)
    _huge_jpeg(root / "JPEGImages" / "01.jpg")
    import detloader.images as images

    decode = images.decode_image

    def short_of_memory(data: bytes, **kwargs: Any) -> Any:
        if kwargs["source"].endswith("02.jpg"):
            raise MemoryError
        return decode(data, **kwargs)

    monkeypatch.setattr(images, "decode_image", short_of_memory)
    dataset = DetectionDataset(read_annotations(root), seed=0, on_decode_error="skip")
    with pytest.warns(RuntimeWarning):
        samples = [dataset[i] for i in range(4)]
    assert [s.image_id for s in samples][0::3] == [0, 3] and {samples[1].image_id, samples[2].image_id} <= {0, 3}
    assert [Path(p).name for _, p in dataset.skipped] == ["01.jpg", "02.jpg"]
    with pytest.raises(ImageDecodeError, match="02.jpg: out of memory"):
        DetectionDataset(dataset.index)[2]


# -- a full disk ----------------------------------------------------------------------------
class _FullFile:
    def __init__(self, fh: Any) -> None:
        self._fh = fh

    def write(self, data: Any) -> int:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    def __getattr__(self, name: str) -> Any:
        return getattr(self._fh, name)

    def __enter__(self) -> _FullFile:
        return self

    def __exit__(self, *exc: Any) -> None:
        self._fh.close()


class _FullDisk:
    """``os`` as :mod:`detloader._system.files` sees it on a full disk: every write raises ENOSPC."""

    def __getattr__(self, name: str) -> Any:
        return getattr(os, name)

    @staticmethod
    def fdopen(*args: Any, **kwargs: Any) -> _FullFile:
        return _FullFile(os.fdopen(*args, **kwargs))


@pytest.fixture
def full_disk(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_files, "os", _FullDisk())


def _no_temporary_files(folder: Path) -> bool:
    return not [p for p in folder.rglob("*") if p.name.endswith(".tmp")]


def test_atomic_write_names_a_full_disk_and_keeps_the_previous_file(tmp_path: Path, full_disk: None) -> None:
    target = tmp_path / "result.json"
    target.write_text("previous")
    with pytest.raises(
        _files.DiskFullError,
        match=r"result.json: not written, no space left on the device \([\d.]+ MiB free on .*\); any previous",
    ) as err:
        _files.write_file(target, "new")
    assert err.value.errno == errno.ENOSPC and isinstance(err.value, OSError)
    assert target.read_text() == "previous" and _no_temporary_files(tmp_path)


def test_index_cache_on_a_full_disk(tmp_path: Path, full_disk: None) -> None:
    root = _voc(tmp_path / "ds")
    with pytest.warns(RuntimeWarning, match="index cache not written to .*no space left on the device") as caught:
        index = read_annotations(root)
    assert len(index) == 3 and index.source_file is None
    assert [w.filename for w in caught if "index cache" in str(w.message)] == [__file__]  # read_annotations' caller
    assert _no_temporary_files(Path(os.environ["DETLOADER_CACHE_DIR"]))


def test_checkpoint_on_a_full_disk(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from detloader.train.checkpoint import CHECKPOINT_KEYS, PREVIOUS, load_checkpoint, save_checkpoint

    state = {  # the least a checkpoint's values checks on load take (no model to check: a task of one's own)
        **{k: 0 for k in CHECKPOINT_KEYS}, "config": {}, "task": "own.Model", "model": {}, "scheduler": {},
        "optimizer": {"state": {}, "param_groups": [{"lr": 0.001}]}, "history": [],
        "loader": {"epoch": 0, "batches": 0, "sampler": {"epoch": 0, "offset": 0}},
    }
    last = tmp_path / "run" / "last.pt"
    save_checkpoint(last, {**state, "step": 1})
    save_checkpoint(last, {**state, "step": 2})
    monkeypatch.setattr(_files, "os", _FullDisk())
    with pytest.raises(_files.DiskFullError, match="last.pt: not written, no space left"):
        save_checkpoint(last, {**state, "step": 3})
    monkeypatch.undo()
    assert load_checkpoint(last)["step"] == 2 and load_checkpoint(last.with_name(PREVIOUS))["step"] == 1
    assert sorted(p.name for p in last.parent.iterdir()) == sorted(["last.pt", PREVIOUS])
    # the CLI's wording: one line, exit status 2, for any OSError of a command (cli/parser.py)


@pytest.mark.parametrize("fmt", ["coco", "voc", "yolo"])
def test_exports_on_a_full_disk(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fmt: str) -> None:
    index = read_annotations(_voc(tmp_path / "ds"))
    monkeypatch.setattr(_files, "os", _FullDisk())
    with pytest.raises(_files.DiskFullError, match="not written, no space left"):
        write_annotations(index, tmp_path / "out", fmt, images="copy")
    assert _no_temporary_files(tmp_path / "out")


class _Tiny(Dataset):
    def __len__(self) -> int:
        return 32

    def __getitem__(self, i: int) -> torch.Tensor:
        return torch.full((4,), float(i))


def test_tune_loader_returns_its_result_on_a_full_disk(monkeypatch: pytest.MonkeyPatch) -> None:
    from detloader import _system
    from detloader.tune import saved, tune_loader, tuner

    monkeypatch.setattr(tuner, "BUSY_WINDOW_S", 0.1)
    monkeypatch.setattr(_system, "busy_cpus", lambda window_s=0.5: 0.0)
    ds = _Tiny()
    factory = functools.partial(DataLoader, ds, batch_size=8)
    monkeypatch.setattr(_files, "os", _FullDisk())
    with pytest.warns(RuntimeWarning, match="tuning result not saved, measured again next time: .*no space left") as w:
        result = tune_loader(ds, batch_size=8, loader_factory=factory, budget_s=0.5, max_workers=0)
    assert [x.filename for x in w if "not saved" in str(x.message)] == [__file__]  # tune_loader's caller
    assert result.recommended["num_workers"] == 0 and not saved.cache_file(result.key).exists()


# -- images without annotations -------------------------------------------------------------
def test_images_without_annotation_files_are_counted_and_named(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = _voc(tmp_path / "ds")
    for i in range(22):
        write_image(root / "JPEGImages" / f"extra{i:02d}.jpg")
    index = read_annotations(root, on_error="raise")  # never an error
    found = [p for p in index.problems if p.kind == "unannotated_image"]
    assert len(found) == 22 and all(p.severity == "repaired" for p in found)  # every one, each by name
    assert [p.file for p in found] == [f"JPEGImages/extra{i:02d}.jpg" for i in range(22)]
    assert {p.message for p in found} == {"no annotation file names it"}
    assert main(["validate", str(root)]) == 0
    assert "unannotated_image: 22" in capsys.readouterr().out
    assert main(["index", str(root)]) == 0
    text = capsys.readouterr().out
    assert "unannotated_image: 22" in text and "... and 19 more (22 in all)" in text
    assert not read_annotations(root, check_images=False).problems  # images not looked at


def test_yolo_background_images_are_named(tmp_path: Path) -> None:
    for name in ("a", "b"):
        write_image(tmp_path / "images" / f"{name}.jpg")
    (tmp_path / "labels").mkdir()
    (tmp_path / "labels" / "a.txt").write_text("0 0.5 0.5 0.2 0.2\n")
    index = read_annotations(tmp_path, format="yolo", on_error="raise")
    assert len(index) == 2
    assert [str(p) for p in index.problems] == [
        "labels/b.txt: no label file for images/b.jpg (kept as a background image (no objects))"
    ]


# -- clear errors at the first wall ---------------------------------------------------------
def _cvat(folder: Path) -> None:
    write_image(folder / "images" / "a.jpg")
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "annotations.xml").write_text(
        '<annotations><image id="0" name="a.jpg" width="64" height="48">'
        '<box label="face" xtl="1" ytl="1" xbr="9" ybr="9"/></image></annotations>')


def test_a_dataset_one_folder_down_is_read(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _cvat(tmp_path / "ppe-cvat" / "task_1")
    index = read_annotations(tmp_path / "ppe-cvat")
    assert (
        index.meta["format"] == "cvat"
        and len(index) == 1
        and index.root == (tmp_path / "ppe-cvat" / "task_1").resolve()
    )
    assert main(["index", str(tmp_path / "ppe-cvat")]) == 0
    _cvat(tmp_path / "ppe-cvat" / "task_2")
    with pytest.raises(ValueError, match=r"one folder down: task_1/ \(cvat\), task_2/ \(cvat\); pass one of them"):
        read_annotations(tmp_path / "ppe-cvat")


def test_nothing_recognised_names_the_folder_what_was_looked_for_and_the_flag(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / "a.md").write_text("hello")
    assert main(["index", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert (
        f"path={str(tmp_path)!r}: no annotation format recognised here or one folder down (looked for COCO .json" in err
    )
    assert "--format NAME" in err


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (
            ["--balance", "sqr"],
            "--balance='sqr' is not one of inverse, sqrt, power, effective, repeat_factor, explicit, class_aware; "
            "did you mean 'sqrt'?",
        ),
        (["--balance", "powr:0.5"], "did you mean 'power'?"),
        (
            ["--format", "vco"],
            "--format='vco' is not one of auto, lvis, coco, openimages, voc, cvat, imglab, yolo, txt; "
            "did you mean 'voc'?",
        ),
        (
            ["--by", "clas"],
            "--by='clas' is not one of class, image_class, image, attribute:NAME, image_attribute:NAME; "
            "did you mean 'class'?",
        ),
        (["--images-by", "nmae"], "did you mean 'name'?"),
        (["--by", "image_class"], "--by image_class: {root} has no image classes"),
    ],
)
def test_cli_choices_say_did_you_mean(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], args: list[str], message: str
) -> None:
    root = _voc(tmp_path / "ds")
    assert main(["stats", str(root), *args]) == 2
    assert message.format(root=root.resolve()) in capsys.readouterr().err


@pytest.mark.parametrize("name", [" padded .jpg", "back\\slash.jpg"])
def test_odd_names_survive_a_coco_round_trip(tmp_path: Path, name: str) -> None:
    write_image(tmp_path / "src" / "images" / name)
    record = {"id": 1, "file_name": name, "width": 64, "height": 48}
    box = {"id": 1, "image_id": 1, "category_id": 1, "bbox": [1, 1, 8, 8]}
    source = tmp_path / "src" / "annotations.json"
    source.write_text(json.dumps({"images": [record], "annotations": [box], "categories": [{"id": 1, "name": "dog"}]}))
    index = read_annotations(source)
    assert index.relative_image_path(0) == f"images/{name}"
    assert main(["convert", str(source), "--to", "coco", str(tmp_path / "out"), "--images", "copy"]) == 0
    back = read_annotations(tmp_path / "out" / "annotations.json")
    assert back.relative_image_path(0) == f"images/{name}" and not back.problems
    np.testing.assert_array_equal(back.boxes, index.boxes)
