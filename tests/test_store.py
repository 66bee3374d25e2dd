"""The store of decoded images (DetectionDataset(cache=...)): same samples as decoding, never
stale, damaged files rebuilt, one build per node under the lock, size refused up front."""

from __future__ import annotations

import os
import pickle
import subprocess
import sys
import textwrap
import warnings
from dataclasses import fields

import numpy as np
import pytest
from PIL import Image

from detloader import read_annotations
from detloader.dataset import DetectionDataset
from detloader.images import ImageDecodeError
from detloader.loader import make_loader
from detloader.store import ImageStore, StoreTooLargeError, cache_size_from, store_sizes
from detloader.synth import make_synthetic
from detloader.transforms import Compose, RandomHorizontalFlip, Resize

LETTERBOX = Compose([RandomHorizontalFlip(), Resize(48, mode="letterbox")])


@pytest.fixture()
def index(tmp_path, monkeypatch):
    monkeypatch.setenv("DETLOADER_CACHE_DIR", str(tmp_path / "cache"))
    return read_annotations(make_synthetic(tmp_path / "ds", 10, seed=0, size=(96, 72)))


def psnr(a, b) -> float:
    mse = float(((a.float() - b.float()) ** 2).mean())
    return 99.0 if mse == 0 else 10 * np.log10(255**2 / mse)


def test_samples_match_decoding_for_any_num_workers(index):
    plain = DetectionDataset(index, LETTERBOX, seed=3)
    stored = DetectionDataset(index, LETTERBOX, seed=3, cache="disk")
    assert stored.store is not None and stored.store.path.suffix == ".dlstore"
    assert len(pickle.dumps(stored)) < 50_000  # the file's name travels to workers, never the pixels
    batches = [list(make_loader(d, batch_size=4, num_workers=w)) for d, w in ((plain, 0), (stored, 0), (stored, 2))]
    for a, b, c in zip(*batches):
        assert psnr(a.images, b.images) >= 30 and np.array_equal(b.images.numpy(), c.images.numpy())
        assert np.array_equal(a.boxes, b.boxes) and np.array_equal(b.boxes, c.boxes)
        assert np.array_equal(a.landmarks, b.landmarks) and np.array_equal(a.visibility, b.visibility)
    for i in range(len(index)):
        assert stored[i].scale == plain[i].scale and stored[i].offset == plain[i].offset


@pytest.mark.parametrize("transform", [Resize(48, mode="letterbox"), Resize((40, 56))], ids=["letterbox", "fixed"])
def test_batches_identical_with_and_without_the_store_for_a_deterministic_transform(index, transform):
    plain = DetectionDataset(index, transform, seed=0)
    stored = DetectionDataset(index, transform, seed=0, cache="disk")  # stored at the resize's output
    assert {stored.store.size(i) for i in range(len(index))} == {transform.content_size(96, 72)}
    pairs = list(zip(make_loader(plain, batch_size=4), make_loader(stored, batch_size=4, num_workers=2)))
    assert len(pairs) == 3
    for a, b in pairs:
        for f in fields(a):
            x, y = getattr(a, f.name), getattr(b, f.name)
            assert np.array_equal(np.asarray(x), np.asarray(y)), f.name


def test_a_write_into_a_sample_never_reaches_the_store(index):
    stored = DetectionDataset(index, LETTERBOX, seed=0, cache="disk")
    want = stored[1].image.clone()
    stored[1].image.zero_()  # the sample wraps the map's pages: copy-on-write, this process only
    assert np.array_equal(DetectionDataset(index, LETTERBOX, seed=0, cache="disk")[1].image, want)


def test_cache_size_from_the_transform_or_required(index):
    # the transform's first resize sizes each stored image: what it gives the image (never more pixels)
    assert cache_size_from(LETTERBOX) is LETTERBOX.transforms[1]
    shorter = Resize(30, mode="shorter", max_size=40)
    assert cache_size_from(shorter) is shorter and cache_size_from(RandomHorizontalFlip()) is None
    assert [np.unique(s).tolist() for s in store_sizes(index, LETTERBOX.transforms[1])] == [[48], [36]]
    assert [np.unique(s).tolist() for s in store_sizes(index, shorter)] == [[40], [30]]
    assert [np.unique(s).tolist() for s in store_sizes(index, Resize((200, 20)))] == [[200], [20]]
    assert [np.unique(s).tolist() for s in store_sizes(index, Resize((200, 200)))] == [[96], [72]]  # not enlarged
    assert [np.unique(s).tolist() for s in store_sizes(index, 40)] == [[40], [30]]
    with pytest.raises(ValueError, match="cache_size="):
        DetectionDataset(index, RandomHorizontalFlip(), cache="disk")
    with pytest.raises(ValueError, match="cache='nvme'"):
        DetectionDataset(index, LETTERBOX, cache="nvme")  # type: ignore[arg-type]
    sample = DetectionDataset(index, None, cache="disk", cache_size=40)[0]
    assert sample.size == (40, 30) and sample.scale == (40 / 96, 30 / 72)


