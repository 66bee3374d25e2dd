"""Packs: written by litdata's writer, read from a folder and from an S3 server (moto, started in
the test), each image's bytes from a shard cache shared by the processes of a node and kept under
its limit; the faults (a corrupt or truncated shard, the server gone, another pack version, a
damaged index, a limit too small, a full disk) are named errors."""

from __future__ import annotations

import errno
import json
import multiprocessing
import os
import pickle
import shutil
import time
from pathlib import Path

import numpy as np
import pytest
from helpers import arrays_equal

import detloader
from detloader.annotations import pack as pack_format
from detloader.annotations.pack import MANIFEST_NAME, PackManifest, fetch_verified, read_pack_index
from detloader.annotations.writers.pack import write_pack
from detloader.dataset.shards import ShardCache
from detloader.errors import DiskFullError, PackError, StreamCacheLimitError, StreamError

SHARD_SIZE = 100_000  # about 4 synthetic images a shard: 6 shards for 24 images


@pytest.fixture(scope="module")
def source(small_synth_root):
    return detloader.read_annotations(small_synth_root)


@pytest.fixture(scope="module")
def packed(source, tmp_path_factory) -> Path:
    """The small synthetic dataset packed once. Read-only."""
    return write_pack(source, tmp_path_factory.mktemp("pack") / "faces", shard_size=SHARD_SIZE)


@pytest.fixture(scope="module")
def manifest(packed) -> PackManifest:
    return PackManifest.from_json((packed / MANIFEST_NAME).read_bytes())


@pytest.fixture
def quick_retries(monkeypatch):
    """Retries without the real waits (the test of the server gone keeps them)."""
    monkeypatch.setattr(pack_format, "FETCH_BACKOFF_S", (0.05, 0.05))


def _originals(index) -> list[bytes]:
    return [index.image_path(i).read_bytes() for i in range(len(index))]


def _shard_files(folder: Path) -> list[str]:
    shards = folder / "shards"
    return sorted(p.name for p in shards.iterdir()) if shards.is_dir() else []


def _cached_bytes(folder: Path) -> int:
    return sum(p.stat().st_size for p in (folder / "shards").iterdir() if p.name.endswith(".bin"))


def _copy_pack(packed: Path, to: Path) -> Path:
    shutil.copytree(packed, to)
    return to


# -- writing ------------------------------------------------------------------------------------


def test_packing_twice_writes_identical_files_with_no_machine_path(source, packed, small_synth_root, tmp_path):
    copy = shutil.copytree(small_synth_root, tmp_path / "elsewhere")
    again = write_pack(detloader.read_annotations(copy), tmp_path / "again", shard_size=SHARD_SIZE)
    names = sorted(p.name for p in packed.iterdir())
    assert names == sorted(p.name for p in again.iterdir())
    assert {"detloader-pack.json", "index.json", "index.dlindex"} <= set(names)
    for name in names:
        assert (packed / name).read_bytes() == (again / name).read_bytes(), name
    for name in ("index.dlindex", "detloader-pack.json", "index.json"):
        assert str(small_synth_root).encode() not in (packed / name).read_bytes()
    manifest = json.loads((packed / MANIFEST_NAME).read_text())
    assert manifest["pack_version"] == pack_format.PACK_VERSION and manifest["images"] == len(source)
    assert len(manifest["shards"]) >= 4
    items = [s["items"] for s in manifest["shards"]]
    assert [s["first_row"] for s in manifest["shards"]] == [sum(items[:k]) for k in range(len(items))]


def test_litdata_streaming_dataset_reads_the_pack(source, packed, tmp_path):
    from litdata import StreamingDataset

    dataset = StreamingDataset(str(packed), cache_dir=str(tmp_path / "litdata"))
    assert len(dataset) == len(source)
    for row, original in enumerate(_originals(source)):
        item = dataset[row]
        assert item["row"] == row and item["bytes"] == original


