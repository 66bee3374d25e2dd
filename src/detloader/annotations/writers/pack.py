"""``write_pack``: a dataset as a pack (``detloader pack``): its index and each image's original
bytes in litdata chunks, written by litdata's own ``BinaryWriter`` so that
``litdata.StreamingDataset(OUT)`` reads it too. The layout and the manifest:
:mod:`detloader.annotations.pack`; why litdata: docs/loader.md ("Data on an object store").

Images are streamed: one image's bytes and the shard being filled are in memory at a time. The
same index and images write byte-identical files (no time stamp anywhere: litdata's
``updated_at`` is a digest of the shards, the packed index records no machine path as its root).
An image that cannot be read stops the pack with a :class:`~detloader.errors.PackError` naming
it (the pack keeps every row of the index: leave such images out of the index first,
``index.subset``).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

from detloader._system import VERSION
from detloader._system.files import open_regular, write_file
from detloader.annotations.cache import save_index
from detloader.annotations.index import AnnotationIndex
from detloader.annotations.pack import (
    INDEX_KEY,
    INDEX_NAME,
    MANIFEST_NAME,
    PackManifest,
    ShardInfo,
    _require_litdata,
    file_sha256,
)
from detloader.annotations.writers.common import prepare_out
from detloader.errors import DetloaderValueError, EmptyIndexError, NotRegularFileError, PackError

#: meta fields of the source index not packed: where its cache was, what a pack read added
_LOCAL_META = ("cache_key", "pack")
_LITDATA_INDEX = "index.json"


def write_pack(
    index: AnnotationIndex,
    out: str | os.PathLike[str],
    shard_size: int = 64 << 20,
    *,
    overwrite: bool = False,
    progress: Callable[[int, int], None] | None = None,
) -> Path:
    """Write ``index`` and its images as a pack in the folder ``out`` and return ``out``.

    ``shard_size``: the bytes a shard holds at most (litdata's ``chunk_bytes``; one image
    larger than it gets a shard of its own). Rows keep the index's order: shard ``k`` holds rows
    ``first_row..first_row + items - 1``. ``progress(done_images, total_images)`` after each
    image. The files appear in ``out`` once all are written, the manifest last; a failed pack
    leaves nothing.

    Raises:
        PackError: an image cannot be read (names the row, the file and why).
        EmptyIndexError: the index holds no image.
        DetloaderValueError: ``shard_size`` not a positive integer; ``out`` a file, or not empty
            without ``overwrite``.
    """
    if not len(index):
        raise EmptyIndexError(f"{index.root}: the index holds no image: nothing to pack")
    if isinstance(shard_size, bool) or not isinstance(shard_size, int) or shard_size <= 0:
        raise DetloaderValueError(f"shard_size={shard_size!r} is not a positive number of bytes")
    _require_litdata()
    from litdata.streaming.writer import BinaryWriter

    folder = prepare_out(out, overwrite)
    work = Path(tempfile.mkdtemp(prefix=".packing-", dir=folder))
    try:
        writer = BinaryWriter(str(work), chunk_bytes=shard_size)
        digests: dict[str, str] = {}
        total = len(index)
        for row in range(total):
            written = writer.add_item(row, {"row": row, "bytes": _image_bytes(index, row)})
            if written:  # hashed while the shard is still in the page cache
                digests[os.path.basename(written)] = file_sha256(written)
            if progress is not None:
                progress(row + 1, total)
        for written in writer.done():
            digests[os.path.basename(written)] = file_sha256(written)
        litdata_index = _litdata_index(work, digests)
        shards, row = [], 0
        for chunk in litdata_index["chunks"]:
            name = chunk["filename"]
            shards.append(ShardInfo(name, int(chunk["chunk_bytes"]), int(chunk["chunk_size"]), row, digests[name]))
            row += int(chunk["chunk_size"])
        save_index(_portable(index), work / INDEX_NAME, INDEX_KEY, record=False)
        manifest = PackManifest(
            images=total, shards=tuple(shards), index_file=INDEX_NAME,
            index_bytes=(work / INDEX_NAME).stat().st_size, index_sha256=file_sha256(work / INDEX_NAME),
            litdata_config=litdata_index["config"], detloader_version=VERSION,
        )
        for shard in shards:
            os.replace(work / shard.filename, folder / shard.filename)
        os.replace(work / INDEX_NAME, folder / INDEX_NAME)
        write_file(folder / _LITDATA_INDEX, json.dumps(litdata_index, sort_keys=True))
        write_file(folder / MANIFEST_NAME, manifest.to_json())
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return folder


def _image_bytes(index: AnnotationIndex, row: int) -> bytes:
    """The original bytes of image ``row``; :class:`PackError` naming it when it cannot be read."""
    path = index.image_path(row)
    try:
        with open_regular(path) as fh:
            return fh.read()
    except (OSError, NotRegularFileError) as err:
        raise PackError(
            f"{path}: image of row {row} cannot be read ({getattr(err, 'strerror', None) or err}); nothing packed: "
            "restore the file, or pack an index without it (index.subset of the rows to keep)"
        ) from err


def _litdata_index(work: Path, digests: dict[str, str]) -> dict:
    """litdata's ``index.json`` of the chunks in ``work`` (from the writer's ``0.index.json``, as
    its merge makes it) with ``updated_at`` (litdata's cache key of a dataset, a time stamp in its
    own merge) a digest of the shards: the same pack, the same file."""
    (part,) = work.glob(f"*.{_LITDATA_INDEX}")  # one writer: one part
    data = json.loads(part.read_text(encoding="utf-8"))
    shards = "".join(digests[c["filename"]] for c in data["chunks"])
    data["updated_at"] = hashlib.sha256(shards.encode("ascii")).hexdigest()[:16]
    return data


def _portable(index: AnnotationIndex) -> AnnotationIndex:
    """``index`` with root ``.`` and without the meta fields of where it was read
    (:data:`_LOCAL_META`): the packed file names no path of the machine that packed it."""
    meta = {k: v for k, v in index.meta.items() if k not in _LOCAL_META}
    return AnnotationIndex(root=".", arrays=index.arrays(), vocab=index.vocab, splits=index.splits,
                           problems=index.problems, meta=meta)
