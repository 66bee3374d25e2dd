"""The on-disk index cache: one file, memory-mapped on load, no pickle.

Layout of a ``.dlindex`` file (little-endian)::

    8 bytes   magic b"DLINDEX\n"
    4 bytes   uint32 format version (CACHE_VERSION)
    4 bytes   uint32 CRC-32 of the JSON header
    8 bytes   uint64 length of the JSON header
    header    UTF-8 JSON: key, vocabularies, splits, problems, meta, for every array its
              dtype, shape and byte offset, and ``data_crc32``: the CRC-32 of the array area
    arrays    raw C-order data, each starting on a 64-byte boundary

A file that fails any check raises :class:`CacheError` (never ``MemoryError`` or
``OverflowError``) and is rebuilt. Where the file lives, what its key holds and the lock:
docs/index.md ("The cache"); the checks and their cost: docs/reliability.md ("Cache integrity").
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
import mmap
import os
import struct
import warnings
import weakref
import zlib
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from detloader._system.cache_dir import CACHE_DIR_ENV, remember, user_cache_dir
from detloader._system.files import atomic_write, open_regular, refuse_special, special_kind
from detloader._system.locks import hold_shared, locked
from detloader.annotations.fields import Vocabulary, array_names
from detloader.annotations.index import AnnotationIndex
from detloader.annotations.problems import ProblemReport
from detloader.annotations.readers.common import dir_identity
from detloader.errors import CacheError, DetloaderRuntimeWarning, DetloaderValueError

if TYPE_CHECKING:
    from detloader.annotations.readers.common import Source, StampTable

MAGIC = b"DLINDEX\n"
#: The file layout's version (3: the per-image class lists' arrays; 4: the objects' area).
CACHE_VERSION = 4
_ALIGN = 64
_PREFIX = struct.Struct("<8sIIQ")
CACHE_SUBDIR = ".detloader-cache"


def _align(n: int) -> int:
    return (n + _ALIGN - 1) // _ALIGN * _ALIGN


def _tagged(root: Path) -> str:
    """``NAME-TAG``: the folder of the dataset at the resolved ``root`` in a cache folder (TAG:
    16 hex digits of its path, so that two datasets of one name stay apart)."""
    return f"{root.name}-{hashlib.blake2b(str(root).encode('utf-8', 'surrogateescape'), digest_size=8).hexdigest()}"


def cache_dir_for(root: str | os.PathLike[str], create: bool = True) -> Path:
    """Where the cache of the dataset at ``root`` lives (created if needed): ``$DETLOADER_CACHE_DIR/
    NAME-TAG``, else ``.detloader-cache`` in its folder when that is writable, else the user cache
    folder's ``NAME-TAG``. ``create=False``: where it is now, none made (a cache being looked up:
    the user cache folder's when none is beside the dataset)."""
    root = Path(root).resolve()
    override = os.environ.get(CACHE_DIR_ENV)
    if override:
        target = Path(override) / _tagged(root)
        if create:
            target.mkdir(parents=True, exist_ok=True)
        return target
    folder = root if root.is_dir() else root.parent
    beside = folder / CACHE_SUBDIR
    if _writable(folder):
        try:
            if create:
                beside.mkdir(exist_ok=True)
            if os.access(beside, os.W_OK):
                return beside
        except OSError:
            pass
    target = user_cache_dir() / _tagged(root)
    if create:
        target.mkdir(parents=True, exist_ok=True)
    return target


def cache_dirs_of(root: str | os.PathLike[str]) -> list[Path]:
    """Every folder :func:`cache_dir_for` may have chosen for the dataset at ``root``, whatever
    ``$DETLOADER_CACHE_DIR`` was then: beside it, in the user cache folder, in
    ``$DETLOADER_CACHE_DIR`` now (none created; some may not exist)."""
    root = Path(root).resolve()
    places = [(root if root.is_dir() else root.parent) / CACHE_SUBDIR, user_cache_dir() / _tagged(root)]
    override = os.environ.get(CACHE_DIR_ENV)
    return [*places, Path(override) / _tagged(root)] if override else places


@contextlib.contextmanager
def build_lock(cache_file: Path) -> Iterator[None]:
    """Hold the lock beside ``cache_file`` (``NAME.lock``) while its index is built, so that one
    process per node builds it and the others wait, then map the file. The lock file is removed
    when the block ends, by an error too (:func:`detloader._system.locks.locked`: a waiter then
    locks a new one). Where no lock file can be made (a read-only folder) nothing is locked; a
    FIFO, socket, device or folder there is :class:`NotRegularFileError`
    (:func:`cache_file_refused` says so before)."""
    lock = Path(f"{cache_file}.lock")
    refuse_special(lock, "not used as the lock")
    with contextlib.ExitStack() as held:
        try:
            held.enter_context(locked(lock, remove=True))
        except OSError:
            pass  # no lock file can be made here: each process builds its own
        yield


