"""End to end against an S3 server (moto, started in the test): a dataset packed, uploaded with
boto3 and read from its URL gives the local loader's draw (every balance strategy and the
shuffle, same seed and epoch, same multiset) and the local pixels; one epoch of a shard-local
order downloads about the pack once with a stream cache of a quarter of it, a random order of
the same draw more; two gloo ranks share out the one global draw and one stream cache; a resume
mid-epoch with other workers gives the remaining batches; the server gone is a named error with
every worker ended; the CLI reads the URL."""

from __future__ import annotations

import pickle
import time
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import torch

import detloader
from detloader import DetectionDataset, make_loader
from detloader.annotations.pack import MANIFEST_NAME, PackManifest
from detloader.annotations.writers.pack import write_pack
from detloader.balance.shard_order import ShardLocalSampler
from detloader.errors import StreamError
from detloader.loader import set_epoch
from detloader.loader.resume import ResumableLoader

IMAGES, SIZE = 96, (96, 72)
SHARD_SIZE = 12_000  # about 3 images a shard: a few dozen shards
SEED = 5
STRATEGIES = ("inverse", "sqrt", "power:0.5", "effective", "repeat_factor", "class_aware")


@pytest.fixture(scope="module")
def source_root(tmp_path_factory) -> Path:
    from detloader.annotations.synth import make_synthetic

    return make_synthetic(tmp_path_factory.mktemp("e2e") / "faces", IMAGES, seed=2, size=SIZE)


@pytest.fixture(scope="module")
def source(source_root):
    return detloader.read_annotations(source_root)


@pytest.fixture(scope="module")
def packed(source, tmp_path_factory) -> Path:
    return write_pack(source, tmp_path_factory.mktemp("pack") / "faces", shard_size=SHARD_SIZE)


@pytest.fixture(scope="module")
def manifest(packed) -> PackManifest:
    return PackManifest.from_json((packed / MANIFEST_NAME).read_bytes())


@pytest.fixture(scope="module")
def url(packed, manifest, s3_server) -> str:
    assert 20 <= len(manifest.shards) <= 60
    return s3_server.upload(packed, "e2e")


def _remote(url: str, folder: Path, limit: int):
    return detloader.read_annotations(url, stream_cache=folder, stream_cache_limit=limit)


def _kwargs(balance: str | None, **more) -> dict:
    order = {"balance": balance} if balance else {"shuffle": True}
    return {**order, "seed": SEED, "batch_size": 4, **more}


def _draw(loader, epoch: int) -> list[int]:
    set_epoch(loader, epoch)
    return [int(i) for i in loader.sampler]


def _ids(batches) -> list[int]:
    return [int(i) for batch in batches for i in batch.image_ids]


def _cached_bytes(index) -> int:
    shards = Path(index.meta["pack"]["cache_dir"]) / "shards"
    return sum(p.stat().st_size for p in shards.glob("*.bin")) if shards.is_dir() else 0


# -- the draw -------------------------------------------------------------------------------------


@pytest.mark.parametrize("balance", [*STRATEGIES, None])
def test_an_epoch_from_the_pack_draws_the_local_multiset(balance, source, url, manifest, s3, tmp_path):
    remote = _remote(url, tmp_path / "stream", manifest.total_bytes)
    local = make_loader(DetectionDataset(source), **_kwargs(balance))
    streamed = make_loader(DetectionDataset(remote), **_kwargs(balance))
    assert isinstance(streamed.sampler, ShardLocalSampler)
    draws = []
    for epoch in (0, 1):
        mine, theirs = _draw(streamed, epoch), _draw(local, epoch)
        assert Counter(mine) == Counter(theirs), (balance, epoch)
        assert mine != theirs  # the same draw in another (shard-local) order
        draws.append(mine)
    assert draws[0] != draws[1]


def test_the_draw_alone_fetches_no_shard_and_the_pixels_are_the_local_ones(source, url, manifest, s3, tmp_path):
    before = len(s3.gets())
    remote = _remote(url, tmp_path / "stream", manifest.total_bytes)
    streamed = DetectionDataset(remote)
    _draw(make_loader(streamed, balance="sqrt", seed=SEED), 0)
    assert [p for p, _ in s3.gets()[before:] if "/chunk-" in p] == []  # the manifest and the index only
    local = DetectionDataset(source)
    for i in range(len(source)):
        a, b = local[i], streamed[i]
        assert torch.equal(a.image, b.image), i
        assert np.array_equal(a.boxes, b.boxes) and np.array_equal(a.landmarks, b.landmarks)
        assert a.image_id == b.image_id == i