def test_a_changed_image_is_never_served_stale(index):
    stored = DetectionDataset(index, None, seed=0, cache="disk", cache_size=48)
    path = index.image_path(2)
    Image.new("RGB", (96, 72), (250, 10, 10)).save(path, quality=95)
    with pytest.warns(RuntimeWarning, match="changed since the image store was built"):
        image = stored[2].image  # the map opened before the change: decoded from the file
    assert abs(int(image[0].float().mean()) - 250) <= 3
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # reopening refreshes the slot: no stale warning
        again = DetectionDataset(index, None, seed=0, cache="disk", cache_size=48)[2].image
    assert np.array_equal(again.numpy(), image.numpy())


@pytest.mark.parametrize("damage", ["truncate", "table", "magic"])
def test_a_damaged_store_is_rebuilt(index, damage):
    first = DetectionDataset(index, None, cache="disk", cache_size=48)
    want = [first[i].image.numpy().copy() for i in range(len(index))]  # samples share the map: damaged below
    path = first.store.path
    data = bytearray(path.read_bytes())
    if damage == "truncate":
        data = data[:-7]
    else:
        data[0 if damage == "magic" else 60] ^= 0xFF
    path.write_bytes(bytes(data))
    with pytest.warns(RuntimeWarning, match="image store unusable.*rebuilding"):
        again = DetectionDataset(index, None, cache="disk", cache_size=48)
    assert all(np.array_equal(again[i].image.numpy(), want[i]) for i in range(len(index)))


def test_two_processes_build_once(index, tmp_path):
    log = tmp_path / "builds.log"
    script = textwrap.dedent(f"""
        from detloader import read_annotations
        from detloader.dataset import DetectionDataset
        from detloader.store import ImageStore
        build = ImageStore._build
        def logged(self, *args, **kwargs):
            with open({str(log)!r}, "a") as fh:
                fh.write("built\\n")
            return build(self, *args, **kwargs)
        ImageStore._build = logged
        d = DetectionDataset(read_annotations({str(index.root)!r}), None, cache="disk", cache_size=48)
        print(d.store.path.stat().st_ino, int(d[3].image.float().sum()))
    """)
    env = {**os.environ}
    procs = [
        subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True, env=env) for _ in range(2)
    ]
    outs = [p.communicate(timeout=120)[0].split() for p in procs]
    assert all(p.returncode == 0 for p in procs)
    assert log.read_text().count("built") == 1
    assert outs[0] == outs[1]


def test_too_large_is_refused_with_the_numbers(index, monkeypatch):
    monkeypatch.setattr("detloader.dataset.store_files.free_bytes", lambda kind, folder: 10_000)
    with pytest.raises(StoreTooLargeError, match=r"10 images .* needs 0\.1 MiB .* only 0\.0 MiB of disk is free"):
        DetectionDataset(index, None, cache="disk", cache_size=48)


@pytest.mark.filterwarnings("ignore:.*substituted image:RuntimeWarning")
def test_decode_errors_follow_the_policy(index):
    bad = index.image_path(4)
    bad.write_bytes(b"\xff\xd8\xff not a jpeg")
    with pytest.raises(ImageDecodeError, match=rf"{bad.name}.*dataset index 4"):
        DetectionDataset(index, None, cache="disk", cache_size=48)
    skipping = DetectionDataset(index, None, seed=0, cache="disk", cache_size=48, on_decode_error="skip")
    with pytest.warns(RuntimeWarning, match="skipped"):
        assert skipping[4].image_id != 4
    assert [i for i, _ in skipping.skipped] == [4]


def test_ram_store_in_shared_memory(index):
    d = DetectionDataset(index, LETTERBOX, seed=1, cache="ram")
    try:
        assert os.path.dirname(d.store.path) in ("/dev/shm", os.path.realpath(os.environ.get("TMPDIR", "/tmp")))
        plain = DetectionDataset(index, LETTERBOX, seed=1)
        assert psnr(d[1].image, plain[1].image) >= 30
        assert isinstance(d.store, ImageStore) and "store=" in repr(d)
    finally:
        for p in (d.store.path, f"{d.store.path}.lock"):
            if os.path.exists(p):
                os.unlink(p)


def test_cli_bench_times_the_store_against_decoding(index, capsys):
    from detloader.cli.parser import main

    assert main(["bench", str(index.root), "--quick", "--json", "--sections", "loader", "--cache", "disk"]) == 0
    import json

    data = json.loads(capsys.readouterr().out)
    store = data["figures"]["loader"]["store"]
    assert store["cache"] == "disk" and store["bytes"] > 0 and set(store["detloader"]) >= {"0"}
    whats = [r["what"] for r in data["ratios"]]
    assert any(w.startswith("cache=disk: best store epoch") for w in whats)
    assert "num_workers=0: cache=disk / decoding" in whats