def cache_file_refused(cache_file: Path) -> str | None:
    """Why ``cache_file`` cannot be used, when a FIFO, socket, device or folder is at its path or
    at its lock's (``<path>: a FIFO, not a regular file``), else None. Opening a FIFO would
    block; such a file is never opened, locked or replaced."""
    for path in (cache_file, Path(f"{cache_file}.lock")):
        kind = special_kind(path)
        if kind is not None:
            return f"{path}: {kind}, not a regular file"
    return None


def file_stamp(path: Path) -> tuple[int, int] | None:
    """``(inode, mtime_ns)`` of ``path`` (a save replaces the file: a new inode), None when absent."""
    try:
        st = path.stat()
    except OSError:
        return None
    return st.st_ino, st.st_mtime_ns


def _writable(folder: Path) -> bool:
    """Writable for us, and not marked read-only by its mode bits (which root would ignore)."""
    try:
        mode = folder.stat().st_mode
    except OSError:
        return False
    return bool(mode & 0o222) and os.access(folder, os.W_OK)


def save_index(index: AnnotationIndex, path: str | os.PathLike[str], key: str, record: bool = True) -> Path:
    """Write ``index`` to ``path`` atomically (temporary file + rename). ``record``: note it as
    the dataset's index cache (``detloader cache list|clear`` find and remove it); False for a
    file that is no cache (the index of a pack)."""
    path = Path(path)
    arrays = dict(index.arrays())  # FIELDS order
    for name, members in index.splits.items():
        arrays[f"split/{name}"] = np.asarray(members, dtype=np.int64)
    header = {
        "key": key,
        "root": str(index.root),
        "vocab": index.vocab.to_dict(),
        "splits": list(index.splits),
        "problems": index.problems.to_list(),
        "meta": index.meta,
    }
    write_arrays(path, header, arrays)
    if record:
        remember(path, "index", index.root)  # for `detloader cache list|clear`
    return path


def write_arrays(
    path: str | os.PathLike[str], header: dict[str, Any], arrays: dict[str, np.ndarray], magic: bytes = MAGIC
) -> None:
    """``header`` (JSON) and ``arrays`` in the layout above, atomically: the header gets the
    array table (``arrays``) and ``data_crc32``. The index cache, and the refresh's stamps
    (another ``magic``), are written so."""
    arrays = {name: np.ascontiguousarray(a) for name, a in arrays.items()}
    table: dict[str, list[Any]] = {}
    offset = 0
    for name, arr in arrays.items():
        table[name] = [arr.dtype.str, list(arr.shape), offset]
        offset = _align(offset + arr.nbytes)
    crc = 0
    for arr in arrays.values():  # the padding is zeros and not covered
        if arr.nbytes:
            crc = zlib.crc32(memoryview(arr).cast("B"), crc)
    header = {**header, "data_crc32": crc, "arrays": table}
    blob = json.dumps(header, ensure_ascii=False, separators=(",", ":")).encode("utf-8", "surrogateescape")
    data_start = _align(_PREFIX.size + len(blob))
    with atomic_write(path) as fh:
        fh.write(_PREFIX.pack(magic, CACHE_VERSION, zlib.crc32(blob), len(blob)))
        fh.write(blob)
        fh.write(b"\0" * (data_start - _PREFIX.size - len(blob)))
        pos = 0
        for name, arr in arrays.items():
            start = table[name][2]
            fh.write(b"\0" * (start - pos))
            fh.write(memoryview(arr).cast("B") if arr.nbytes else b"")
            pos = start + arr.nbytes
        fh.write(b"\0" * (_align(pos) - pos))


def read_key(path: str | os.PathLike[str]) -> str | None:
    """The key stored in a cache file, None when there is no file; :class:`CacheError` when its
    header is not usable."""
    try:
        header, _ = _read_header(path)
    except FileNotFoundError:
        return None
    return header.get("key")


