"""The store of decoded images: each image decoded once, at its stored size, into one
memory-mapped file that later epochs (every worker and rank of the node) read instead of
decoding. See docs/loader.md, "A store of decoded images" (where it lives, locking, staleness).

Layout of a ``.dlstore`` file (little-endian)::

    8 bytes   magic b"DLSTORE\\n"
    4 bytes   uint32 format version (STORE_VERSION)
    4 bytes   uint32 CRC-32 of the table
    8 bytes   uint64 number of images n
    8 bytes   uint64 byte offset of the pixels
    16 bytes  the key (blake2b of the image paths, annotated and stored sizes, EXIF policy;
              for "ram" also the dataset's absolute root and each image file's device and inode)
    table     n rows of TABLE_DTYPE: pixel offset, stored width and height, whether the image
              decoded, the source file's identity (size, mtime_ns, ctime_ns, inode) and the
              CRC-32 of the image's stored bytes
    pixels    each image uint8 [3, h, w] (channel planes, the layout of a batch), at its offset

Slots are sized from the annotated sizes, so the file's size is known before decoding: it is
checked against the free space and reserved (``posix_fallocate``) before a pixel is written
(written with ``pwrite``, never through a writable map: a full disk is an error, not SIGBUS),
and a file of another size is damaged (rebuilt). :meth:`ImageStore.verify` checks the pixels
against their CRC-32s; a read does not (docs/loader.md, "Damage").
"""

from __future__ import annotations

import errno
import hashlib
import os
import struct
import warnings
import weakref
import zlib
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Literal

import numpy as np

from detloader._system.cache_dir import remember
from detloader._system.locks import locked, open_store
from detloader.annotations.index import AnnotationIndex
from detloader.dataset import store_files as files
from detloader.errors import (
    DetloaderRuntimeWarning,
    DetloaderValueError,
    DiskFullError,
    ImageDecodeError,
    NotRegularFileError,
    StoreTooLargeError,
)
from detloader.images import ExifPolicy, read_image

CacheKind = Literal["disk", "ram"]
CACHE_CHOICES: tuple[str, ...] = ("disk", "ram")
MAGIC = b"DLSTORE\n"
STORE_VERSION = 3
_PREFIX = struct.Struct("<8sIIQQ16s")
_ALIGN = 64
TABLE_DTYPE = np.dtype([
    ("offset", "<i8"), ("width", "<i4"), ("height", "<i4"), ("ok", "<i8"),
    ("size", "<i8"), ("mtime_ns", "<i8"), ("ctime_ns", "<i8"), ("inode", "<i8"), ("crc", "<i8"),
])
_IDENTITY = ("size", "mtime_ns", "ctime_ns", "inode")


def cache_size_from(transform: Any) -> Any:
    """The first size-changing transform of ``transform`` (past flips and colour) when it is a
    :class:`~detloader.transforms.Resize`, else None."""
    from detloader.transforms import Resize

    for t in getattr(transform, "transforms", [transform]):
        if not getattr(t, "preserves_size", False):
            return t if isinstance(t, Resize) else None
    return None


def store_sizes(index: AnnotationIndex, cache_size: Any) -> tuple[np.ndarray, np.ndarray]:
    """Stored (width, height) per image. An int: the annotated size shrunk (never enlarged)
    so that the longer side is at most ``cache_size``. A :class:`~detloader.transforms.Resize`:
    its content size for the annotated size, where that has no more pixels (else the
    annotated size)."""
    w = np.asarray(index.width, dtype=np.int64)
    h = np.asarray(index.height, dtype=np.int64)
    if hasattr(cache_size, "content_size"):
        sizes = [cache_size.content_size(a, b) for a, b in zip(w.tolist(), h.tolist())]
        cw, ch = np.array(sizes, np.int64).reshape(-1, 2).T
        fits = cw * ch <= w * h
        return np.where(fits, cw, w), np.where(fits, ch, h)
    s = np.minimum(1.0, cache_size / np.maximum(np.maximum(w, h), 1))
    return np.maximum(1, np.round(w * s)).astype(np.int64), np.maximum(1, np.round(h * s)).astype(np.int64)


