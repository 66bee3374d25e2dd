"""The index cache: reloads, invalidation, versioning, location, sharing with workers."""

from __future__ import annotations

import json
import mmap
import os
import pickle
import shutil
import struct

import numpy as np
import pytest
from helpers import arrays_equal, voc_dataset, voc_object, voc_xml, write_image

from detloader import read_annotations
from detloader.annotations import cache as cache_mod
from detloader.annotations import read as read_mod


def _backed_by_mmap(arr) -> bool:
    base = arr
    while isinstance(base, np.ndarray):
        base = base.base
    if isinstance(base, memoryview):
        base = base.obj
    return isinstance(base, mmap.mmap)


def _root(tmp_path, n=3):
    files = {f"{i}": voc_xml(f"{i}.jpg", [voc_object("k", (1, 1, 5 + i, 5))]) for i in range(n)}
    return voc_dataset(tmp_path / "data", files, splits={"train": ["0", "1"]})


def test_warm_reload_is_identical_and_memory_mapped(tmp_path):
    root = _root(tmp_path)
    cold = read_annotations(root, cache=False)
    first = read_annotations(root)
    warm = read_annotations(root)
    assert arrays_equal(cold, warm) and arrays_equal(first, warm)
    assert warm.vocab == cold.vocab and warm.splits.keys() == cold.splits.keys()
    assert warm._source_file is not None
    assert _backed_by_mmap(warm.boxes) and _backed_by_mmap(warm.labels)
    assert not warm.boxes.flags.writeable
    assert [str(p) for p in warm.problems] == [str(p) for p in cold.problems]


def test_rebuilt_when_a_file_changes_or_is_added(tmp_path):
    root = _root(tmp_path)
    assert read_annotations(root).num_objects == 3
    path = root / "Annotations" / "1.xml"
    path.write_text(voc_xml("1.jpg", [voc_object("k", (1, 1, 5, 5))] * 2))
    os.utime(path, ns=(1, 1))  # mtime changes even on coarse clocks
    assert read_annotations(root).num_objects == 4
    (root / "Annotations" / "9.xml").write_text(voc_xml("0.jpg".replace("0", "1"), []))
    assert len(read_annotations(root, on_error="skip")) == 3  # duplicate of 1.jpg skipped


def test_rebuilt_when_options_change_and_old_file_kept(tmp_path):
    root = _root(tmp_path)
    a = read_annotations(root)
    b = read_annotations(root, class_map={"k": "renamed"})
    assert a.classes == ("k",) and b.classes == ("renamed",)
    assert a._source_file != b._source_file
    assert read_annotations(root).classes == ("k",)


def test_version_mismatch_and_corrupt_files_rebuild(tmp_path):
    root = _root(tmp_path)
    path = read_annotations(root)._source_file
    data = bytearray(open(path, "rb").read())
    struct.pack_into("<I", data, 8, cache_mod.CACHE_VERSION + 1)
    open(path, "wb").write(bytes(data))
    with pytest.raises(cache_mod.CacheError, match="cache version"):
        cache_mod.load_index_file(path)
    assert read_annotations(root).num_objects == 3
    open(path, "wb").write(b"garbage")
    assert read_annotations(root).num_objects == 3
    assert cache_mod.read_key(path) is not None


def test_damaged_header_or_arrays_rebuild(tmp_path):
    root = _root(tmp_path)
    path = read_annotations(root)._source_file
    good = open(path, "rb").read()
    header_len = struct.unpack_from("<Q", good, 16)[0]
    header = good[24 : 24 + header_len]
    for bad_header in (b"{" + header[1:-1] + b"x", header.replace(b'"boxes":["<f4",[3,4]', b'"boxes":["<f4",[2,4]')):
        assert bad_header != header
        damaged = good[:24] + bad_header.ljust(header_len) + good[24 + header_len :]
        open(path, "wb").write(damaged)
        with pytest.raises(cache_mod.CacheError):
            cache_mod.load_index_file(path)
        assert read_annotations(root).num_objects == 3  # rebuilt, not a crash


def test_cache_beside_data_when_writable_else_user_cache(tmp_path, monkeypatch):
    monkeypatch.delenv(cache_mod.CACHE_DIR_ENV)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    root = _root(tmp_path)
    index = read_annotations(root)
    assert os.path.dirname(index._source_file) == str(root / cache_mod.CACHE_SUBDIR)
    ro = tmp_path / "readonly"
    shutil.copytree(root, ro, ignore=shutil.ignore_patterns(cache_mod.CACHE_SUBDIR))
    os.chmod(ro, 0o555)
    try:
        index = read_annotations(ro)
        assert index._source_file.startswith(str(tmp_path / "xdg" / "detloader"))
        assert not (ro / cache_mod.CACHE_SUBDIR).exists()
    finally:
        os.chmod(ro, 0o755)