@pytest.mark.slow
def test_two_workers_load_the_local_multiset_through_the_batches(source, url, manifest, s3, tmp_path):
    remote = _remote(url, tmp_path / "stream", manifest.total_bytes)
    streamed = make_loader(DetectionDataset(remote), **_kwargs("repeat_factor", num_workers=2))
    local = make_loader(DetectionDataset(source), **_kwargs("repeat_factor"))
    for epoch in (0, 1):
        set_epoch(streamed, epoch)
        got = _ids(streamed)
        assert got == streamed.sampler.global_order()[0].tolist()  # in the sampler's order
        assert Counter(got) == Counter(_draw(local, epoch)), epoch


# -- what an epoch downloads -----------------------------------------------------------------------


def _epoch_gets(loader, index, s3, limit: int) -> tuple[int, int]:
    """Iterate one epoch of ``loader``; ``(bytes of shards the server sent, most bytes cached)``."""
    before = len(s3.gets("/e2e/chunk-"))
    most = 0
    for _ in loader:
        most = max(most, _cached_bytes(index))
    return sum(n for _, n in s3.gets("/e2e/chunk-")[before:]), most


def test_a_quarter_cache_downloads_a_sqrt_epoch_once_and_a_random_order_more(url, manifest, s3, tmp_path):
    total = manifest.total_bytes
    limit = total // 4
    assert limit >= 2 * max(s.bytes for s in manifest.shards)  # the shard read and the one fetched
    remote = _remote(url, tmp_path / "local_order", limit)
    loader = make_loader(DetectionDataset(remote), balance="sqrt", seed=SEED, batch_size=8)
    set_epoch(loader, 0)
    draw = loader.sampler.global_order()[0].tolist()  # what the epoch reads, in its order
    local_bytes, local_most = _epoch_gets(loader, remote, s3, limit)

    shuffled = np.random.default_rng(0).permutation(draw).tolist()  # the same draw, a random order
    other = _remote(url, tmp_path / "random_order", limit)
    random_loader = make_loader(DetectionDataset(other), sampler=shuffled, batch_size=8)
    random_bytes, random_most = _epoch_gets(random_loader, other, s3, limit)
    print(f"pack {total} B in {len(manifest.shards)} shards, stream cache limit {limit} B: one sqrt epoch "
          f"downloads {local_bytes / total:.2f}x the pack shard-locally, {random_bytes / total:.2f}x in a random "
          f"order of the same draw")
    assert max(local_most, random_most) <= limit
    assert local_bytes <= 1.5 * total
    assert random_bytes > 1.5 * total and random_bytes > local_bytes


# -- DDP ------------------------------------------------------------------------------------------

WORLD = 2


def _rank(rank: int, url: str, source_root: str, stream: str, limit: int, out: str) -> None:
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"file://{out}/rendezvous", rank=rank, world_size=WORLD)
    try:
        remote = _remote(url, Path(stream), limit)
        local = detloader.read_annotations(source_root)
        got = {}
        for balance in ("sqrt", "repeat_factor"):
            streamed = make_loader(DetectionDataset(remote), **_kwargs(balance))
            plain = make_loader(DetectionDataset(local), **_kwargs(balance))
            for epoch in (0, 1):
                set_epoch(streamed, epoch)
                items, ranks, _ = streamed.sampler.global_order()
                got[balance, epoch] = {"ids": _ids(streamed), "items": items, "ranks": ranks,
                                       "local": _draw(plain, epoch)}
        Path(out, f"rank{rank}.pkl").write_bytes(pickle.dumps(got))
    finally:
        dist.destroy_process_group()


@pytest.mark.slow
@pytest.mark.distributed
@pytest.mark.timeout(180)
def test_two_ranks_share_out_the_global_draw_and_one_stream_cache(source_root, source, packed, manifest, s3,
                                                                    tmp_path):
    import torch.multiprocessing as mp

    url = s3.upload(packed, "ddp")
    out = tmp_path / "out"
    out.mkdir()
    mp.spawn(_rank, args=(url, str(source_root), str(tmp_path / "stream"), manifest.total_bytes, str(out)),
             nprocs=WORLD, join=True)
    runs = [pickle.loads((out / f"rank{r}.pkl").read_bytes()) for r in range(WORLD)]
    for key in runs[0]:
        first, second = runs[0][key], runs[1][key]
        assert np.array_equal(first["items"], second["items"]) and np.array_equal(first["ranks"], second["ranks"])
        for r, run in enumerate((first, second)):
            assert run["ids"] == first["items"][first["ranks"] == r].tolist(), key  # disjoint positions
        assert len(first["ids"]) == len(second["ids"])
        union = Counter(first["ids"] + second["ids"])
        assert union == Counter(first["local"] + second["local"]), key  # the padded global draw
        assert sum(union.values()) == len(first["items"]) and len(first["items"]) % WORLD == 0
    fetched = [p.rsplit("/", 1)[-1] for p, _ in s3.gets("/ddp/chunk-")]
    assert sorted(fetched) == sorted(set(fetched))  # one node, one cache: each shard downloaded once
    print(f"2 ranks, 2 strategies x 2 epochs: {len(fetched)} of {len(manifest.shards)} shards downloaded, each once")


