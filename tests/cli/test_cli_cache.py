"""``detloader cache list|clear``: every index cache and store found again (in the cache folder,
beside the dataset through the record of what was made, ``"ram"`` stores in shared memory),
removed by dataset and kind, never one in use."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from detloader import DetectionDataset, read_annotations
from detloader.cli import main
from detloader.synth import make_synthetic
from detloader.transforms import Resize


def _made(root: Path, cache: str = "disk") -> DetectionDataset:
    """The index cache and a store of decoded images of the dataset at ``root``."""
    return DetectionDataset(read_annotations(root), Resize(32), cache=cache)  # type: ignore[arg-type]


def _listed(capsys: pytest.CaptureFixture[str], *args: str) -> dict:
    assert main(["cache", "list", "--json", *args]) == 0
    return json.loads(capsys.readouterr().out)


@pytest.fixture
def beside(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Caches beside each dataset (no DETLOADER_CACHE_DIR), the user cache folder in ``tmp_path``."""
    from detloader.dataset import store_files as _store_files

    monkeypatch.delenv("DETLOADER_CACHE_DIR")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "user-cache"))
    shm, disk = tmp_path / "shm", _store_files.store_dir  # "ram" stores of other processes stay out of it
    shm.mkdir()
    monkeypatch.setattr(_store_files, "store_dir", lambda kind, root: shm if kind == "ram" else disk(kind, root))
    return tmp_path