def test_cache_false_and_rebuild(tmp_path):
    root = _root(tmp_path)
    assert read_annotations(root, cache=False)._source_file is None
    a = read_annotations(root)
    mtime = os.stat(a._source_file).st_mtime_ns
    b = read_annotations(root, cache="rebuild")
    assert os.stat(b._source_file).st_mtime_ns >= mtime and arrays_equal(a, b)


def test_pickles_as_file_name_for_workers(tmp_path):
    root = _root(tmp_path, n=50)
    warm = read_annotations(root)
    blob = pickle.dumps(warm)
    assert len(blob) < 600  # the file name, not the arrays
    again = pickle.loads(blob)
    assert arrays_equal(warm, again) and again.root == warm.root
    in_memory = read_annotations(root, cache=False)
    assert arrays_equal(pickle.loads(pickle.dumps(in_memory)), warm)
    sub = warm.subset([3, 1])
    assert arrays_equal(pickle.loads(pickle.dumps(sub)), sub)


def test_worker_refuses_a_cache_rebuilt_under_it(tmp_path):
    root = _root(tmp_path)
    warm = read_annotations(root)
    blob = pickle.dumps(warm)
    (root / "Annotations" / "0.xml").write_text(voc_xml("0.jpg", []))
    os.utime(root / "Annotations" / "0.xml", ns=(5, 5))
    read_annotations(root)
    with pytest.raises(cache_mod.CacheError, match="rebuilt"):
        pickle.loads(blob)


def test_empty_index_round_trip(tmp_path):
    (tmp_path / "e" / "Annotations").mkdir(parents=True)
    read_annotations(tmp_path / "e")
    index = read_annotations(tmp_path / "e")
    assert len(index) == 0 and index.boxes.shape == (0, 4) and index._source_file


def test_shared_not_copied_by_forked_workers(synth_root):
    """Workers read the mapped pages: their private memory does not grow by the index size."""
    import torch

    index = read_annotations(synth_root)

    class Touch(torch.utils.data.Dataset):
        def __len__(self):
            return 4

        def __getitem__(self, i):
            return float(index.boxes.sum() + index.landmarks.sum())

    loader = torch.utils.data.DataLoader(Touch(), num_workers=2, multiprocessing_context="fork")
    values = [float(v) for v in loader]
    assert len(set(values)) == 1
    assert values[0] == pytest.approx(
        float(np.asarray(index.boxes, np.float64).sum() + index.landmarks.sum()), rel=1e-5
    )


# -- integrity (issue 12) ---------------------------------------------------------------------
def _data_start(good: bytes) -> int:
    header_len = struct.unpack_from("<Q", good, 16)[0]
    return (24 + header_len + 63) // 64 * 64