def test_cli_show_reads_the_store(index, tmp_path, capsys):
    from detloader.cli.parser import main

    out = tmp_path / "grid.png"
    argv = ["show", str(index.root), "--out", str(out), "--n", "2", "--tile", "64", "--after-transform", "--size", "40"]
    assert main([*argv, "--cache", "disk", "--cache-size", "40"]) == 0 and out.exists()
    assert any(p.suffix == ".dlstore" for p in (tmp_path / "cache").rglob("*"))
    assert main(["show", str(index.root), "--out", str(out), "--cache", "disk"]) == 2
    assert "--after-transform" in capsys.readouterr().err


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
def test_augmentation_mosaic_and_mixup_read_the_stored_pixels_as_decoding_gives_them(index):
    from detloader.transforms import ColorJitter, MixUp, Mosaic, RandomAffine

    transform = Compose([RandomHorizontalFlip(), ColorJitter(hue=0.1), Resize(48, mode="letterbox"), RandomAffine()])
    mix = {"mosaic": Mosaic(p=1.0), "mixup": MixUp(p=0.5), "shuffle": True, "seed": 0, "batch_size": 4}
    plain = list(make_loader(DetectionDataset(index, transform, seed=1), **mix))
    stored = list(make_loader(DetectionDataset(index, transform, seed=1, cache="disk"), num_workers=2, **mix))
    for a, b in zip(plain, stored, strict=True):
        assert np.array_equal(a.images, b.images) and np.allclose(a.boxes, b.boxes, atol=1e-3)


# -- reliability (issue 31): other datasets' pixels, full disks, special files, damaged pixels --
def _run(script: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", textwrap.dedent(script)], capture_output=True, text=True,
                          timeout=timeout, env={**os.environ})


def test_two_copies_with_the_same_folder_name_never_share_a_ram_store(tmp_path):
    roots = [make_synthetic(tmp_path / p / "ds", 6, seed=s, size=(96, 72)) for p, s in (("a", 0), ("b", 1))]
    out = _run(f"""
        import numpy as np
        from detloader import read_annotations
        from detloader.dataset import DetectionDataset
        from detloader.loader import make_loader
        from detloader.transforms import Resize
        t = Resize(48, mode="letterbox")
        indexes = [read_annotations(r) for r in {[str(r) for r in roots]!r}]
        stored = [DetectionDataset(i, t, cache="ram") for i in indexes]  # both open at once
        for index, d in zip(indexes, stored):
            plain = DetectionDataset(index, t)
            assert all(np.array_equal(d[k].image, plain[k].image) for k in range(len(d))), d.store.path
            for batch, want in zip(make_loader(d, batch_size=3, num_workers=2), make_loader(plain, batch_size=3)):
                assert np.array_equal(batch.images, want.images)  # the workers map the same store
        print(*[d.store.path for d in stored])
    """)
    assert out.returncode == 0, out.stderr
    paths = out.stdout.split()
    assert len(set(paths)) == 2 and all(os.path.basename(p).startswith("ds-") for p in paths)
    assert not any(os.path.exists(p) or os.path.exists(p + ".lock") for p in paths)  # the last user removed it


def test_a_ram_store_lives_while_a_process_uses_it(index):
    import gc

    killed = _run(f"""
        import os, signal
        from detloader import read_annotations
        from detloader.dataset import DetectionDataset
        d = DetectionDataset(read_annotations({str(index.root)!r}), None, cache="ram", cache_size=40)
        print(d.store.path, flush=True)
        os.kill(os.getpid(), signal.SIGKILL)  # out of memory: no clean-up ran
    """)
    orphan = killed.stdout.split()[0]
    assert os.path.exists(orphan)
    d = DetectionDataset(index, None, cache="ram", cache_size=48)  # any ram store opened sweeps unused ones
    assert not os.path.exists(orphan)
    path = d.store.path
    twin = DetectionDataset(index, None, cache="ram", cache_size=48)
    assert twin.store.path == path and twin[0].image.sum() == d[0].image.sum()
    del d
    gc.collect()
    assert path.exists()  # twin still uses it
    del twin
    gc.collect()
    assert not path.exists() and not os.path.exists(f"{path}.lock")