def _identity(path: str | os.PathLike[str]) -> tuple[int, int, int, int]:
    return _stat(path)[:4]  # type: ignore[return-value]


def _stat(path: str | os.PathLike[str]) -> tuple[int, ...]:
    """(size, mtime_ns, ctime_ns, inode, device) of ``path``; -1s when it cannot be read."""
    try:
        st = os.stat(path)
    except OSError:
        return (-1, -1, -1, -1, -1)
    return (st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino, st.st_dev)


class ImageStore:
    """The decoded images of ``index`` at their stored sizes (:func:`store_sizes`), memory-mapped;
    :meth:`open` builds or maps it, :meth:`at` maps a store file as it is (to :meth:`verify` it).
    Pickles as its path (each process maps the file itself; a ``"ram"`` store's user, see
    :mod:`detloader.dataset.store_files`)."""

    def __init__(self, path: Path, n: int, kind: str = "disk") -> None:
        self.path, self.n, self.kind = path, n, kind
        self._table: np.ndarray | None = None
        self._pixels: np.ndarray | None = None
        self._key, self._data_offset = b"", 0
        self._user: weakref.finalize | None = None  # a "ram" store's hold, released with the store

    # -- opening ----------------------------------------------------------------------------
    @classmethod
    def open(
        cls,
        index: AnnotationIndex,
        kind: CacheKind,
        cache_size: Any,
        *,
        exif: ExifPolicy = "auto",
        on_decode_error: str = "raise",
        threads: int | None = None,
    ) -> ImageStore:
        """Map the store of ``index`` (``kind`` ``"disk"`` or ``"ram"``), building it first
        when absent or damaged, and refreshing images whose file changed, under a file lock.

        Raises:
            StoreTooLargeError: the store does not fit in the free space (both named).
            DiskFullError: the disk or memory filled up while it was written (nothing left behind).
            NotRegularFileError: a FIFO, socket, device or folder where the store or its lock is.
            ImageDecodeError: an image does not decode and ``on_decode_error="raise"``.
        """
        if kind not in CACHE_CHOICES:
            raise DetloaderValueError(f"cache={kind!r} is not one of {', '.join(CACHE_CHOICES)} or None")
        if not hasattr(cache_size, "content_size") and (
            isinstance(cache_size, bool) or not isinstance(cache_size, (int, np.integer)) or cache_size < 1
        ):
            raise DetloaderValueError(f"cache_size={cache_size!r} must be an int >= 1 or a Resize")
        widths, heights = store_sizes(index, cache_size)
        stats = np.array([_stat(index.image_path(i)) for i in range(len(index))], np.int64).reshape(-1, 5)
        digest = hashlib.blake2b(digest_size=16)
        for part in (index.paths_digest(), exif, str(STORE_VERSION)):
            digest.update(part.encode() + b"\0")
        for sizes in (index.width, index.height, widths, heights):
            digest.update(np.ascontiguousarray(sizes, "<i8").tobytes())
        folder, name = files.store_dir(kind, index.root), index.root.resolve().name
        if kind == "ram":  # shared by the whole machine: two copies of a dataset must never meet
            digest.update(str(index.root.resolve()).encode("utf-8") + b"\0")
            digest.update(np.ascontiguousarray(stats[:, 3:], "<i8").tobytes())  # inode, device
            name = f"{name}-{files.root_tag(index.root)}"
            files.sweep(folder)
        else:  # a disk store lives until removed: only the temporary files of dead builds go
            files.sweep_temporaries(folder)
        key = digest.digest()
        path = folder / f"{name}-{key.hex()[:20]}{files.SUFFIX}"
        store = cls(path, len(index), kind)
        with locked(Path(f"{path}.lock"), remove=True):  # no lock file stays behind
            try:
                store._map(key)
            except NotRegularFileError:
                raise
            except (OSError, ValueError) as err:
                if path.exists():
                    warnings.warn(
                        f"{path}: image store unusable ({err}); rebuilding it", DetloaderRuntimeWarning, stacklevel=2
                    )
                store._build(index, kind, key, widths, heights, exif, on_decode_error, threads)
                remember(path, f"store {kind}", index.root)  # for `detloader cache list|clear`
                store._map(key)
            store._refresh(index, stats[:, :4], exif, on_decode_error)
        return store

    @classmethod
    def at(cls, path: str | os.PathLike[str]) -> ImageStore:
        """The store file ``path`` mapped as it is (any key), e.g. to :meth:`verify` it.

        Raises:
            DetloaderValueError: not a store of this version, or truncated (named).
            NotRegularFileError: ``path`` is a FIFO, socket, device or folder.
        """
        store = cls(Path(path), -1)
        store._map(None)
        return store

    def _map(self, key: bytes | None) -> None:
        """Check the header, key (None: any), size and table CRC of the file, then map it
        read-only; a ``"ram"`` store's process becomes one of its users."""
        fd = open_store(self.path)
        with os.fdopen(fd, "rb") as fh:
            size = os.fstat(fd).st_size
            head = fh.read(_PREFIX.size)
            if len(head) < _PREFIX.size:
                raise DetloaderValueError(f"{self.path}: truncated header")
            magic, version, crc, n, data_offset, got_key = _PREFIX.unpack(head)
            if magic != MAGIC or version != STORE_VERSION:
                raise DetloaderValueError(f"{self.path}: not an image store of version {STORE_VERSION}")
            if key is not None and (got_key != key or n != self.n):
                raise DetloaderValueError("made for other images or another cache size")
            table = np.frombuffer(fh.read(n * TABLE_DTYPE.itemsize), dtype=TABLE_DTYPE)
            if len(table) != n or zlib.crc32(table.tobytes()) != crc:
                raise DetloaderValueError(f"{self.path}: offset table checksum mismatch")
            last = table[-1] if n else None
            end = int(data_offset + (last["offset"] + 3 * int(last["width"]) * int(last["height"]) if n else 0))
            if size != end:
                raise DetloaderValueError(f"{self.path}: {size} bytes, expected {end} (truncated?)")
            # copy-on-write: the pages are the page cache's, shared by every process, and a write
            # into a sample's image (which wraps them without a copy) never reaches the file
            self._pixels = np.memmap(fh, dtype=np.uint8, mode="c", offset=data_offset, shape=(size - data_offset,)) \
                if size > data_offset else np.zeros(0, np.uint8)
            if self._user is None:  # a user: `cache clear` leaves the store while it is mapped
                user = os.dup(fd)
                files.hold(user)
                self._user = weakref.finalize(self, files.release, self.path, user, os.getpid(), self.kind == "ram")
        self.n, self._table, self._data_offset, self._key = int(n), table.copy(), int(data_offset), got_key

    def _build(
        self, index: AnnotationIndex, kind: str, key: bytes, widths: np.ndarray, heights: np.ndarray,
        exif: ExifPolicy, on_decode_error: str, threads: int | None,
    ) -> None:
        """Write the store: its size checked and reserved first, then each image decoded into
        its slot, then the header; in a temporary file renamed over :attr:`path` at the end."""
        from detloader._system.files import atomic_write

        n = len(index)
        table = np.zeros(n, dtype=TABLE_DTYPE)
        nbytes = 3 * widths * heights
        table["offset"] = np.concatenate([[0], np.cumsum(nbytes)[:-1]]) if n else []
        table["width"], table["height"] = widths, heights
        data_offset = -(-(_PREFIX.size + n * TABLE_DTYPE.itemsize) // _ALIGN) * _ALIGN
        total = data_offset + int(nbytes.sum())
        need = f"image store for {n} images at longer side <= {int(max(widths.max(initial=0), heights.max(initial=0)))}"
        where = f"{'of memory' if kind == 'ram' else 'of disk'} is free at {self.path.parent}"
        todo = "use a smaller cache_size, the other cache kind, or none (cache=None)"
        free = files.free_bytes(kind, self.path.parent)
        old = self.path.stat().st_size if self.path.is_file() else 0
        if total > free + old:
            raise StoreTooLargeError(
                f"{need} needs {total / 2**20:.1f} MiB (estimated from the annotated sizes) but only "
                f"{(free + old) / 2**20:.1f} MiB {where}; {todo}"
            )
        if total > free:  # the damaged store and its rebuild do not fit side by side: it goes first
            self.path.unlink()
        limit = files.file_size_limit()
        if total > limit:
            raise StoreTooLargeError(
                f"{need} needs {total / 2**20:.1f} MiB but this process may write files of at most "
                f"{limit / 2**20:.1f} MiB (RLIMIT_FSIZE, `ulimit -f`); raise the limit or {todo}"
            )
        try:
            with atomic_write(self.path) as fh:
                files.reserve(fh.fileno(), total)
                with ThreadPoolExecutor(threads or min(8, os.cpu_count() or 1)) as pool:
                    fill = lambda i: self._fill(index, i, table, fh.fileno(), data_offset, exif)  # noqa: E731
                    for i, err in enumerate(pool.map(fill, range(n))):
                        _check(err, i, on_decode_error)
                _write_head(fh, key, table, data_offset)
        except DiskFullError as err:
            if err.errno == errno.EFBIG:  # the writer names a file size limit as a full disk
                raise self._too_large(need, total, todo) from err
            what = "disk quota exceeded" if err.errno == getattr(errno, "EDQUOT", None) else "no space left"
            full = DiskFullError(
                f"{self.path}: {need} not built, {what} while writing it ({total / 2**20:.1f} MiB needed, "
                f"{files.free_bytes(kind, self.path.parent) / 2**20:.1f} MiB {where}); free some space or {todo}; "
                "its temporary file was removed"
            )
            full.errno = err.errno
            raise full from err
        except OSError as err:
            if err.errno != errno.EFBIG:
                raise
            raise self._too_large(need, total, todo) from err

    def _too_large(self, need: str, total: int, todo: str) -> StoreTooLargeError:
        return StoreTooLargeError(
            f"{self.path}: {need} not built, the file grew past this process's file size limit "
            f"(RLIMIT_FSIZE, `ulimit -f`) at {total / 2**20:.1f} MiB; raise the limit or {todo}; "
            "its temporary file was removed"
        )

    def _fill(
        self, index: AnnotationIndex, i: int, table: np.ndarray, fd: int, data_offset: int, exif: ExifPolicy
    ) -> ImageDecodeError | None:
        """Decode image ``i`` into its slot of the file ``fd`` and record its CRC-32; record its
        identity (taken before reading, so a file changed meanwhile shows as changed) and
        whether it decoded (else answer its error)."""
        row = table[i]
        for name, value in zip(_IDENTITY, _identity(index.image_path(i))):
            table[name][i] = value
        try:
            image = decode_to_size(index, i, int(row["width"]), int(row["height"]), exif)
        except ImageDecodeError as err:
            table["ok"][i], table["crc"][i] = False, 0
            return err
        planes = memoryview(np.ascontiguousarray(image.transpose(2, 0, 1))).cast("B")  # resize_image's: no copy
        table["ok"][i], table["crc"][i] = True, zlib.crc32(planes)
        at, done = data_offset + int(row["offset"]), 0
        while done < len(planes):
            done += os.pwrite(fd, planes[done:], at + done)
        return None

    def _refresh(self, index: AnnotationIndex, idents: np.ndarray, exif: ExifPolicy, on_decode_error: str) -> None:
        """Re-decode into their slots the images whose file changed since they were stored
        (``idents``: each file's size, mtime_ns, ctime_ns, inode now)."""
        assert self._table is not None
        stored = np.stack([self._table[k] for k in _IDENTITY], axis=1) if self.n else idents
        changed = np.flatnonzero((idents != stored).any(axis=1))
        if not len(changed):
            return
        table = self._table.copy()
        with os.fdopen(open_store(self.path, write=True), "r+b") as fh:
            for i in changed:
                _check(self._fill(index, int(i), table, fh.fileno(), self._data_offset, exif), int(i), on_decode_error)
            _write_head(fh, self._key, table, self._data_offset)
        self._map(self._key)

    # -- checking ---------------------------------------------------------------------------
    def verify(self) -> list[int]:
        """The indices of the images whose stored bytes, read from the file (not this process's
        copy-on-write map), no longer match the CRC-32 written when they were stored; images
        that did not decode have no pixels and are not checked."""
        table, bad = self._rows(), []
        fd = open_store(self.path)
        try:
            for i in np.flatnonzero(table["ok"]).tolist():
                row = table[i]
                size = 3 * int(row["width"]) * int(row["height"])
                data = os.pread(fd, size, self._data_offset + int(row["offset"]))
                if len(data) != size or zlib.crc32(data) != int(row["crc"]):
                    bad.append(i)
        finally:
            os.close(fd)
        return bad

    # -- reading ----------------------------------------------------------------------------
    def get(self, i: int, path: str | os.PathLike[str]) -> np.ndarray | None:
        """Image ``i`` as stored (uint8 ``[h, w, 3]``, a read-only view of the map's channel
        planes), or None when ``path`` changed since it was stored (decode it from the file).

        Raises:
            ImageDecodeError: the image did not decode when the store was built.
        """
        row = self._rows()[i]
        if _identity(path) != tuple(int(row[k]) for k in _IDENTITY):
            return None
        if not row["ok"]:
            raise ImageDecodeError(f"{os.fspath(path)}: cannot decode image (found when the image store was built)")
        w, h, start = int(row["width"]), int(row["height"]), int(row["offset"])
        view = self._pixels[start : start + 3 * w * h].reshape(3, h, w).transpose(1, 2, 0)  # type: ignore[index]
        view.flags.writeable = False  # the transform makes new arrays (load_sample wraps it as is)
        return view

    def size(self, i: int) -> tuple[int, int]:
        """(width, height) image ``i`` is stored at."""
        row = self._rows()[i]
        return int(row["width"]), int(row["height"])

    def _rows(self) -> np.ndarray:
        """The offset table, mapping the file first in a new process (a store pickles as its path)."""
        if self._table is None:
            self._map(self._key)
        assert self._table is not None
        return self._table

    def __getstate__(self) -> dict[str, Any]:
        return {"path": self.path, "n": self.n, "kind": self.kind, "_key": self._key,
                "_data_offset": self._data_offset, "_table": None, "_pixels": None, "_user": None}

    def __repr__(self) -> str:
        return f"ImageStore(path={str(self.path)!r}, images={self.n})"


def _write_head(fh: Any, key: bytes, table: np.ndarray, data_offset: int) -> None:
    fh.seek(0)
    fh.write(_PREFIX.pack(MAGIC, STORE_VERSION, zlib.crc32(table.tobytes()), len(table), data_offset, key))
    fh.write(table.tobytes())
    fh.flush()


def _check(err: ImageDecodeError | None, i: int, on_decode_error: str) -> None:
    """Raise image ``i``'s decode error (naming the file, the reason and the dataset index)
    under ``on_decode_error="raise"``."""
    if err is not None and on_decode_error == "raise":
        raise ImageDecodeError(f"{err} (dataset index {i}, building the image store)") from err


def decode_to_size(index: AnnotationIndex, i: int, width: int, height: int, exif: ExifPolicy) -> np.ndarray:
    """Image ``i`` decoded (DCT-reduced when it shrinks 2x) and resized to ``width x height``."""
    from detloader.transforms.functional import resize_image

    ann = (int(index.width[i]), int(index.height[i]))
    decoded = read_image(index.image_path(i), expected_size=ann, exif=exif, min_size=(width, height))
    return resize_image(decoded.image, width, height)