def test_an_image_that_cannot_be_read_stops_the_pack_by_name(small_synth_root, tmp_path):
    copy = shutil.copytree(small_synth_root, tmp_path / "data")
    index = detloader.read_annotations(copy)
    index.image_path(5).unlink()
    with pytest.raises(PackError, match=r"synth_000005\.jpg: image of row 5 cannot be read"):
        write_pack(index, tmp_path / "out", shard_size=SHARD_SIZE)
    assert list((tmp_path / "out").iterdir()) == []  # nothing half written


# -- reading the index --------------------------------------------------------------------------


def _same_index(got, source) -> None:
    assert len(got) == len(source) and arrays_equal(got, source)
    assert got.vocab.to_dict() == source.vocab.to_dict()
    assert got.splits.keys() == source.splits.keys()
    assert all(np.array_equal(got.splits[k], source.splits[k]) for k in source.splits)
    assert got.problems.to_list() == source.problems.to_list()
    assert got.image_paths() == source.image_paths()
    assert got.meta["format"] == source.meta["format"]


def test_read_pack_index_from_a_folder_and_from_s3_equals_the_source(source, packed, s3, tmp_path):
    local = read_pack_index(packed, tmp_path / "cache")
    _same_index(local, source)
    url = s3.upload(packed, "same-index")
    before = len(s3.gets())
    remote = read_pack_index(url, tmp_path / "cache_s3", cache_limit=1 << 20)
    _same_index(remote, source)
    fetched = sorted(p.rsplit("/", 1)[-1] for p, _ in s3.gets()[before:])
    assert fetched == ["detloader-pack.json", "index.dlindex"]  # no image, no shard
    assert remote.meta["pack"]["url"] == url and remote.meta["pack"]["cache_limit"] == 1 << 20
    worker = pickle.loads(pickle.dumps(remote))  # what a DataLoader worker gets: the same file, mapped
    assert worker.meta["pack"] == remote.meta["pack"] and arrays_equal(worker, source)


def test_a_pack_of_another_version_is_refused_by_name(packed, tmp_path):
    other = _copy_pack(packed, tmp_path / "old")
    data = json.loads((other / MANIFEST_NAME).read_text())
    data.update(pack_version=99, detloader_version="9.9.9")
    (other / MANIFEST_NAME).write_text(json.dumps(data))
    with pytest.raises(PackError, match=r"pack_version=99, written by detloader 9\.9\.9; this detloader reads"):
        read_pack_index(other, tmp_path / "cache")


def test_a_damaged_index_is_refused_by_name(packed, tmp_path, quick_retries):
    from detloader.annotations.cache import _read_header

    damaged = _copy_pack(packed, tmp_path / "damaged")
    header, data_start = _read_header(damaged / "index.dlindex")
    raw = bytearray((damaged / "index.dlindex").read_bytes())
    raw[data_start + header["arrays"]["boxes"][2]] ^= 0xFF  # a box coordinate
    (damaged / "index.dlindex").write_bytes(bytes(raw))
    with pytest.raises(StreamError, match=r"index\.dlindex: not fetched after 3 attempts.*sha256 .* differs"):
        read_pack_index(damaged, tmp_path / "cache")
    data = json.loads((damaged / MANIFEST_NAME).read_text())  # a manifest that vouches for it: the CRC
    data["index_sha256"] = pack_format.file_sha256(damaged / "index.dlindex")
    (damaged / MANIFEST_NAME).write_text(json.dumps(data))
    with pytest.raises(PackError, match=r"index\.dlindex: damaged packed index .*CRC-32"):
        read_pack_index(damaged, tmp_path / "cache")


# -- the shard cache ----------------------------------------------------------------------------


def test_every_row_gives_its_original_bytes(source, packed, s3, tmp_path):
    index = read_pack_index(s3.upload(packed, "every-row"), tmp_path / "cache", cache_limit=1 << 22)
    cache = ShardCache.for_index(index)
    assert [cache.get(row) for row in range(len(index))] == _originals(source)
    again = pickle.loads(pickle.dumps(cache))  # a spawned worker's copy: its own client, same files
    assert again.get(len(index) - 1) == _originals(source)[-1] and again.downloaded == []


