"""A pack read from an S3 server against the same loader on the local source: images/s of one
epoch, and the bytes an epoch downloads in the shard-local order against a random order of
the same draw, counted on the server.

For each size (default 1k and 10k synthetic images of 96x72 pixels, 500 distinct ones
hard-linked, so a few KB each) the dataset is packed into about 50 shards and uploaded to an
S3 server run in this process (moto's server mode, as the tests run it: loopback, no real
network, no latency, the server on the same CPUs as the loader).

* ``local``, ``cold``, ``warm``: images/s of one ``balance="sqrt"`` epoch (seed 0, batch 32,
  ``num_workers=2``, persistent workers, decode only), on the local source, then from the
  server with an empty stream cache (epoch 0: the loader's start and every download counted)
  and with the cache filled (epoch 1; the cache holds the pack). The local loader is timed the
  same way (epoch 0 with its start, epoch 1 warm): ``cold`` is divided by the local epoch 0,
  ``warm`` by the local epoch 1.
* ``shard-local``, ``random``: bytes the server sent for the shards in one ``sqrt`` epoch with
  the stream cache limited to a quarter of the pack, over the pack's bytes: the loader's own
  shard-local order, then a random permutation of the same draw (``sampler=`` a list), each
  with an empty cache (``num_workers=0``).

    python benchmarks/bench_stream.py
    python benchmarks/bench_stream.py --images 1000
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

import detloader
from detloader import DetectionDataset, make_loader, set_epoch
from detloader.annotations.pack import MANIFEST_NAME, PackManifest
from detloader.annotations.synth import make_synthetic
from detloader.annotations.writers.pack import write_pack

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "stream"))  # the tests' counting server
from conftest import BUCKET, start_s3  # noqa: E402

SIZE = (96, 72)
SHARDS = 50


def _s3_environment() -> None:
    os.environ.update(AWS_ACCESS_KEY_ID="testing", AWS_SECRET_ACCESS_KEY="testing", AWS_DEFAULT_REGION="us-east-1",
                      AWS_REQUEST_CHECKSUM_CALCULATION="when_required",
                      AWS_RESPONSE_CHECKSUM_VALIDATION="when_required")


def _epochs_per_second(loader, epochs: tuple[int, ...]) -> list[float]:
    """Images/s of each epoch of ``loader``, timed from the start of its iteration to its end."""
    rates = []
    for epoch in epochs:
        set_epoch(loader, epoch)
        start, n = time.perf_counter(), 0
        for batch in loader:
            n += len(batch.image_ids)
        rates.append(n / (time.perf_counter() - start))
    return rates


def _shard_gets(server, prefix: str) -> int:
    return sum(n for _, n in server.gets(f"/{prefix}/chunk-"))


def run(server, num_images: int, work: Path) -> tuple[object, ...]:
    root = make_synthetic(work / f"src{num_images}", num_images, seed=0, size=SIZE, image_pool=500)
    source = detloader.read_annotations(root)
    image_bytes = sum(source.image_path(i).stat().st_size for i in range(len(source)))
    pack = write_pack(source, work / f"pack{num_images}", shard_size=max(1, image_bytes // SHARDS))
    manifest = PackManifest.from_json((pack / MANIFEST_NAME).read_bytes())
    total = manifest.total_bytes
    prefix = f"bench{num_images}"
    url = server.upload(pack, prefix)
    assert url == f"s3://{BUCKET}/{prefix}"
    options = {"balance": "sqrt", "seed": 0, "batch_size": 32}
    fast = {**options, "num_workers": 2, "persistent_workers": True}

    local = _epochs_per_second(make_loader(DetectionDataset(source), **fast), (0, 1))
    remote = detloader.read_annotations(url, stream_cache=work / f"warm{num_images}", stream_cache_limit=2 * total)
    streamed = _epochs_per_second(make_loader(DetectionDataset(remote), **fast), (0, 1))

    limit = total // 4
    quarter = detloader.read_annotations(url, stream_cache=work / f"local{num_images}", stream_cache_limit=limit)
    loader = make_loader(DetectionDataset(quarter), **options)
    set_epoch(loader, 0)
    draw = loader.sampler.global_order()[0]
    before = _shard_gets(server, prefix)
    for _ in loader:
        pass
    shard_local = _shard_gets(server, prefix) - before
    other = detloader.read_annotations(url, stream_cache=work / f"random{num_images}", stream_cache_limit=limit)
    shuffled = np.random.default_rng(0).permutation(draw).tolist()
    before = _shard_gets(server, prefix)
    for _ in make_loader(DetectionDataset(other), sampler=shuffled, batch_size=32):
        pass
    random_order = _shard_gets(server, prefix) - before
    return (num_images, len(manifest.shards), total / 2**20, local[0], streamed[0], streamed[0] / local[0],
            local[1], streamed[1], streamed[1] / local[1], shard_local / total, random_order / total)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--images", type=int, nargs="+", default=[1000, 10000])
    args = parser.parse_args(argv)
    _s3_environment()
    server = start_s3()
    os.environ["AWS_ENDPOINT_URL"] = server.endpoint
    print(f"moto S3 server in this process (loopback, no real network); {SIZE[0]}x{SIZE[1]} synthetic images, "
          f"balance sqrt, batch 32, num_workers=2; images/s, and shard bytes downloaded per epoch / pack bytes "
          f"with the stream cache at 1/4 of the pack")
    print(f"{'images':>7} {'shards':>6} {'pack MB':>7} | {'local e0':>8} {'cold':>7} {'ratio':>5} | "
          f"{'local e1':>8} {'warm':>7} {'ratio':>5} | {'shard-local':>11} {'random':>7}")
    try:
        with tempfile.TemporaryDirectory() as tmp:
            os.environ.setdefault("DETLOADER_CACHE_DIR", str(Path(tmp) / "cache"))
            for n in args.images:
                row = run(server, n, Path(tmp))
                print("{:>7,} {:>6} {:>7.1f} | {:>8.0f} {:>7.0f} {:>5.2f} | {:>8.0f} {:>7.0f} {:>5.2f} | "
                      "{:>10.2f}x {:>6.2f}x".format(*row), flush=True)
    finally:
        server.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
