"""Issue 31, case 6 (the index's files): a FIFO where detloader reads or writes a file of its
own (the index cache, its lock, splits.json, a stored tuning result) or a file of the dataset
(an annotation file given as the path, an image an annotation names) is named, never opened:
opening a FIFO without a writer blocks forever.
"""

from __future__ import annotations

import os
import warnings
from pathlib import Path
from types import SimpleNamespace

import pytest
from helpers import voc_dataset, voc_object, voc_xml

from detloader import read_annotations
from detloader._system import files as _files
from detloader.annotations.cache import load_index_file
from detloader.annotations.splits import make_splits
from detloader.cli import main
from detloader.errors import AnnotationError, DetloaderRuntimeWarning, NotRegularFileError
from detloader.tune.saved import cache_file, load_result, save_result

pytestmark = pytest.mark.timeout(20)  # a FIFO opened for reading blocks: the test would hang

BOX = voc_object("dog", (10, 10, 30, 30))


def _voc(root: Path) -> Path:
    return voc_dataset(root, {f"{i:02d}": voc_xml(f"{i:02d}.jpg", [BOX]) for i in range(3)})


def _fifo(path: Path) -> Path:
    if path.exists():
        path.unlink()
    os.mkfifo(path)
    return path


@pytest.mark.parametrize("which", ["cache", "lock"])
def test_a_fifo_at_the_index_cache_or_its_lock_reads_without_the_cache(tmp_path: Path, which: str) -> None:
    root = _voc(tmp_path / "ds")
    cache = Path(read_annotations(root).source_file)
    fifo = _fifo(cache if which == "cache" else Path(f"{cache}.lock"))
    with pytest.warns(DetloaderRuntimeWarning, match="reading without an index cache") as caught:
        index = read_annotations(root)
    assert len(index) == 3 and index.source_file is None
    assert f"{fifo}: a FIFO, not a regular file; remove it to cache the index again" in str(caught[0].message)
    assert fifo.exists() and not fifo.is_file()  # never replaced
    assert caught[0].filename == __file__  # the warning names read_annotations' caller


def test_loading_a_fifo_as_the_cache_is_refused(tmp_path: Path) -> None:
    with pytest.raises(NotRegularFileError, match="a FIFO, not a regular file"):
        load_index_file(_fifo(tmp_path / "x.dlindex"))


def test_atomic_write_never_replaces_a_fifo(tmp_path: Path) -> None:
    fifo = _fifo(tmp_path / "out.json")
    with pytest.raises(NotRegularFileError, match=r"out.json: a FIFO, not a regular file; not written over"):
        _files.write_file(fifo, "{}")
    assert not fifo.is_file() and os.listdir(tmp_path) == ["out.json"]  # no temporary file left


def test_a_fifo_splits_json_is_named_and_never_replaced(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    root = _voc(tmp_path / "ds")
    fifo = _fifo(root / "splits.json")
    with pytest.raises(AnnotationError, match=r"splits.json: a FIFO, not a regular file; remove it"):
        read_annotations(root)
    index = read_annotations(root, on_error="skip")
    assert len(index) == 3 and [(p.kind, p.file) for p in index.problems] == [("not_a_regular_file", "splits.json")]
    with pytest.raises(NotRegularFileError, match="splits.json: a FIFO, not a regular file; not written over"):
        make_splits(index, val=0.34)
    assert main(["split", str(root), "--val", "0.34"]) == 2
    assert "splits.json: a FIFO, not a regular file; not written over" in capsys.readouterr().err
    assert not fifo.is_file()


@pytest.mark.parametrize("name", ["annotations.json", "annotations.xml"])
def test_a_fifo_given_as_the_annotation_file_is_named(tmp_path: Path, name: str) -> None:
    fifo = _fifo(tmp_path / name)
    for fmt in ("auto", "coco" if name.endswith(".json") else "cvat"):
        with pytest.raises(ValueError, match=f"path='{fifo}' is a FIFO, not an annotation file"):
            read_annotations(fifo, format=fmt)


def test_a_fifo_data_yaml_is_named_when_nothing_else_is_found(tmp_path: Path) -> None:
    _fifo(tmp_path / "data.yaml")
    with pytest.raises(ValueError, match=r"not read: data.yaml \(a FIFO, not a regular file\)"):
        read_annotations(tmp_path)
    with pytest.raises(ValueError, match=r"found no annotation files there; not read: data.yaml \(a FIFO"):
        read_annotations(tmp_path, format="yolo")


def test_a_fifo_image_a_voc_file_names_is_named_not_missing(tmp_path: Path) -> None:
    root = _voc(tmp_path / "ds")
    _fifo(root / "JPEGImages" / "01.jpg")
    index = read_annotations(root, on_error="skip")
    assert len(index) == 2
    assert sorted(str(p) for p in index.problems) == [
        "Annotations/01.xml: filename: filename='01.jpg': JPEGImages/01.jpg is a FIFO, not a regular file "
        "(image skipped)",
        "JPEGImages/01.jpg: a FIFO, not a regular file (skipped)",  # the listing of the image folder
    ]


def test_a_fifo_where_a_tuning_result_is_stored(tmp_path: Path) -> None:
    key = {"dataset": "x", "batch_size": 4}
    fifo = _fifo(cache_file(key, tmp_path))
    with pytest.warns(DetloaderRuntimeWarning, match="a FIFO, not a regular file; stored tuning result not read"):
        assert load_result(key, tmp_path) is None
    result = SimpleNamespace(key=key, to_json=lambda: "{}")  # what save_result reads of a TuneResult
    with pytest.raises(NotRegularFileError, match="a FIFO, not a regular file; not written over"):
        save_result(result, tmp_path)  # type: ignore[arg-type]
    assert not fifo.is_file()
    fifo.unlink()
    assert save_result(result, tmp_path).read_text() == "{}"  # type: ignore[arg-type]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert load_result(key, tmp_path) is None  # not a result: measured again, quietly as before


def test_an_image_convert_would_copy_is_a_fifo(tmp_path: Path) -> None:
    from detloader.annotations.writers.export import write_annotations

    index = read_annotations(_voc(tmp_path / "ds"))
    _fifo(tmp_path / "ds" / "JPEGImages" / "02.jpg")
    with pytest.raises(NotRegularFileError, match=r"02.jpg: a FIFO, not a regular file; image not copied"):
        write_annotations(index, tmp_path / "out", "coco", images="copy")