def test_a_full_disk_is_named_and_leaves_nothing(index, monkeypatch):
    import errno

    from detloader.errors import DiskFullError

    folder = DetectionDataset(index, None, cache="disk", cache_size=40).store.path.parent

    def full(fd, offset, size):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "posix_fallocate", full)
    with pytest.raises(DiskFullError, match=r"\.dlstore: image store for 10 images .* not built, no space left while "
                       r"writing it \(0\.\d MiB needed.*free some space or use a smaller cache_size.*cache=None"):
        DetectionDataset(index, None, cache="disk", cache_size=48)
    monkeypatch.setattr(os, "posix_fallocate", lambda fd, offset, size: os.ftruncate(fd, size))
    monkeypatch.setattr(os, "pwrite", lambda fd, data, at: full(fd, at, 0))  # no reservation: the writes fail
    with pytest.raises(DiskFullError, match="no space left while writing it"):
        DetectionDataset(index, None, cache="disk", cache_size=48)
    assert not [p for p in folder.iterdir() if p.name.endswith(".tmp")]


def test_a_damaged_store_is_removed_first_when_both_do_not_fit(index, monkeypatch):
    first = DetectionDataset(index, None, cache="disk", cache_size=48).store.path
    size = first.stat().st_size
    with open(first, "r+b") as fh:
        fh.truncate(size - 3)
    monkeypatch.setattr("detloader.dataset.store_files.free_bytes", lambda kind, folder: size // 2)
    with pytest.warns(RuntimeWarning, match="rebuilding"):
        again = DetectionDataset(index, None, cache="disk", cache_size=48)
    assert again.store.path.stat().st_size == size and again.store.verify() == []


def test_a_file_size_limit_refuses_the_store_up_front(index):
    out = _run(f"""
        import resource, signal
        from detloader import read_annotations
        from detloader.dataset import DetectionDataset
        from detloader.errors import StoreTooLargeError
        index = read_annotations({str(index.root)!r})
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (20_000, resource.RLIM_INFINITY))
        try:
            DetectionDataset(index, None, cache="disk", cache_size=48)
        except StoreTooLargeError as err:
            print("refused:", err)
        import detloader.dataset.store_files as f
        f.file_size_limit = lambda: float("inf")  # past the check: the kernel's EFBIG is named too
        try:
            DetectionDataset(index, None, cache="disk", cache_size=48)
        except StoreTooLargeError as err:
            print("refused:", err)
    """)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert len(lines) == 2 and all("RLIMIT_FSIZE" in line and "ulimit -f" in line for line in lines), out.stdout
    assert not list((index.root.parent / "cache").rglob("*.tmp"))


@pytest.mark.parametrize("where", ["store", "lock"])
def test_a_fifo_where_the_store_is_is_refused_at_once(index, where):
    path = DetectionDataset(index, None, cache="disk", cache_size=48).store.path
    fifo = path if where == "store" else f"{path}.lock"
    if os.path.exists(fifo):  # the build removed its lock file
        os.unlink(fifo)
    os.mkfifo(fifo)
    out = _run(f"""
        from detloader import read_annotations
        from detloader.dataset import DetectionDataset
        from detloader.errors import NotRegularFileError
        try:
            DetectionDataset(read_annotations({str(index.root)!r}), None, cache="disk", cache_size=48)
        except NotRegularFileError as err:
            print(err)
    """, timeout=60)
    assert out.returncode == 0, out.stderr
    assert f"{fifo}: a FIFO, not a regular file, where the image store keeps its" in out.stdout
    assert "remove it (the store is then rebuilt) or use cache=None" in out.stdout


def test_verify_names_the_images_whose_pixels_changed(index, capsys):
    from detloader.cli.parser import main

    store = DetectionDataset(index, None, cache="disk", cache_size=48).store
    assert store.verify() == []
    assert main(["validate", str(index.root), "--store", "--no-images"]) == 0
    assert "store ok" in capsys.readouterr().out
    at = store._data_offset + int(store._rows()[7]["offset"]) + 100
    with open(store.path, "r+b") as fh:
        fh.seek(at)
        byte = fh.read(1)
        fh.seek(at)
        fh.write(bytes([byte[0] ^ 0x01]))
    assert store.verify() == [7] and ImageStore.at(store.path).verify() == [7]
    assert main(["validate", str(index.root), "--store", "--no-images"]) == 1
    out = capsys.readouterr().out
    assert f"store damaged {store.path}: 1 of 10 images fail their checksum: 7 ({index.image_path(7)})" in out


def test_sweep_removes_the_temporary_file_of_a_dead_build_and_leaves_no_lock(tmp_path):
    from detloader.dataset import store_files as files

    tmp = tmp_path / ".ds-0123.dlstore.abcd1234.tmp"
    tmp.write_bytes(b"half a store")
    lock = tmp_path / "ds-0123.dlstore.lock"
    with files.locked(lock):  # its build runs: kept
        assert files.sweep(tmp_path) == [] and tmp.exists()
    assert files.sweep(tmp_path) == [tmp]
    assert list(tmp_path.iterdir()) == []