def test_every_flipped_byte_is_caught_and_the_cache_rebuilt_with_a_warning(tmp_path):
    root = _root(tmp_path, n=4)
    reference = read_annotations(root, cache=False)
    path = read_annotations(root)._source_file
    good = open(path, "rb").read()
    header_len = struct.unpack_from("<Q", good, 16)[0]
    start = _data_start(good)
    boxes_at = start + cache_mod._read_header(path)[0]["arrays"]["boxes"][2]
    # magic, version, header CRC, header length, header bytes, array bytes (a box's xmax)
    positions = [0, 8, 12, 16, 23, 24, 24 + header_len // 2, 24 + header_len - 1, boxes_at + 8, boxes_at + 11]
    for pos in positions:
        damaged = bytearray(good)
        damaged[pos] ^= 0x40
        open(path, "wb").write(bytes(damaged))
        with pytest.raises(cache_mod.CacheError):
            cache_mod.load_index_file(path)
        with pytest.warns(RuntimeWarning, match="rebuilding the index cache"):
            again = read_annotations(root)
        assert arrays_equal(again, reference), pos
        assert open(path, "rb").read() == good


def test_a_huge_declared_length_or_shape_is_a_cache_error_not_memory_error(tmp_path):
    root = _root(tmp_path)
    path = read_annotations(root)._source_file
    good = bytearray(open(path, "rb").read())
    struct.pack_into("<Q", good, 16, 2**63)
    open(path, "wb").write(bytes(good))
    with pytest.raises(cache_mod.CacheError, match="length"):
        cache_mod.load_index_file(path)


def test_cache_files_are_readable_by_the_group(tmp_path):
    old = os.umask(0o022)
    try:
        path = read_annotations(_root(tmp_path))._source_file
    finally:
        os.umask(old)
    assert os.stat(path).st_mode & 0o777 == 0o644


def test_read_only_dataset_and_cache_folder_reads_without_cache_with_one_warning(tmp_path, monkeypatch):
    import warnings

    monkeypatch.delenv(cache_mod.CACHE_DIR_ENV)
    xdg = tmp_path / "xdg"
    xdg.write_text("")  # a file: no folder can be made under it, even by root
    monkeypatch.setenv("XDG_CACHE_HOME", str(xdg))
    root = _root(tmp_path)
    os.chmod(root, 0o555)
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            index = read_annotations(root)
        assert index._source_file is None and len(index) == 3
        assert [str(w.message) for w in caught if "without an index cache" in str(w.message)] == [
            str(caught[0].message)
        ] and len(caught) == 1
    finally:
        os.chmod(root, 0o755)


def test_an_index_whose_file_was_replaced_pickles_its_arrays(tmp_path):
    """A cache rebuilt by another process (atomic rename: a new inode) while workers run:
    the next epoch's workers get the arrays their parent uses, not the new file."""
    root = _root(tmp_path)
    warm = read_annotations(root)
    boxes = np.array(warm.boxes)
    (root / "Annotations" / "0.xml").write_text(voc_xml("0.jpg", []))
    os.utime(root / "Annotations" / "0.xml", ns=(5, 5))
    rebuilt = read_annotations(root)
    assert rebuilt._source_file == warm._source_file and rebuilt.num_objects == 2
    again = pickle.loads(pickle.dumps(warm))
    assert np.array_equal(again.boxes, boxes) and again.num_objects == 3


def test_a_worker_loading_a_file_with_another_checksum_fails_once_clearly(tmp_path):
    root = _root(tmp_path)
    warm = read_annotations(root)
    func, args = warm.__reduce__()
    with pytest.raises(cache_mod.CacheError, match=r"\.dlindex: the cache was rebuilt by another process.*CRC"):
        func(args[0], args[1], args[2], args[3] ^ 1)


_RANK = r"""
import os, sys, time
from pathlib import Path
import detloader.annotations.read as read_module
from detloader import read_annotations

root, marks, rank = Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[4]
cache = True if sys.argv[3] == "True" else sys.argv[3]
real = read_module.build_index


def counted(*args, **kwargs):
    with open(marks / "builds", "a") as fh:
        fh.write(rank + "\n")
    time.sleep(1.0)  # the other process reaches the lock while this one builds
    return real(*args, **kwargs)


read_module.build_index = counted
(marks / f"ready-{rank}").touch()
while len(list(marks.glob("ready-*"))) < 2:
    time.sleep(0.01)
index = read_annotations(root, cache=cache)
print(len(index), index.num_objects, index.source_file)
"""


@pytest.mark.parametrize("cache", [True, "rebuild"])
def test_two_processes_build_the_index_once_and_both_map_it(tmp_path, cache):
    """Under torchrun every rank calls read_annotations at once: one builds (under the lock
    beside the cache file), the other waits and maps the same file; with cache="rebuild" too
    (the file built while it waited is the rebuild it asked for). The lock file, removed by
    its holder while the other waits on it, is gone at the end and was never taken twice."""
    import subprocess
    import sys

    root = _root(tmp_path, n=5)
    marks = tmp_path / "marks"
    marks.mkdir()
    script = tmp_path / "rank.py"
    script.write_text(_RANK)
    command = [sys.executable, str(script), str(root), str(marks)]
    command = [*command, str(cache)]
    procs = [subprocess.Popen([*command, str(rank)], stdout=subprocess.PIPE, text=True) for rank in range(2)]
    outputs = [proc.communicate(timeout=120)[0].split() for proc in procs]
    assert [proc.returncode for proc in procs] == [0, 0]
    assert len((marks / "builds").read_text().split()) == 1  # one build, not two
    assert outputs[0] == outputs[1] and outputs[0][:2] == ["5", "5"]
    assert outputs[0][2].endswith(".dlindex") and not os.path.exists(outputs[0][2] + ".lock")  # its holder removed it


def _fresh_coco_in_its_image_folder(folder) -> tuple:
    for name in ("a.jpg", "b.jpg"):
        write_image(folder / name)
    data = {
        "images": [
            {"id": 1, "file_name": "a.jpg", "width": 64, "height": 48},
            {"id": 2, "file_name": "b.jpg", "width": 64, "height": 48},
        ],
        "annotations": [{"id": 1, "image_id": 1, "category_id": 1, "bbox": [1, 2, 10, 20]}],
        "categories": [{"id": 1, "name": "k"}],
    }
    path = folder / "instances.json"
    path.write_text(json.dumps(data))
    return path, data


def test_a_fresh_coco_dataset_in_its_image_folder_is_built_once(tmp_path, monkeypatch):
    monkeypatch.delenv(cache_mod.CACHE_DIR_ENV)  # the cache beside the data, as users get it
    path, data = _fresh_coco_in_its_image_folder(tmp_path / "data")
    assert not (tmp_path / "data" / cache_mod.CACHE_SUBDIR).exists()
    builds = []
    real = read_mod.build_index
    monkeypatch.setattr(read_mod, "build_index", lambda *a, **kw: builds.append(1) or real(*a, **kw))
    first = read_annotations(path)
    assert len(builds) == 1 and (tmp_path / "data" / cache_mod.CACHE_SUBDIR).is_dir()
    stamp = os.stat(first._source_file)
    second = read_annotations(path)  # creating the cache folder changed the root's identity: not a reason to rebuild
    assert len(builds) == 1 and second._source_file == first._source_file
    assert (os.stat(second._source_file).st_ino, os.stat(second._source_file).st_mtime_ns) == (
        stamp.st_ino,
        stamp.st_mtime_ns,
    )
    data["annotations"].append({"id": 2, "image_id": 2, "category_id": 1, "bbox": [3, 3, 5, 5]})
    path.write_text(json.dumps(data))
    os.utime(path, ns=(1, 1))
    assert read_annotations(path).num_objects == 2 and len(builds) == 2  # an edited annotation file rebuilds
    write_image(tmp_path / "data" / "c.jpg")  # an image added beside them changes the folder: rebuilt
    read_annotations(path)
    assert len(builds) == 3


# -- nothing left behind: the build lock goes with the build ------------------------------------
def test_no_lock_file_stays_after_a_build_a_failed_build_or_a_dead_builder(tmp_path, monkeypatch):
    from detloader.errors import AnnotationError

    root = _root(tmp_path)
    cache_file = read_annotations(root).source_file
    lock = f"{cache_file}.lock"
    assert not os.path.exists(lock)  # a build that ends well
    bad = root / "Annotations" / "1.xml"
    bad.write_text(voc_xml("1.jpg", [voc_object("k", (9, 1, 5, 5))]))  # xmax <= xmin
    with pytest.raises(AnnotationError, match="xmax=5 <= xmin=9"):
        read_annotations(root, on_error="raise")
    assert not os.path.exists(lock)  # an error under on_error="raise"

    def broken(*args, **kwargs):
        raise RuntimeError("the build died")

    real = read_mod.build_index
    monkeypatch.setattr(read_mod, "build_index", broken)
    with pytest.raises(RuntimeError, match="the build died"):
        read_annotations(root, cache="rebuild")
    assert not os.path.exists(lock)  # an exception inside the build
    monkeypatch.setattr(read_mod, "build_index", real)
    open(lock, "w").close()  # a builder killed (SIGKILL) leaves its lock: the next build removes it
    assert len(read_annotations(root, cache="rebuild", on_error="skip")) == 3 and not os.path.exists(lock)


def test_a_waiter_on_a_removed_lock_file_locks_the_new_one(tmp_path):
    """The holder removes the lock file while a waiter has it open: the waiter must not take
    the lock on the removed file (a third process would then lock a new file at the same
    time); it locks the file the name names, so the third is refused while it holds it."""
    import threading
    import time

    from detloader._system.locks import locked

    cache_file = tmp_path / "x.dlindex"
    lock = tmp_path / "x.dlindex.lock"
    holding, release = threading.Event(), threading.Event()

    def waiter() -> None:
        with cache_mod.build_lock(cache_file):
            holding.set()
            release.wait(30)

    with cache_mod.build_lock(cache_file):
        thread = threading.Thread(target=waiter)
        thread.start()
        time.sleep(0.3)  # the waiter opens the lock file and waits on it (flock is per open file: a thread waits too)
        assert not holding.is_set()
    assert holding.wait(30)
    with locked(lock, wait=False) as mine:
        assert not mine  # the waiter holds the lock file that is there now
    release.set()
    thread.join(30)
    assert not lock.exists()
