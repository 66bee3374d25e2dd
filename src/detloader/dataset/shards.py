"""The shard cache of a pack (:mod:`detloader.annotations.pack`): an image's original bytes by
index row, from a local copy of its shard that the processes of a node share, kept under a byte
limit (docs/loader.md, "Data on an object store").

Shards are litdata chunks, fetched with litdata's downloader and read with litdata's item loader;
the cache policy above them is ours, because litdata 0.2.76's own (``StreamingDataset``'s), run
against an S3 server (moto) with the cache limited to a quarter of the data, does not hold:

- its cache overshoots ``max_cache_size`` by about 24%: eviction runs in the background, after
  the download that crosses the limit;
- DataLoader workers each download a chunk another worker already holds (the cache is per
  worker, not per node);
- a chunk is never checked against a hash: a corrupted chunk is served as it is;
- a truncated chunk hangs the reader (more than 60 s, no error).

Here (:class:`ShardCache`): a shard is downloaded to a temporary name, checked against the size
and sha256 the manifest records, and only then renamed into the cache: a partial or corrupt
download is never served and never left. One process per node downloads a shard (a file lock
per shard), the others wait for it and read the same file. The shards of the cache folder stay
under the limit, counting those being downloaded: room is made first, by removing the least
recently used shards that no process reads (a reader holds a shared ``flock`` on the shard it
reads; removal takes an exclusive one without waiting). A failed download is retried, then a
named :class:`~detloader.errors.StreamError` within 60 s; a full disk is a
:class:`~detloader.errors.DiskFullError`.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import re
import struct
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from detloader._system.locks import held_elsewhere, locked, try_flock
from detloader.annotations.pack import PackManifest, fetch_verified, make_downloader
from detloader.errors import (
    DetloaderIndexError,
    DetloaderValueError,
    ImageDecodeError,
    PackError,
    StreamCacheLimitError,
)
from detloader.images import Decoded, ExifPolicy, MinSize, decode_image

_PART = re.compile(r"^\.(?P<name>.+)\.\d+\.\d+\.part")
_WANT = re.compile(r"^\.(?P<name>.+)\.want$")
#: how long a process waits for room (other processes to move off their shards) before it stops
ROOM_WAIT_S = 60.0
_POLL_S = 0.05
_U32 = struct.Struct("<I")
_PAIR = struct.Struct("<II")


def pack_rows(index: Any) -> np.ndarray | None:
    """The row in its pack of each image of ``index`` (a packed index or a subset of one:
    :meth:`~detloader.annotations.index.AnnotationIndex.subset` carries them in
    ``meta["pack"]["rows"]``); None for an index not read from a pack."""
    pack = index.meta.get("pack")
    if not isinstance(pack, Mapping):
        return None
    rows = pack.get("rows")
    return np.arange(len(index), dtype=np.int64) if rows is None else np.asarray(rows, dtype=np.int64)


class ShardCache:
    """``get(row)``: the original bytes of index row ``row`` of the pack at ``url`` (a folder or
    an object store prefix), read from its shard in ``folder/shards/`` (``folder``: the pack's
    cache folder, ``index.meta["pack"]["cache_dir"]``), which is downloaded once per node.

    ``limit``: bytes the cached shards of this pack may take, those being downloaded included
    (the manifest and index file beside them are not counted). A process reads one shard at a
    time and holds it until it reads another, so the limit must hold one shard per process of
    the node reading the pack, plus the one being fetched.

    Picklable (DataLoader workers, fork or spawn): the downloader, the item loader and the open
    shard are made per process, when first used. Thread-safe: a process reads one item at a
    time. ``downloaded`` counts the shards this process downloaded and their bytes.

    Raises (at construction):
        StreamCacheLimitError: a shard bigger than ``limit``.
    """

    def __init__(
        self,
        url: str,
        manifest: PackManifest,
        folder: str | os.PathLike[str],
        limit: int,
        storage_options: Mapping[str, Any] | None = None,
        room_wait_s: float = ROOM_WAIT_S,
    ) -> None:
        if isinstance(limit, bool) or not isinstance(limit, int) or limit <= 0:
            raise DetloaderValueError(f"limit={limit!r} is not a positive number of bytes")
        biggest = max(manifest.shards, key=lambda s: s.bytes, default=None)
        if biggest is not None and biggest.bytes > limit:
            raise StreamCacheLimitError(
                f"{url}: shard {biggest.filename} has {biggest.bytes} bytes, more than the stream cache "
                f"limit={limit}: raise the limit to at least {_fit(biggest.bytes)} bytes per process reading "
                "the pack, or pack again with a smaller --shard-size"
            )
        self.url, self.manifest, self.limit = url, manifest, limit
        self.folder = Path(folder)
        self.storage_options = dict(storage_options or {})
        self.room_wait_s = float(room_wait_s)
        self._first_rows = [s.first_row for s in manifest.shards]
        self._reset_process()

    @classmethod
    def for_index(
        cls, index: Any, limit: int | None = None, storage_options: Mapping[str, Any] | None = None
    ) -> ShardCache:
        """The cache of the pack ``index`` was read from (:func:`~detloader.annotations.pack.read_pack_index`:
        its ``meta["pack"]``); ``limit`` defaults to the ``cache_limit`` given there."""
        pack = index.meta.get("pack")
        if not isinstance(pack, Mapping):
            raise DetloaderValueError(f"{index.root}: the index was not read from a pack (no meta['pack'])")
        limit = limit if limit is not None else pack.get("cache_limit")
        if limit is None:
            raise DetloaderValueError(f"{pack['url']}: no stream cache limit given (limit=None, cache_limit=None)")
        manifest = PackManifest.from_dict(pack["manifest"], f"{pack['url']} (meta['pack'])")
        return cls(pack["url"], manifest, pack["cache_dir"], limit, storage_options)

    # -- per process ----------------------------------------------------------------------------
    def _reset_process(self) -> None:
        self._pid = os.getpid()
        self._mutex = threading.Lock()
        self._downloader: Any = None
        self._loader: Any = None
        self._held: tuple[int, int] | None = None  # (shard, fd with a shared flock)
        self.downloaded: list[tuple[str, int]] = []

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        for key in ("_mutex", "_downloader", "_loader", "_held", "_pid", "downloaded"):
            state.pop(key)
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._reset_process()

    def _own(self) -> None:
        """After a fork: the parent's downloader, loader and open shard are not this process's
        (the inherited descriptor shares the parent's lock: closed here, the parent keeps its own)."""
        if self._pid != os.getpid():
            held = self._held
            self._reset_process()
            if held is not None:
                with contextlib.suppress(OSError):
                    os.close(held[1])

    def close(self) -> None:
        """Let go of the shard this process reads (other processes may then remove it)."""
        self._own()
        with self._mutex:
            self._release()

    def __del__(self) -> None:
        with contextlib.suppress(Exception):
            if self._pid == os.getpid():
                self._release()

    # -- reading ---------------------------------------------------------------------------------
    @property
    def shards_dir(self) -> Path:
        return self.folder / "shards"

    def shard_of(self, row: int) -> int:
        """The shard (position in the manifest) holding index row ``row``."""
        import bisect

        return bisect.bisect_right(self._first_rows, row) - 1

    def shards_of(self, rows: np.ndarray) -> np.ndarray:
        """:meth:`shard_of` of many rows at once."""
        return np.searchsorted(self._first_rows, np.asarray(rows), side="right") - 1

    def get(self, row: int) -> bytes:
        """The original file bytes of the image of index row ``row``.

        Raises:
            DetloaderIndexError: ``row`` out of range.
            StreamError: its shard cannot be fetched whole (named URL, shard, what to try).
            StreamCacheLimitError: no room for its shard within ``room_wait_s``.
            DiskFullError: no room on the disk for its shard.
            PackError: the shard does not hold the row the manifest says (a damaged pack).
        """
        n = self.manifest.images
        if isinstance(row, bool) or not 0 <= int(row) < n:
            raise DetloaderIndexError(f"row={row!r} out of range for the {n} images of {self.url}")
        row = int(row)
        self._own()
        shard = self.shard_of(row)
        with self._mutex:
            fd = self._open(shard)
            raw = self._item(fd, shard, row - self.manifest.shards[shard].first_row)
        item = self._item_loader().load_item_from_bytes(raw, shard)
        if item.get("row") != row:
            raise PackError(
                f"{self.url}/{self.manifest.shards[shard].filename}: item for row {row} holds row "
                f"{item.get('row')!r}: a damaged pack, pack the dataset again"
            )
        return bytes(item["bytes"])

    def read(
        self, row: int, *, expected_size: tuple[int, int] | None = None, exif: ExifPolicy = "auto",
        min_size: MinSize = None, source: str | None = None,
    ) -> Decoded:
        """:func:`~detloader.images.decode_image` of :meth:`get` ``(row)``, as
        :func:`~detloader.images.read_image` reads a file: ``source`` (default: the pack's URL and
        the row) names it in errors; running out of memory on it is its ImageDecodeError."""
        source = source or f"{self.url} row {row}"
        try:
            return decode_image(self.get(row), expected_size=expected_size, exif=exif, min_size=min_size,
                                source=source)
        except MemoryError as err:
            raise ImageDecodeError(f"{source}: out of memory reading or decoding the image") from err

    def _item(self, fd: int, shard: int, local: int) -> bytes:
        """Item ``local``'s raw bytes in the chunk open at ``fd`` (litdata's layout: uint32 count,
        uint32 offsets[count + 1], the items)."""
        info = self.manifest.shards[shard]
        count = _U32.unpack(os.pread(fd, 4, 0))[0]
        begin, end = _PAIR.unpack(os.pread(fd, 8, 4 + 4 * local))
        if count != info.items or not 0 <= begin <= end <= info.bytes:
            raise PackError(f"{self.url}/{info.filename}: damaged chunk header (items={count}, item {local} "
                            f"at {begin}..{end} of {info.bytes} bytes)")
        return os.pread(fd, end - begin, begin)

    def _item_loader(self) -> Any:
        """litdata's item loader set up for the pack's items (made once per process)."""
        if self._loader is None:
            from litdata.streaming.item_loader import PyTreeLoader
            from litdata.streaming.serializers import _get_serializers
            from litdata.utilities._pytree import treespec_loads

            config = dict(self.manifest.litdata_config)
            config["data_spec"] = treespec_loads(config["data_spec"])
            chunks = [{"filename": s.filename, "chunk_size": s.items, "chunk_bytes": s.bytes}
                      for s in self.manifest.shards]
            loader = PyTreeLoader()
            loader.setup(config, chunks, _get_serializers(None))
            self._loader = loader
        return self._loader

    # -- the shard on disk -------------------------------------------------------------------------
    def _release(self) -> None:
        if self._held is not None:
            fd, self._held = self._held[1], None
            os.close(fd)  # drops the shared lock: the shard may be removed now

    def _open(self, shard: int) -> int:
        """A descriptor of ``shard``'s cached file with a shared lock held, fetching it if needed;
        the shard read before is let go."""
        if self._held is not None and self._held[0] == shard:
            return self._held[1]
        self._release()
        path = self.shards_dir / self.manifest.shards[shard].filename
        fd = _open_shared(path)
        if fd is None:
            fd = self._fetch(shard, path)
        with contextlib.suppress(OSError):
            os.utime(path)  # its last use: the least recently used shards go first
        self._held = (shard, fd)
        return fd

    def _fetch(self, shard: int, path: Path) -> int:
        """Download ``shard`` into the cache (one process of the node does; the others wait for
        it here) and return its descriptor, shared-locked from before it gets its name."""
        info = self.manifest.shards[shard]
        self.shards_dir.mkdir(parents=True, exist_ok=True)
        with locked(self.shards_dir / f".{info.filename}.lock", remove=True):
            fd = _open_shared(path)
            if fd is not None:
                return fd  # another process fetched it while this one waited
            want = self._make_room(shard)
            try:
                if self._downloader is None:
                    self._downloader = make_downloader(self.url, self.shards_dir, self.manifest, self.storage_options)
                part = fetch_verified(self._downloader, self.url, info.filename, self.shards_dir, info.bytes,
                                      info.sha256)
                try:
                    fd = _open_shared(part)
                    if fd is None:
                        raise PackError(f"{part}: a verified download vanished before it was published")
                    os.replace(part, path)
                except BaseException:
                    with contextlib.suppress(OSError):
                        os.unlink(part)
                    raise
            finally:
                with contextlib.suppress(OSError):
                    os.unlink(want)
            self.downloaded.append((info.filename, info.bytes))
            return fd

    def _make_room(self, shard: int) -> Path:
        """Remove least recently used shards that no process reads until ``shard`` fits under the
        limit beside the cached shards and those being downloaded, and reserve its room (the
        file ``.NAME.want``, returned: the caller removes it once the shard is in place); wait
        up to ``room_wait_s`` for other processes to move off theirs, then
        :class:`StreamCacheLimitError`."""
        need = self.manifest.shards[shard].bytes
        deadline = time.monotonic() + self.room_wait_s
        while True:
            with locked(self.shards_dir / ".room.lock", remove=True):
                cached, in_flight = self._survey(shard)
                total = sum(size for _, size, _ in cached) + in_flight
                for _, size, victim in sorted(cached):  # least recently used first
                    if total + need <= self.limit:
                        break
                    if _remove_unread(victim):
                        total -= size
                if total + need <= self.limit:
                    want = self.shards_dir / f".{self.manifest.shards[shard].filename}.want"
                    want.touch()
                    return want
            if time.monotonic() >= deadline:
                raise StreamCacheLimitError(
                    f"{self.url}: no room for shard {self.manifest.shards[shard].filename} ({need} bytes) in "
                    f"{self.shards_dir} within {self.room_wait_s:.0f} s: the shards other processes read or fetch "
                    f"take {total} bytes of the limit={self.limit}: raise the stream cache limit (one shard per "
                    "process reading the pack, plus one) or read with fewer workers"
                )
            time.sleep(_POLL_S)

    def _survey(self, shard: int) -> tuple[list[tuple[float, int, Path]], int]:
        """The shards in the cache folder (``(last use, bytes, path)``) and the bytes of those
        other processes have room reserved for (a ``.NAME.want`` file, its shard's lock held, the
        shard not there yet); leftovers of downloads that died (their shard's lock free) are
        removed."""
        sizes = {s.filename: s.bytes for s in self.manifest.shards}
        mine = self.manifest.shards[shard].filename
        cached, fetching = [], set()
        try:
            entries = list(os.scandir(self.shards_dir))
        except FileNotFoundError:
            return [], 0
        names = {e.name for e in entries}
        for entry in entries:
            if entry.name in sizes:
                with contextlib.suppress(OSError):
                    st = entry.stat()
                    cached.append((st.st_mtime, st.st_size, Path(entry.path)))
                continue
            m = _WANT.match(entry.name) or _PART.match(entry.name)
            if m is None or m["name"] == mine or m["name"] not in sizes:
                continue
            if not held_elsewhere(self.shards_dir / f".{m['name']}.lock"):
                with contextlib.suppress(OSError):
                    os.unlink(entry.path)  # its process died
            elif entry.name.endswith(".want") and m["name"] not in names:
                fetching.add(m["name"])
        return cached, sum(sizes[name] for name in fetching)


def _open_shared(path: Path) -> int | None:
    """A descriptor of the file at ``path`` holding a shared ``flock`` (its readers' mark), or
    None when no file is there (or it was removed while this process waited for the lock)."""
    while True:
        try:
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        except FileNotFoundError:
            return None
        try:
            fcntl.flock(fd, fcntl.LOCK_SH)
            a, b = os.stat(path), os.fstat(fd)
            if (a.st_dev, a.st_ino) == (b.st_dev, b.st_ino):
                return fd
        except FileNotFoundError:
            pass
        except BaseException:
            os.close(fd)
            raise
        os.close(fd)  # removed or replaced meanwhile: open what the name names now
        if not path.exists():
            return None


def _remove_unread(path: Path) -> bool:
    """Remove the shard at ``path`` when no process holds it (an exclusive ``flock`` taken
    without waiting); whether it was removed."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        return False
    if not try_flock(fd, fcntl.LOCK_EX):
        return False
    try:
        st, now = os.fstat(fd), os.stat(path)
        if (st.st_dev, st.st_ino) != (now.st_dev, now.st_ino):
            return False
        os.unlink(path)  # still locked: a reader that waited sees the name gone and fetches again
        return True
    except FileNotFoundError:
        return False
    finally:
        os.close(fd)


def _fit(nbytes: int) -> int:
    """``nbytes`` rounded up to a whole MiB (what an error suggests as a limit)."""
    return -(-nbytes // (1 << 20)) * (1 << 20)