def test_the_cache_stays_under_a_quarter_of_the_pack_and_fetches_each_shard_once(source, packed, manifest, s3,
                                                                                tmp_path):
    prefix = "quarter"
    index = read_pack_index(s3.upload(packed, prefix), tmp_path / "cache")
    limit = max(manifest.total_bytes // 4, max(s.bytes for s in manifest.shards))
    cache = ShardCache.for_index(index, limit=limit)
    folder = Path(index.meta["pack"]["cache_dir"])
    originals = _originals(source)
    order = np.random.default_rng(0).permutation(len(manifest.shards))
    before = len(s3.gets(f"/{prefix}/chunk-"))
    most = 0
    for shard in order:
        info = manifest.shards[shard]
        for row in np.random.default_rng(int(shard)).permutation(range(info.first_row, info.first_row + info.items)):
            assert cache.get(int(row)) == originals[row]
            most = max(most, _cached_bytes(folder))
    gets = s3.gets(f"/{prefix}/chunk-")[before:]
    assert most <= limit
    print(f"pack {manifest.total_bytes} B in {len(manifest.shards)} shards, limit {limit} B, most cached {most} B, "
          f"GET {sum(n for _, n in gets)} B")
    assert sorted(p.rsplit("/", 1)[-1] for p, _ in gets) == sorted(s.filename for s in manifest.shards)
    assert sum(n for _, n in gets) == manifest.total_bytes  # downloaded: the pack's bytes, once


def _upload_with(s3, packed: Path, prefix: str, shard: str, body: bytes) -> str:
    url = s3.upload(packed, prefix)
    s3.client().put_object(Bucket="detdata", Key=f"{prefix}/{shard}", Body=body)
    return url


@pytest.mark.parametrize("fault", ["corrupt", "truncated"])
def test_a_shard_not_as_packed_is_never_served_nor_cached(source, packed, manifest, s3, tmp_path, quick_retries,
                                                          fault):
    info = manifest.shards[2]
    raw = bytearray((packed / info.filename).read_bytes())
    if fault == "corrupt":
        raw[-100] ^= 0xFF
    else:
        raw = raw[: len(raw) // 2]
    url = _upload_with(s3, packed, f"fault-{fault}", info.filename, bytes(raw))
    index = read_pack_index(url, tmp_path / "cache", cache_limit=1 << 22)
    cache = ShardCache.for_index(index)
    expect = "sha256 .* differs" if fault == "corrupt" else f"{len(raw)} bytes, the manifest records {info.bytes}"
    with pytest.raises(StreamError, match=rf"{url}/{info.filename}: not fetched after 3 attempts.*{expect}") as err:
        cache.get(info.first_row)
    print(err.value)
    assert err.value.url == url and err.value.file == info.filename
    assert "upload" in str(err.value)  # what to do
    assert _shard_files(Path(index.meta["pack"]["cache_dir"])) == []  # no shard, no partial file, no lock
    assert cache.get(0) == _originals(source)[0]  # the other shards still serve


def test_the_server_gone_mid_read_is_a_named_error_within_60_s(source, packed, manifest, own_s3, tmp_path):
    index = read_pack_index(own_s3.upload(packed, "gone"), tmp_path / "cache", cache_limit=1 << 22)
    cache = ShardCache.for_index(index)
    assert cache.get(0) == _originals(source)[0]
    own_s3.stop()
    later = manifest.shards[-1].first_row
    start = time.monotonic()
    with pytest.raises(StreamError, match=r"not fetched after \d attempts in .* s; last: .*check that the server") as e:
        cache.get(later)
    print(e.value)
    took = time.monotonic() - start
    assert took < 60, took
    print(f"server gone: named error after {took:.1f} s")
    assert cache.get(1) == _originals(source)[1]  # what is cached still serves
    assert [n for n in _shard_files(Path(index.meta["pack"]["cache_dir"])) if not n.endswith(".bin")] == []


def _read_rows(cache: ShardCache, rows: list[int], barrier, out) -> None:
    barrier.wait()
    out.put([cache.get(r) for r in rows])


def test_two_processes_reading_one_shard_download_it_once(source, packed, manifest, s3, tmp_path):
    prefix = "two-processes"
    index = read_pack_index(s3.upload(packed, prefix), tmp_path / "cache", cache_limit=1 << 22)
    cache = ShardCache.for_index(index)
    assert cache.get(0) == _originals(source)[0]  # the parent holds shard 0 and a client: not the children's
    info = manifest.shards[1]
    rows = list(range(info.first_row, info.first_row + info.items))
    context = multiprocessing.get_context("fork")
    barrier, out = context.Barrier(2), context.Queue()
    workers = [context.Process(target=_read_rows, args=(cache, rows, barrier, out)) for _ in range(2)]
    for w in workers:
        w.start()
    results = [out.get(timeout=60) for _ in workers]
    for w in workers:
        w.join(60)
    originals = _originals(source)
    assert results == [[originals[r] for r in rows]] * 2
    assert [p.rsplit("/", 1)[-1] for p, _ in s3.gets(f"/{prefix}/chunk-")] == ["chunk-0-0.bin", info.filename]


def test_a_limit_that_cannot_hold_the_shards_in_use_is_named(source, packed, manifest, tmp_path):
    index = read_pack_index(packed, tmp_path / "cache")
    biggest = max(s.bytes for s in manifest.shards)
    with pytest.raises(StreamCacheLimitError, match=rf"has {biggest} bytes, more than the stream cache limit=1000"):
        ShardCache.for_index(index, limit=1000)
    reader = ShardCache.for_index(index, limit=biggest + 10)  # one shard: another process reads it
    other = ShardCache(str(packed), manifest, index.meta["pack"]["cache_dir"], biggest + 10, room_wait_s=0.2)
    reader.get(0)
    with pytest.raises(StreamCacheLimitError, match=r"no room for shard .* raise the stream cache limit"):
        other.get(manifest.shards[-1].first_row)
    reader.close()  # it moves on: the room is there
    last = manifest.shards[-1].first_row
    assert other.get(last) == _originals(source)[last]


def test_a_full_disk_is_named(tmp_path):
    class FullDisk:
        def download_file(self, remote, local):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), local)

    with pytest.raises(DiskFullError, match=r"s3://b/p/chunk-0-0\.bin not cached, no space left"):
        fetch_verified(FullDisk(), "s3://b/p", "chunk-0-0.bin", tmp_path, 10, "0" * 64)
    assert list(tmp_path.iterdir()) == []


class _Bytes:
    """A map-style dataset of a pack's image bytes (what a DataLoader worker pickles)."""

    def __init__(self, cache: ShardCache, n: int) -> None:
        self.cache, self.n = cache, n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, row: int) -> tuple[int, bytes]:
        return row, self.cache.get(row)


def _as_list(batch: list) -> list:
    return batch


@pytest.mark.slow
def test_spawned_dataloader_workers_share_one_download_per_shard(source, packed, manifest, s3, tmp_path):
    from torch.utils.data import DataLoader

    prefix = "spawn"
    index = read_pack_index(s3.upload(packed, prefix), tmp_path / "cache", cache_limit=manifest.total_bytes)
    loader = DataLoader(_Bytes(ShardCache.for_index(index), len(index)), batch_size=2, num_workers=2,
                        multiprocessing_context="spawn", collate_fn=_as_list)
    got = dict(item for batch in loader for item in batch)
    assert [got[r] for r in range(len(index))] == _originals(source)
    names = sorted(p.rsplit("/", 1)[-1] for p, _ in s3.gets(f"/{prefix}/chunk-"))
    assert names == sorted(s.filename for s in manifest.shards)  # once each, whichever worker asked first