# -- resume ---------------------------------------------------------------------------------------


@pytest.mark.slow
def test_a_resume_mid_epoch_with_other_workers_gives_the_remaining_batches(url, manifest, s3, tmp_path):
    remote = _remote(url, tmp_path / "stream", manifest.total_bytes)
    dataset = DetectionDataset(remote)

    def loader(workers: int) -> ResumableLoader:
        return ResumableLoader(make_loader(dataset, **_kwargs("sqrt", num_workers=workers)))

    whole = loader(0)
    whole.set_epoch(1)
    expected = [b.image_ids.tolist() for b in whole]
    first = loader(2)
    first.set_epoch(1)
    taken, it = [], iter(first)
    for _ in range(5):
        taken.append(next(it).image_ids.tolist())
    state = first.state_dict()
    del it
    resumed = loader(0)
    resumed.load_state_dict(state)
    assert taken == expected[:5]
    assert [b.image_ids.tolist() for b in resumed] == expected[5:]


# -- the server gone ------------------------------------------------------------------------------


@pytest.mark.slow
def test_the_server_gone_mid_epoch_ends_every_worker_with_a_named_error(packed, manifest, own_s3, tmp_path):
    import psutil

    url = own_s3.upload(packed, "gone")
    remote = _remote(url, tmp_path / "stream", manifest.total_bytes)
    loader = make_loader(DetectionDataset(remote), **_kwargs("sqrt", num_workers=2, timeout=120))
    it = iter(loader)
    next(it)
    workers = [psutil.Process(w.pid) for w in it._workers]
    own_s3.stop()
    start = time.monotonic()
    with pytest.raises(StreamError, match=rf"{url}/chunk-\S+: not fetched after \d attempts.*check that the server"):
        for _ in it:
            pass
    took = time.monotonic() - start
    print(f"server gone mid-epoch: StreamError after {took:.1f} s")
    assert took < 60
    del it
    deadline = time.monotonic() + 10
    while any(_alive(w) for w in workers) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not any(_alive(w) for w in workers)
    left = [c for c in psutil.Process().children(recursive=True) if c.pid in {w.pid for w in workers}]
    assert left == []


def _alive(process) -> bool:
    import psutil

    try:
        return process.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


# -- the command line -----------------------------------------------------------------------------


@pytest.mark.slow
def test_the_cli_reads_the_url(url, manifest, s3, tmp_path, capsys):
    pytest.importorskip("faster_coco_eval")
    from detloader.cli import main

    stream = ["--stream-cache", str(tmp_path / "stream"), "--stream-cache-limit", str(manifest.total_bytes // 2)]
    assert main(["index", url, *stream]) == 0
    text = capsys.readouterr().out
    assert text.startswith(f"{url} (voc): {IMAGES} images") and f"pack: {url}, {len(manifest.shards)} shards" in text
    assert main(["stats", url, *stream, "--balance", "sqrt"]) == 0
    text = capsys.readouterr().out
    assert text.startswith(f"{url}: {IMAGES} images") and "# balance sqrt by class" in text
    assert main(["show", url, *stream, "--n", "4", "--out", str(tmp_path / "grid.png")]) == 0
    assert "grid.png: 4 images" in capsys.readouterr().out and (tmp_path / "grid.png").stat().st_size > 0
    run = tmp_path / "run"
    common = ["--size", "64", "--batch-size", "8", "--width", "4", "--num-workers", "0", "--out", str(run)]
    assert main(["train", url, *stream, "--epochs", "1", "--balance", "sqrt", *common]) == 0
    text = capsys.readouterr().out
    assert "epoch 1/1: loss" in text and "mAP@0.5" in text
    assert main(["evaluate", str(run / "last.pt"), url, *stream]) == 0
    text = capsys.readouterr().out
    assert "mAP@0.5" in text and "images" in text
    assert _cached_bytes(detloader.read_annotations(url, stream_cache=tmp_path / "stream")) <= manifest.total_bytes // 2