def _read_header(path: str | os.PathLike[str], magic: bytes = MAGIC) -> tuple[dict[str, Any], int]:
    with open_regular(path) as fh:  # a FIFO would block: NotRegularFileError
        size = os.fstat(fh.fileno()).st_size
        prefix = fh.read(_PREFIX.size)
        if len(prefix) < _PREFIX.size:
            raise CacheError(f"{path}: truncated cache file")
        found, version, header_crc, length = _PREFIX.unpack(prefix)
        if found != magic:
            raise CacheError(f"{path}: not a detloader {'index' if magic == MAGIC else 'file of this kind'} "
                             f"(magic={found!r})")
        if version != CACHE_VERSION:
            raise CacheError(f"{path}: cache version={version}, this detloader reads {CACHE_VERSION}")
        if length > size - _PREFIX.size:
            raise CacheError(f"{path}: damaged header (length={length} > file size {size})")
        blob = fh.read(length)
        if len(blob) < length:
            raise CacheError(f"{path}: truncated header")
    if zlib.crc32(blob) != header_crc:
        raise CacheError(f"{path}: damaged header (CRC-32 mismatch)")
    try:
        header = json.loads(blob.decode("utf-8", "surrogateescape"))
    except ValueError as err:
        raise CacheError(f"{path}: damaged header ({err})") from None
    if not isinstance(header, dict) or not isinstance(header.get("arrays"), dict):
        raise CacheError(f"{path}: damaged header (no array table)")
    return header, _align(_PREFIX.size + length)


class MappedIndex(AnnotationIndex):
    """An index whose arrays are read-only views of a cache file's memory map.

    It pickles as its file name, so DataLoader workers map the same file; once the file is gone
    or replaced (a new inode), it pickles its arrays instead (docs/reliability.md, "A cache rebuilt
    while workers run").
    """

    _file_id: tuple[int, int] | None = None
    _checksum: int | None = None

    def __reduce__(self) -> str | tuple[Any, ...]:
        path = self._source_file
        if path is not None and self._file_id is not None:
            try:
                st = os.stat(path)
            except OSError:
                st = None
            if st is not None and (st.st_dev, st.st_ino) == self._file_id:
                return (load_index_file, (path, str(self.root), self.meta.get("cache_key"), self._checksum))
        return super().__reduce__()


def read_arrays(
    path: str | os.PathLike[str], *, magic: bytes = MAGIC, check_data: bool = True
) -> tuple[dict[str, Any], dict[str, np.ndarray], os.stat_result]:
    """``(header, arrays, the file's stat)`` of a file :func:`write_arrays` wrote, the arrays
    read-only views of its memory map; their CRC is checked unless ``check_data`` is False.
    :class:`CacheError` when the file is damaged."""
    path = os.fspath(path)
    header, data_start = _read_header(path, magic)
    with open_regular(path) as fh:
        st = os.fstat(fh.fileno())
        size = st.st_size
        mm = mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) if size else b""
    if size < data_start:
        raise CacheError(f"{path}: truncated cache file (no array area)")
    if not isinstance(header.get("data_crc32"), int):
        raise CacheError(f"{path}: damaged header (no data_crc32)")
    crc = 0
    arrays: dict[str, np.ndarray] = {}
    view = memoryview(mm)
    for name, entry in header["arrays"].items():
        try:
            dtype, shape, offset = entry
            dt = np.dtype(dtype)
            if dt.hasobject or any(int(n) < 0 for n in shape) or int(offset) < 0:
                raise DetloaderValueError("negative or object")
            count = math.prod(int(n) for n in shape)
            start = data_start + int(offset)
        except (TypeError, ValueError, OverflowError) as err:
            raise CacheError(f"{path}: array {name} has a damaged entry {entry!r} ({err})") from None
        if start + count * dt.itemsize > size:
            raise CacheError(f"{path}: array {name} extends past the end of the file")
        nbytes = count * dt.itemsize
        if nbytes and check_data:
            crc = zlib.crc32(view[start : start + nbytes], crc)
        arrays[name] = np.frombuffer(mm, dtype=dt, count=count, offset=start).reshape(shape)
    del view
    if check_data and crc != header["data_crc32"]:
        raise CacheError(f"{path}: damaged arrays (CRC-32 mismatch)")
    return header, arrays, st


