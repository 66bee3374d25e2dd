"""The on-disk index cache: one file, memory-mapped on load, no pickle.

Layout of a ``.dlindex`` file (little-endian)::

    8 bytes   magic b"DLINDEX\\n"
    4 bytes   uint32 format version (CACHE_VERSION)
    4 bytes   reserved (0)
    8 bytes   uint64 length of the JSON header
    header    UTF-8 JSON: key, vocabularies, splits, problems, meta, and for every array its
              dtype, shape and byte offset
    arrays    raw C-order data, each starting on a 64-byte boundary

Loading reads the header and maps the file read-only: the arrays are views into one ``mmap``,
so a 100k-image index opens in milliseconds and DataLoader workers share its pages.

The file for a dataset lives in ``<root>/.detloader-cache/`` when that folder can be written,
else in the user cache folder (``$XDG_CACHE_HOME/detloader`` or ``~/.cache/detloader``); the
environment variable ``DETLOADER_CACHE_DIR`` overrides both. Its name carries a hash of the
reading options; its header carries the *key*, a hash of the annotation files' names, sizes
and modification times: a different key means the dataset changed and the index is rebuilt.
"""

from __future__ import annotations

import hashlib
import json
import mmap
import os
import struct
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any, Iterator

import numpy as np

from detloader.annotations.fields import array_names
from detloader.annotations.index import AnnotationIndex
from detloader.annotations.vocabulary import Vocabulary
from detloader.annotations.problems import ProblemReport

__all__ = [
    "CACHE_DIR_ENV",
    "CACHE_SUBDIR",
    "CACHE_VERSION",
    "MAGIC",
    "CacheError",
    "MappedIndex",
    "atomic_write",
    "cache_dir_for",
    "load_index_file",
    "read_key",
    "save_index",
    "user_cache_dir",
]

MAGIC = b"DLINDEX\n"
CACHE_VERSION = 1
_ALIGN = 64
_PREFIX = struct.Struct("<8sIIQ")
CACHE_DIR_ENV = "DETLOADER_CACHE_DIR"
CACHE_SUBDIR = ".detloader-cache"


class CacheError(ValueError):
    """A cache file that cannot be used (wrong magic, version, or truncated)."""


def _align(n: int) -> int:
    return (n + _ALIGN - 1) // _ALIGN * _ALIGN


def user_cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "detloader"


def cache_dir_for(root: str | os.PathLike[str]) -> Path:
    """Where the cache of the dataset at ``root`` lives (created if needed)."""
    root = Path(root).resolve()
    tag = hashlib.blake2b(str(root).encode("utf-8"), digest_size=8).hexdigest()
    override = os.environ.get(CACHE_DIR_ENV)
    if override:
        target = Path(override) / f"{root.name}-{tag}"
        target.mkdir(parents=True, exist_ok=True)
        return target
    folder = root if root.is_dir() else root.parent
    beside = folder / CACHE_SUBDIR
    if _writable(folder):
        try:
            beside.mkdir(exist_ok=True)
            if os.access(beside, os.W_OK):
                return beside
        except OSError:
            pass
    target = user_cache_dir() / f"{root.name}-{tag}"
    target.mkdir(parents=True, exist_ok=True)
    return target