def test_list_then_clear_one_dataset_beside_its_data(beside: Path, capsys: pytest.CaptureFixture[str]) -> None:
    a = make_synthetic(beside / "a" / "faces", 6, seed=1, size=(64, 48))
    b = make_synthetic(beside / "b" / "faces", 5, seed=2, size=(64, 48))
    _made(a), _made(b)
    listed = _listed(capsys)
    files = {f["path"]: f for f in listed["files"]}
    assert sorted((f["kind"], f["root"]) for f in files.values()) == sorted(
        (kind, str(root)) for root in (a, b) for kind in ("index", "store disk")
    )
    for path, f in files.items():
        assert Path(path).parent == Path(f["root"]) / ".detloader-cache"
        assert f["bytes"] == os.path.getsize(path) > 0 and f["last_use"] and not f["in_use"]
    assert listed["bytes"] == sum(f["bytes"] for f in files.values())
    mine = {p for p, f in files.items() if f["root"] == str(a)}

    assert main(["cache", "clear", str(a), "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert all(f"would remove {p}" in out for p in mine) and "2 files" in out
    assert all(Path(p).exists() for p in files)  # a dry run removes nothing

    assert main(["cache", "clear", str(a), "--json"]) == 0
    cleared = json.loads(capsys.readouterr().out)
    assert {f["path"] for f in cleared["removed"]} == mine and not cleared["in_use"]
    assert cleared["bytes"] == sum(files[p]["bytes"] for p in mine)
    assert not any(Path(p).exists() for p in mine) and not (a / ".detloader-cache").exists()
    assert all(Path(p).exists() for p in set(files) - mine)  # the other dataset's stay
    assert {f["path"] for f in _listed(capsys)["files"]} == set(files) - mine

    assert main(["cache", "clear", str(a)]) == 0
    assert "nothing to remove: no index caches and stores of" in capsys.readouterr().out


def test_clear_by_kind_and_everything(beside: Path, capsys: pytest.CaptureFixture[str]) -> None:
    a = make_synthetic(beside / "faces", 5, seed=1, size=(64, 48))
    _made(a)
    assert main(["cache", "clear", "--kind", "store", "--json"]) == 0
    assert [f["kind"] for f in json.loads(capsys.readouterr().out)["removed"]] == ["store disk"]
    assert [f["kind"] for f in _listed(capsys)["files"]] == ["index"]
    assert main(["cache", "clear"]) == 0  # every dataset, no question asked
    assert "removed index caches and stores: 1 file, " in capsys.readouterr().out
    assert _listed(capsys)["files"] == []


def test_the_record_loses_files_that_are_gone(beside: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from detloader._system.cache_dir import record_file

    a = make_synthetic(beside / "faces", 5, seed=1, size=(64, 48))
    _made(a)
    store = next(p for p in (a / ".detloader-cache").iterdir() if p.suffix == ".dlstore")
    store.unlink()
    assert [f["kind"] for f in _listed(capsys)["files"]] == ["index"]
    lines = [json.loads(line) for line in record_file().read_text().splitlines()]
    assert [e["path"] for e in lines] == [str(next((a / ".detloader-cache").glob("*.dlindex")))]


def test_caches_in_the_cache_folder_are_found_without_the_record(
    tmp_path: Path, _isolated_cache: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from detloader._system.cache_dir import record_file

    a = make_synthetic(tmp_path / "faces", 5, seed=1, size=(64, 48))
    _made(a)
    record_file().unlink()
    files = _listed(capsys)["files"]
    assert sorted(f["kind"] for f in files) == ["index", "store disk"]
    assert all(f["root"] == str(a) and Path(f["path"]).is_relative_to(_isolated_cache) for f in files)
    assert main(["cache", "clear", str(a), "--json"]) == 0
    assert len(json.loads(capsys.readouterr().out)["removed"]) == 2


@pytest.mark.skipif(not os.path.isdir("/dev/shm"), reason="no shared memory folder")
def test_a_ram_store_in_use_is_named_and_kept(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    a = make_synthetic(tmp_path / "faces", 5, seed=1, size=(64, 48))
    dataset = _made(a, "ram")  # this process maps it: a user
    path = str(dataset.store.path)
    listed = {f["path"]: f for f in _listed(capsys, "--kind", "store")["files"]}
    assert listed[path]["kind"] == "store ram" and listed[path]["root"] == str(a) and listed[path]["in_use"]
    assert main(["cache", "clear", str(a), "--kind", "store"]) == 0
    out = capsys.readouterr().out
    assert f"kept {path} (store ram" in out and "in use by another process" in out
    assert os.path.exists(path)


def test_clear_dataset_removes_what_its_cache_folder_holds_unrecorded(
    beside: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Caches made by a process with another user cache folder (so another record) are still
    the dataset's: ``list DATASET`` shows them and ``clear DATASET`` removes them."""
    a = make_synthetic(beside / "faces", 5, seed=1, size=(64, 48))
    _made(a)
    held = sorted(str(p) for p in (a / ".detloader-cache").iterdir())
    assert sorted(Path(p).suffix for p in held) == [".dlindex", ".dlstore", ".stamps"]  # the builds removed their locks
    monkeypatch.setenv("XDG_CACHE_HOME", str(beside / "another-user-cache"))
    monkeypatch.setenv("DETLOADER_CACHE_DIR", str(beside / "elsewhere"))
    assert _listed(capsys)["files"] == []  # this record knows nothing of them
    files = _listed(capsys, str(a))["files"]
    assert sorted(f["kind"] for f in files) == ["index", "store disk"] and {f["root"] for f in files} == {str(a)}

    assert main(["cache", "clear", str(a), "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert all(f"would remove {f['path']}" in out for f in files) and "2 files" in out
    assert sorted(str(p) for p in (a / ".detloader-cache").iterdir()) == held
    assert main(["cache", "clear", str(a)]) == 0
    out = capsys.readouterr().out
    assert all(f"removed {f['path']}" in out for f in files) and "nothing to remove" not in out
    assert not (a / ".detloader-cache").exists()


def test_leftovers_of_dead_writes_are_listed_and_cleared_and_one_in_use_kept(
    beside: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from detloader._system.locks import locked

    a = make_synthetic(beside / "faces", 5, seed=1, size=(64, 48))
    read_annotations(a)
    folder = a / ".detloader-cache"
    index = next(folder.glob("*.dlindex"))
    dead = {  # what a killed process leaves: temporary files of writes, the lock of a build
        folder / f".{index.name}.k1x2c3v4.tmp": "index leftover",
        folder / f".{index.name}.stamps.a1b2c3d4.tmp": "index leftover",
        folder / "faces-0123456789abcdef0123.dlstore.lock": "store leftover",
        folder / ".faces-0123456789abcdef0123.dlstore.q9w8e7r6.tmp": "store leftover",
        folder / "other-0123456789abcdef.dlindex.lock": "index leftover",
    }
    for path in dead:
        path.write_bytes(b"x" * 10)
    (folder / "notes.txt").write_text("not detloader's")
    listed = {f["path"]: f for f in _listed(capsys, str(a))["files"]}
    assert {p: f["kind"] for p, f in listed.items()} == {str(index): "index", **{str(p): k for p, k in dead.items()}}
    assert not any(f["in_use"] for f in listed.values()) and {f["root"] for f in listed.values()} == {str(a)}
    assert main(["cache", "clear", str(a), "--kind", "store", "--json"]) == 0
    removed = json.loads(capsys.readouterr().out)["removed"]
    assert sorted(f["path"] for f in removed) == sorted(str(p) for p, k in dead.items() if k == "store leftover")

    with locked(Path(f"{index}.lock")):  # a build of the index runs: it and its temporary files stay
        assert main(["cache", "clear", str(a), "--json"]) == 0
        cleared = json.loads(capsys.readouterr().out)
    assert sorted(f["path"] for f in cleared["in_use"]) == sorted(
        [str(index), *(str(p) for p in dead if p.name.startswith(f".{index.name}"))]
    )
    assert [f["path"] for f in cleared["removed"]] == [str(folder / "other-0123456789abcdef.dlindex.lock")]
    assert main(["cache", "clear", str(a)]) == 0
    assert "3 files" in capsys.readouterr().out
    assert sorted(p.name for p in folder.iterdir()) == ["notes.txt"]  # only what is not detloader's


def test_index_says_where_its_cache_is_and_how_to_remove_it(beside: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from detloader.cli.cache import size

    a = make_synthetic(beside / "my faces", 5, seed=1, size=(64, 48))
    assert main(["index", str(a)]) == 0
    line = capsys.readouterr().out.splitlines()[-1]
    cache = next((a / ".detloader-cache").glob("*.dlindex"))
    assert line == f"index cache: {cache} ({size(cache.stat().st_size)}; `detloader cache clear '{a}'` removes it)"
    assert main(["index", str(a), "--no-cache"]) == 0
    assert capsys.readouterr().out.splitlines()[-1] == "index cache: none (--no-cache)"