def load_index_file(
    path: str | os.PathLike[str],
    root: str | os.PathLike[str] | None = None,
    expect_key: str | None = None,
    expect_checksum: int | None = None,
    check_data: bool = True,
) -> MappedIndex:
    """Map a cache file and return its index (arrays are read-only views of the mapping).

    ``expect_key`` / ``expect_checksum``: refuse the file if its key or data CRC differs (it was
    rebuilt since the index that asks was loaded; this is how workers re-open their parent's
    index). :class:`CacheError` when the file is damaged or was rebuilt. ``check_data=False``:
    the arrays' CRC is not computed again (a file this process has just written, under its lock:
    it would read back the pages just written).
    """
    path = os.fspath(path)
    header, arrays, st = read_arrays(path, check_data=check_data)
    rebuilt = f"{path}: the cache was rebuilt by another process while this index was in use"
    if expect_key is not None and header.get("key") != expect_key:
        raise CacheError(f"{rebuilt} (key changed); restart the DataLoader")
    if expect_checksum is not None and header.get("data_crc32") != expect_checksum:
        raise CacheError(f"{rebuilt} (data CRC-32 changed); restart the DataLoader")
    missing = [name for name in array_names() if name not in arrays]
    if missing:
        raise CacheError(f"{path}: no array {missing[0]} in the file (written by another layout)")
    try:
        splits = {name: arrays.pop(f"split/{name}") for name in header["splits"]}
        index = MappedIndex(
            root=root if root is not None else header["root"],
            arrays=arrays,
            vocab=Vocabulary.from_dict(header["vocab"]),
            splits=splits,
            problems=ProblemReport.from_list(header["problems"]),
            meta={**header["meta"], "cache_key": header["key"]},
            source_file=path,
        )
    except (KeyError, TypeError, ValueError, OverflowError) as err:
        raise CacheError(f"{path}: not a usable index ({err})") from err
    index._file_id = (st.st_dev, st.st_ino)
    index._checksum = header["data_crc32"]
    reading = hold_shared(path)  # `cache clear` leaves the file while the index lives
    if reading is not None:
        weakref.finalize(index, os.close, reading)
    return index


# -- the key: what rebuilds the index when it changes ---------------------------------------
#: Bumped when what a reader produces changes, so that old caches are rebuilt (4: the key
#: holds ctimes, inodes, the root's identity and the image folders'; 5: split folders are
#: found two levels down, ``train_zip/train/``, every problem is listed, a YOLO ``flip_idx``
#: that swaps nothing makes a symmetric landmark schema; 6: image ids, the crowd flag and
#: category ids; 7: train / val / test splits made disjoint, ``split_overlap`` per pair, COCO
#: files paired by their split word; 8: per-image class lists and LVIS class frequency; 9: the
#: objects' own area).
READER_VERSION = 9


def folders_key(key: str, root: Path, folders: Iterable[str]) -> str:
    """The cache key of an index: ``key`` and the identity of every folder that holds its
    images, so that images added, removed or renamed there rebuild it."""
    return f"{key} {json.dumps({f: dir_identity(root / f) for f in folders}, sort_keys=True)}"


def key_matches(stored: str | None, key: str, root: Path) -> bool:
    if stored is None or not stored.startswith(key + " "):
        return False
    try:
        folders = json.loads(stored[len(key) + 1 :])
    except ValueError:
        return False
    return isinstance(folders, dict) and stored == folders_key(key, root, folders)


def content_key(
    name: str,
    options_json: str,
    source: Source,
    verify: str = "stat",
    digests: dict[str, bytes] | None = None,
    table: StampTable | None = None,
) -> str:
    """Hash of the reader, the options, the identity of the dataset folder (device and inode:
    a copy made with its cache rebuilds) and every stamped file (``table``: ``source``'s
    :meth:`~detloader.annotations.readers.common.Source.stamp_table` when made already); with
    ``verify="content"`` also of the files' bytes (each file's digest into ``digests`` when given)."""
    root = os.stat(source.root)
    h = hashlib.blake2b(digest_size=16)
    head = f"{READER_VERSION}\0{CACHE_VERSION}\0{name}\0{options_json}\0{root.st_dev}\0{root.st_ino}\0"
    h.update(head.encode("utf-8", "surrogateescape"))  # names not UTF-8 (surrogate escapes) hash as their bytes
    image_dirs = [dir_identity(source.root / d) for d in source.image_dirs or ()]  # images added or removed
    h.update(json.dumps([source.facts(), image_dirs], sort_keys=True).encode("utf-8", "surrogateescape"))
    names, numbers, _ = source.stamp_table() if table is None else table
    h.update("\n".join(names).encode("utf-8", "surrogateescape"))
    h.update(np.ascontiguousarray(numbers.T).tobytes())  # column after column: mtime, size, ctime, inode
    for rel, *_ in source.stamp if verify == "content" else ():
        try:
            with open_regular(source.root / rel) as fh:
                digest = hashlib.blake2b(fh.read()).digest()
        except OSError:
            digest = b"-"
        h.update(digest)
        if digests is not None:
            digests[rel] = digest
    return h.hexdigest()


def load_current(cache_file: Path, key: str, root: Path) -> AnnotationIndex | None:
    """The index in ``cache_file`` when its key is ``key`` (the dataset is unchanged), else None;
    a damaged file is never used (a warning, and the caller rebuilds it)."""
    try:
        if key_matches(read_key(cache_file), key, root):
            return load_index_file(cache_file, root=root)
    except (OSError, CacheError) as err:
        warnings.warn(f"{err}; rebuilding the index cache", DetloaderRuntimeWarning, stacklevel=3)
    return None