@contextmanager
def atomic_write(path: str | os.PathLike[str], mode: str = "wb") -> Iterator[IO[Any]]:
    """A file object writing to a temporary file beside ``path``, renamed over ``path`` when
    the block ends without error (readers never see half a file), removed otherwise."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=path.name, suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, mode, encoding=None if "b" in mode else "utf-8") as fh:
            yield fh
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def _writable(folder: Path) -> bool:
    """Writable for us, and not marked read-only by its mode bits (which root would ignore)."""
    try:
        mode = folder.stat().st_mode
    except OSError:
        return False
    return bool(mode & 0o222) and os.access(folder, os.W_OK)


def save_index(index: AnnotationIndex, path: str | os.PathLike[str], key: str) -> Path:
    """Write ``index`` to ``path`` atomically (temporary file + rename)."""
    path = Path(path)
    arrays = {name: np.ascontiguousarray(a) for name, a in index.arrays().items()}  # FIELDS order
    for name, members in index.splits.items():
        arrays[f"split/{name}"] = np.ascontiguousarray(members, dtype=np.int64)
    table: dict[str, list[Any]] = {}
    offset = 0
    for name, arr in arrays.items():
        table[name] = [arr.dtype.str, list(arr.shape), offset]
        offset = _align(offset + arr.nbytes)
    header = {
        "key": key,
        "root": str(index.root),
        "vocab": index.vocab.to_dict(),
        "splits": list(index.splits),
        "problems": index.problems.to_list(),
        "meta": index.meta,
        "arrays": table,
    }
    blob = json.dumps(header, ensure_ascii=False, separators=(",", ":")).encode("utf-8")
    data_start = _align(_PREFIX.size + len(blob))
    with atomic_write(path) as fh:
        fh.write(_PREFIX.pack(MAGIC, CACHE_VERSION, 0, len(blob)))
        fh.write(blob)
        fh.write(b"\0" * (data_start - _PREFIX.size - len(blob)))
        pos = 0
        for name, arr in arrays.items():
            start = table[name][2]
            fh.write(b"\0" * (start - pos))
            fh.write(memoryview(arr).cast("B") if arr.nbytes else b"")
            pos = start + arr.nbytes
        fh.write(b"\0" * (_align(pos) - pos))
    return path


def read_key(path: str | os.PathLike[str]) -> str | None:
    """The key stored in a cache file, or None if the file is missing or not usable."""
    try:
        header, _ = _read_header(path)
    except (OSError, CacheError):
        return None
    return header.get("key")


def _read_header(path: str | os.PathLike[str]) -> tuple[dict[str, Any], int]:
    with open(path, "rb") as fh:
        prefix = fh.read(_PREFIX.size)
        if len(prefix) < _PREFIX.size:
            raise CacheError(f"{path}: truncated cache file")
        magic, version, _, length = _PREFIX.unpack(prefix)
        if magic != MAGIC:
            raise CacheError(f"{path}: not a detloader index (magic={magic!r})")
        if version != CACHE_VERSION:
            raise CacheError(f"{path}: cache version={version}, this detloader reads {CACHE_VERSION}")
        blob = fh.read(length)
        if len(blob) < length:
            raise CacheError(f"{path}: truncated header")
    try:
        header = json.loads(blob.decode("utf-8"))
    except ValueError as err:
        raise CacheError(f"{path}: damaged header ({err})") from None
    if not isinstance(header, dict) or "arrays" not in header:
        raise CacheError(f"{path}: damaged header (no array table)")
    return header, _align(_PREFIX.size + length)


class MappedIndex(AnnotationIndex):
    """An index whose arrays are read-only views of a cache file's memory map.

    It pickles as its file name (plus root and key), so DataLoader worker processes map the
    same file instead of receiving a copy of the arrays; if the file is gone, it pickles its
    arrays like any index.
    """

    def __reduce__(self) -> str | tuple[Any, ...]:
        if self._source_file is not None and os.path.exists(self._source_file):
            return (load_index_file, (self._source_file, str(self.root), self.meta.get("cache_key")))
        return super().__reduce__()


def load_index_file(
    path: str | os.PathLike[str],
    root: str | os.PathLike[str] | None = None,
    expect_key: str | None = None,
) -> MappedIndex:
    """Map a cache file and return its index (arrays are read-only views of the mapping).

    ``expect_key``: refuse the file if its key differs (it was rebuilt for changed data since
    the index that asks was loaded; this is how worker processes re-open their parent's index).
    """
    path = os.fspath(path)
    header, data_start = _read_header(path)
    if expect_key is not None and header.get("key") != expect_key:
        raise CacheError(f"{path}: the cache was rebuilt (key changed) while this index was in use")
    with open(path, "rb") as fh:
        size = os.fstat(fh.fileno()).st_size
        mm = mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) if size else b""
    missing = [name for name in array_names() if name not in header["arrays"]]
    if missing:
        raise CacheError(f"{path}: no array {missing[0]} in the file (written by another layout)")
    arrays: dict[str, np.ndarray] = {}
    for name, (dtype, shape, offset) in header["arrays"].items():
        try:
            dt = np.dtype(dtype)
        except TypeError as err:
            raise CacheError(f"{path}: array {name} has dtype={dtype!r}") from err
        count = int(np.prod(shape, dtype=np.int64))
        start = data_start + offset
        if start + count * dt.itemsize > size:
            raise CacheError(f"{path}: array {name} extends past the end of the file")
        arrays[name] = np.frombuffer(mm, dtype=dt, count=count, offset=start).reshape(shape)
    try:
        splits = {name: arrays.pop(f"split/{name}") for name in header["splits"]}
        return MappedIndex(
            root=root if root is not None else header["root"],
            arrays=arrays,
            vocab=Vocabulary.from_dict(header["vocab"]),
            splits=splits,
            problems=ProblemReport.from_list(header["problems"]),
            meta={**header["meta"], "cache_key": header["key"]},
            source_file=path,
        )
    except (KeyError, TypeError, ValueError) as err:
        raise CacheError(f"{path}: not a usable index ({err})") from err
