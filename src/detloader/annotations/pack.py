"""A pack: a dataset's index and its images' original bytes, in shards of litdata's chunk format,
ready for an object store (``detloader pack``; docs/loader.md, "Data on an object store").

A pack folder (or ``s3://``, ``gs://``, ``azure://`` prefix) holds::

    chunk-0-0.bin ...     litdata chunks, one item per image in index row order:
                          {"row": int, "bytes": the image file's original bytes}
    index.json            litdata's index of the chunks (``litdata.StreamingDataset`` reads the pack)
    index.dlindex         the index: the index cache's file (every array, vocabulary, split,
                          problem and meta field; CRC-checked), :func:`detloader.annotations.cache.save_index`
    detloader-pack.json   the manifest (:class:`PackManifest`): :data:`PACK_VERSION`, the
                          detloader that wrote it, the number of images, per shard its file
                          name, bytes, items, first row and sha256, and the index file's

:func:`read_pack_index` fetches the manifest and the index file only, each verified before it is
used; :func:`fetch_verified` is the one way a file of a pack is downloaded (the shards too,
:mod:`detloader.dataset.shards`): through litdata's downloader, whole and checked against the
manifest before it gets its name, retried, and within :data:`FETCH_DEADLINE_S` a named error.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import os
import shutil
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from detloader._system.cache_dir import cache_root
from detloader._system.files import no_room_error
from detloader._system.locks import locked
from detloader.annotations.cache import MappedIndex, load_index_file
from detloader.annotations.index import AnnotationIndex
from detloader.errors import CacheError, DetloaderValueError, DiskFullError, MissingExtraError, PackError, StreamError

#: The pack format's version; a pack of another version is refused by name (:class:`PackError`)
#: (2: the packed index holds the per-image class lists).
PACK_VERSION = 2
#: The manifest's name in a pack, beside litdata's ``index.json``.
MANIFEST_NAME = "detloader-pack.json"
#: The packed index's name in a pack.
INDEX_NAME = "index.dlindex"
#: The key the packed index's file records (what :class:`~detloader.annotations.cache.MappedIndex` checks).
INDEX_KEY = f"detloader-pack {PACK_VERSION}"
#: What each item of a shard holds, as litdata records it (``config.data_format``).
ITEM_FORMAT = ["int", "bytes"]
#: Attempts to fetch one file, the waits between them, and the time after which no attempt starts.
FETCH_ATTEMPTS = 3
FETCH_BACKOFF_S = (1.0, 2.0)
FETCH_DEADLINE_S = 60.0
#: botocore's timeouts for s3:// (seconds). botocore retries nothing (we do); boto3's transfer
#: retries a body cut mid-stream up to 5 times on its own, each bounded by the read timeout.
S3_CONNECT_TIMEOUT_S = 5
S3_READ_TIMEOUT_S = 5
_HASH_BLOCK = 1 << 20
_SCHEMES = ("s3://", "gs://", "azure://", "r2://", "hf://")


def _require_litdata() -> None:
    try:
        import litdata  # noqa: F401
    except ImportError as err:
        raise MissingExtraError(
            "packs need litdata (and boto3 for s3://): pip install 'detloader[stream]' "
            "(or pip install --no-deps litdata lightning-utilities)"
        ) from err


@dataclass(frozen=True)
class ShardInfo:
    """One shard of a pack: its file name, size in bytes, number of items (images), the index
    row of its first item and the sha256 of its bytes (hex)."""

    filename: str
    bytes: int
    items: int
    first_row: int
    sha256: str


@dataclass(frozen=True)
class PackManifest:
    """What ``detloader-pack.json`` holds (see the module docstring). ``litdata_config`` is
    litdata's ``config`` of the chunks (item format, tree spec), what its item loader needs to
    read an item."""

    images: int
    shards: tuple[ShardInfo, ...]
    index_file: str
    index_bytes: int
    index_sha256: str
    litdata_config: dict[str, Any]
    detloader_version: str
    pack_version: int = PACK_VERSION

    @property
    def total_bytes(self) -> int:
        """Bytes of every shard together."""
        return sum(s.bytes for s in self.shards)

    def to_dict(self) -> dict[str, Any]:
        """The manifest as JSON-able data (what the file holds, and ``index.meta["pack"]["manifest"]``)."""
        out = asdict(self)
        out["shards"] = [asdict(s) for s in self.shards]
        return {"format": "detloader-pack", "hash": "sha256", **out}

    def to_json(self) -> bytes:
        """The manifest file's bytes: sorted keys, no time stamp, so that one pack writes one file."""
        return (json.dumps(self.to_dict(), sort_keys=True, indent=1) + "\n").encode("utf-8")

    @classmethod
    def from_dict(cls, data: Any, source: str = MANIFEST_NAME) -> PackManifest:
        """The manifest in ``data``; :class:`PackError` naming ``source``, the field and the value
        when it is of another pack version or not a usable manifest."""
        if not isinstance(data, dict) or data.get("format") != "detloader-pack":
            raise PackError(f"{source}: not a detloader pack manifest (format={_get(data, 'format')!r})")
        version = data.get("pack_version")
        if version != PACK_VERSION:
            raise PackError(
                f"{source}: pack_version={version!r}, written by detloader "
                f"{data.get('detloader_version', '?')}; this detloader reads pack_version={PACK_VERSION}: "
                "pack the dataset again with this detloader (detloader pack PATH OUT)"
            )
        if data.get("hash") != "sha256":
            raise PackError(f"{source}: hash={data.get('hash')!r}, this detloader checks 'sha256'")
        try:
            shards = tuple(ShardInfo(**s) for s in data["shards"])
            manifest = cls(
                images=int(data["images"]), shards=shards, index_file=str(data["index_file"]),
                index_bytes=int(data["index_bytes"]), index_sha256=str(data["index_sha256"]),
                litdata_config=dict(data["litdata_config"]), detloader_version=str(data["detloader_version"]),
            )
        except (KeyError, TypeError, ValueError) as err:
            raise PackError(f"{source}: damaged manifest ({type(err).__name__}: {err})") from None
        manifest._check(source)
        return manifest

    @classmethod
    def from_json(cls, blob: bytes, source: str = MANIFEST_NAME) -> PackManifest:
        """:meth:`from_dict` of a manifest file's bytes."""
        try:
            data = json.loads(blob.decode("utf-8"))
        except ValueError as err:
            raise PackError(f"{source}: damaged manifest, not JSON ({err})") from None
        return cls.from_dict(data, source)

    def _check(self, source: str) -> None:
        """The shards cover rows 0..images-1 in order, each named once, as litdata's items."""
        row = 0
        for k, s in enumerate(self.shards):
            if s.first_row != row or s.items <= 0 or s.bytes <= 0 or len(s.sha256) != 64:
                raise PackError(
                    f"{source}: shards[{k}] ({s.filename}): first_row={s.first_row} items={s.items} "
                    f"bytes={s.bytes} sha256={s.sha256!r}; expected first_row={row}, items and bytes > 0"
                )
            if os.path.basename(s.filename) != s.filename or s.filename.startswith("."):
                raise PackError(f"{source}: shards[{k}]: filename={s.filename!r} is not a plain file name")
            row += s.items
        if row != self.images:
            raise PackError(f"{source}: the shards hold {row} items, images={self.images}")
        if len({s.filename for s in self.shards}) != len(self.shards):
            raise PackError(f"{source}: a shard file is named twice")
        fmt = self.litdata_config.get("data_format")
        if self.images and fmt != ITEM_FORMAT:
            raise PackError(f"{source}: litdata_config.data_format={fmt!r}, expected {ITEM_FORMAT}")


def _get(data: Any, key: str) -> Any:
    return data.get(key) if isinstance(data, dict) else None


# -- locations and fetching ---------------------------------------------------------------------


def is_url(location: str | os.PathLike[str]) -> bool:
    """Whether ``location`` names an object store prefix (``s3://``, ``gs://``, ...), not a folder."""
    return str(location).startswith(_SCHEMES)


def is_pack(location: str | os.PathLike[str]) -> bool:
    """Whether ``read_annotations(location)`` reads a pack: an object store prefix, or a folder
    that holds a manifest (:data:`MANIFEST_NAME`)."""
    return is_url(location) or (Path(location) / MANIFEST_NAME).is_file()


#: The most a pack's shards may take in the stream cache when no limit is given (bytes).
DEFAULT_CACHE_LIMIT = 16 << 30


def default_cache_limit(cache_dir: str | os.PathLike[str]) -> int:
    """The stream cache limit when none is given: :data:`DEFAULT_CACHE_LIMIT`, or half the room
    left on the disk of ``cache_dir`` when that is less."""
    folder = Path(cache_dir)
    while not folder.exists() and folder != folder.parent:
        folder = folder.parent
    try:
        free = shutil.disk_usage(folder).free
    except OSError:
        return DEFAULT_CACHE_LIMIT
    return int(min(DEFAULT_CACHE_LIMIT, free // 2))


def read_pack(
    location: str | os.PathLike[str],
    stream_cache: str | os.PathLike[str] | None,
    stream_cache_limit: int | None,
    storage_options: Mapping[str, Any] | None,
    read_options: Sequence[str] = (),
    classes: Sequence[str] | None = None,
) -> AnnotationIndex:
    """:func:`read_pack_index` as ``read_annotations`` calls it: the cache folder defaults to the
    user cache folder's ``stream/``, the limit to :func:`default_cache_limit`. ``read_options``:
    the read options the caller gave, refused by name (a pack holds an index read already);
    ``classes``: the class list the caller expects (a checkpoint's), which must be the pack's.

    Raises:
        DetloaderValueError: a read option given, or a limit that is not a positive int.
    """
    if read_options:
        raise DetloaderValueError(
            f"{location}: {', '.join(read_options)} cannot apply to a pack: it holds an index read when it was "
            "packed; read the source with those options and pack it again (detloader pack SRC OUT)"
        )
    if stream_cache_limit is not None and (
        isinstance(stream_cache_limit, bool) or not isinstance(stream_cache_limit, int) or stream_cache_limit <= 0
    ):
        raise DetloaderValueError(f"stream_cache_limit={stream_cache_limit!r} is not a positive number of bytes")
    folder = Path(stream_cache) if stream_cache is not None else cache_root() / "stream"
    limit = stream_cache_limit if stream_cache_limit is not None else default_cache_limit(folder)
    index = read_pack_index(location, folder, storage_options, cache_limit=limit)
    if classes is not None and tuple(classes) != tuple(index.classes):
        raise DetloaderValueError(
            f"{location}: classes={list(classes)[:8]} differ from the pack's {list(index.classes)[:8]}: a pack holds "
            "the index it was packed with; pack the source again read with those classes"
        )
    return index


def pack_location(location: str | os.PathLike[str]) -> str:
    """``location`` as litdata's downloader takes it: a URL without its trailing ``/``, or a
    folder's absolute path."""
    text = os.fspath(location)
    return text.rstrip("/") if is_url(text) else os.path.abspath(text)


def downloader_options(location: str, storage_options: Mapping[str, Any] | None) -> dict[str, Any]:
    """``storage_options`` for litdata's downloader of ``location``: for ``s3://``, unless the
    caller gives its own ``config``, botocore timeouts (:data:`S3_CONNECT_TIMEOUT_S`,
    :data:`S3_READ_TIMEOUT_S`) and no retries of its own (litdata's default retries 1000 times:
    a server gone would hang the loader), :func:`fetch_verified` retries. Endpoint and
    credentials come the usual way (``AWS_ENDPOINT_URL``, profiles) or as ``endpoint_url``..."""
    options = dict(storage_options or {})
    if location.startswith("s3://") and "config" not in options:
        from botocore.config import Config

        options["config"] = Config(
            connect_timeout=S3_CONNECT_TIMEOUT_S, read_timeout=S3_READ_TIMEOUT_S,
            retries={"total_max_attempts": 1, "mode": "standard"},
        )
    return options


def make_downloader(location: str, cache_dir: Path, manifest: PackManifest | None,
                    storage_options: Mapping[str, Any] | None) -> Any:
    """litdata's downloader for the pack at ``location`` (``get_downloader``: boto3 for s3://,
    the cloud SDKs for gs:// and azure://, a copy for a folder), made in the process that uses it."""
    _require_litdata()
    from litdata.streaming.downloader import get_downloader

    chunks = [{"filename": s.filename, "chunk_bytes": s.bytes} for s in manifest.shards] if manifest else []
    return get_downloader(location, str(cache_dir), chunks, downloader_options(location, storage_options))


def file_sha256(path: str | os.PathLike[str]) -> str:
    """The sha256 (hex) of the file at ``path``, read in blocks."""
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(_HASH_BLOCK), b""):
            h.update(block)
    return h.hexdigest()


def _permanent(err: BaseException) -> str | None:
    """Why retrying ``err`` cannot help (the object is absent, access refused), else None."""
    if isinstance(err, FileNotFoundError):
        return "no such file"
    response = getattr(err, "response", None)  # botocore's ClientError
    code = str(response.get("Error", {}).get("Code", "")) if isinstance(response, dict) else ""
    if code in ("404", "NoSuchKey", "NoSuchBucket"):
        return f"not found on the store ({code})"
    if code in ("403", "AccessDenied", "InvalidAccessKeyId", "SignatureDoesNotMatch"):
        return f"access refused ({code}): check the credentials"
    return None


def _remove_quietly(*paths: str | os.PathLike[str]) -> None:
    for path in paths:
        with contextlib.suppress(OSError):
            os.unlink(path)


def fetch_verified(
    downloader: Any, location: str, name: str, folder: Path, size: int | None = None, sha256: str | None = None,
) -> Path:
    """Download ``location/name`` through litdata's ``downloader`` into a temporary file in
    ``folder`` and return it once it is whole: ``size`` bytes with the ``sha256`` the manifest
    records (when given). The caller gives it its name (``os.replace``): a partial or corrupt
    download never has it. Up to :data:`FETCH_ATTEMPTS` attempts with :data:`FETCH_BACKOFF_S`
    waits; none is started that would end past :data:`FETCH_DEADLINE_S` were it as long as the
    longest so far (a refused connection fails in milliseconds, a server that stops answering
    after the read timeout, or after boto3's own retries of a body cut mid-stream).

    Raises:
        StreamError: every attempt failed (the last reason, the URL, the file and what to try),
            or the file is absent or refused (at once: retrying cannot help).
        DiskFullError: no room in ``folder`` for it (not retried).
    """
    remote = f"{location}/{name}"
    part = folder / f".{name}.{os.getpid()}.{threading.get_ident()}.part"
    start, attempt, reason, corrupt, longest = time.monotonic(), 0, "", False, 0.0
    while True:
        attempt += 1
        began = time.monotonic()
        try:
            downloader.download_file(remote, str(part))
            if not part.exists():
                raise StreamError(f"{remote}: the downloader published no file", location, name)
            got = part.stat().st_size
            if size is not None and got != size:
                corrupt, reason = True, f"{got} bytes, the manifest records {size} (a partial download)"
            elif sha256 is not None and (digest := file_sha256(part)) != sha256:
                corrupt, reason = True, f"sha256 {digest[:16]}... differs from the manifest's {sha256[:16]}..."
            else:
                return part
        except Exception as err:  # noqa: BLE001 - every SDK has its own errors: named below
            _remove_quietly(part)
            room = no_room_error(err)
            if room is not None:
                raise _disk_full(folder, remote, room) from err
            why = _permanent(err)
            if why is not None:
                raise StreamError(f"{remote}: {why}; check the URL and that the pack was uploaded whole",
                                  location, name) from err
            cause = getattr(err, "last_exception", None)  # boto3's transfer: RetriesExceededError
            corrupt, reason = False, f"{type(err).__name__}: {err}" + (f" ({cause})" if cause else "")
        finally:
            _remove_quietly(f"{part}.lock", f"{part}.tmp", f"{part}.tmp.{os.getpid()}")
        _remove_quietly(part)
        now = time.monotonic()
        longest = max(longest, now - began)
        wait = FETCH_BACKOFF_S[min(attempt, len(FETCH_BACKOFF_S)) - 1]
        if attempt >= FETCH_ATTEMPTS or now - start + wait + longest > FETCH_DEADLINE_S:
            break  # another attempt as long as the longest so far would end past the deadline
        time.sleep(wait)
    if corrupt:
        hint = (f"the object on the store is not the one packed: upload {name} of the pack again "
                "(or pack the dataset again)")
    else:
        hint = ("check that the server answers (the endpoint: AWS_ENDPOINT_URL or "
                "storage_options['endpoint_url']) and the credentials, then run again: the shards "
                "already in the cache are kept")
    raise StreamError(
        f"{remote}: not fetched after {attempt} attempts in {time.monotonic() - start:.1f} s; "
        f"last: {reason}; {hint}", location, name,
    )


def _disk_full(folder: Path, remote: str, err: OSError) -> DiskFullError:
    try:
        free = f"{shutil.disk_usage(folder).free / 2**20:.1f} MiB free on {folder}"
    except OSError:
        free = f"free space on {folder} unknown"
    full = DiskFullError(
        f"{folder}: {remote} not cached, {os.strerror(err.errno or errno.ENOSPC).lower()} ({free}): free some "
        "space, lower the stream cache limit or put the stream cache elsewhere"
    )
    full.errno = err.errno
    return full


# -- reading a pack's index -------------------------------------------------------------------


def pack_cache_folder(cache_dir: str | os.PathLike[str], manifest_blob: bytes) -> Path:
    """The folder of ``cache_dir`` that holds one pack (named by its manifest's sha256, so that a
    pack written again under the same URL gets a new one, and two copies of a pack share it)."""
    return Path(cache_dir) / f"pack-{hashlib.sha256(manifest_blob).hexdigest()[:16]}"


def read_pack_index(
    url_or_folder: str | os.PathLike[str],
    cache_dir: str | os.PathLike[str],
    storage_options: Mapping[str, Any] | None = None,
    cache_limit: int | None = None,
) -> AnnotationIndex:
    """The index of the pack at ``url_or_folder`` (a folder, or an ``s3://``, ``gs://``,
    ``azure://`` prefix), without any image: only the manifest and the index file are fetched,
    into ``cache_dir/pack-<digest>/`` (:func:`pack_cache_folder`), each verified (the manifest's
    version and fields, the index file's size and sha256, then its CRC). The index's arrays map
    that file (:class:`~detloader.annotations.cache.MappedIndex`, shared by workers).

    The index's image paths are those of the source, relative as they were; its ``root`` is the
    pack's cache folder. ``index.meta["pack"]`` holds what the shards are found by: ``url`` (the
    location, a folder's absolute path), ``manifest`` (:meth:`PackManifest.to_dict`),
    ``cache_dir`` (the pack's cache folder) and ``cache_limit`` (bytes, or None); storage options
    are not kept there (credentials): give them again to
    :meth:`detloader.dataset.shards.ShardCache.for_index`.

    Raises:
        PackError: a pack of another version (naming the detloader that wrote it), a damaged
            manifest or index file.
        StreamError: the manifest or the index cannot be fetched (see :func:`fetch_verified`).
    """
    location = pack_location(url_or_folder)
    cache_root = Path(cache_dir).absolute()  # meta["pack"] names it to workers, whatever their cwd
    cache_root.mkdir(parents=True, exist_ok=True)
    downloader = make_downloader(location, cache_root, None, storage_options)
    part = fetch_verified(downloader, location, MANIFEST_NAME, cache_root)
    try:
        blob = part.read_bytes()
        manifest = PackManifest.from_json(blob, f"{location}/{MANIFEST_NAME}")
        folder = pack_cache_folder(cache_root, blob)
        folder.mkdir(exist_ok=True)
        os.replace(part, folder / MANIFEST_NAME)
    finally:
        _remove_quietly(part)
    index_path = folder / manifest.index_file
    if not index_path.exists():
        with locked(folder / f".{manifest.index_file}.lock", remove=True):  # one download per node
            if not index_path.exists():
                got = fetch_verified(downloader, location, manifest.index_file, folder,
                                     manifest.index_bytes, manifest.index_sha256)
                os.replace(got, index_path)
    try:
        mapped = load_index_file(index_path, root=folder, expect_key=INDEX_KEY)
    except CacheError as err:
        _remove_quietly(index_path)  # fetched again next time
        raise PackError(f"{location}/{manifest.index_file}: damaged packed index ({err})") from err
    if len(mapped) != manifest.images:
        raise PackError(
            f"{location}/{manifest.index_file}: {len(mapped)} images, the manifest records {manifest.images}"
        )
    pack = {"url": location, "manifest": manifest.to_dict(), "cache_dir": str(folder), "cache_limit": cache_limit}
    return PackIndex.adopt(mapped, pack)


def _open_pack_index(args: Sequence[Any], pack: dict[str, Any]) -> AnnotationIndex:
    """Map the packed index again in a worker (what :class:`PackIndex` pickles as)."""
    return PackIndex.adopt(load_index_file(*args), pack)


class PackIndex(MappedIndex):
    """A packed index mapped from the pack's cache folder: a
    :class:`~detloader.annotations.cache.MappedIndex` whose ``meta["pack"]`` (added after the file
    is mapped) survives pickling to DataLoader workers, which map the same file."""

    @classmethod
    def adopt(cls, mapped: Any, pack: dict[str, Any]) -> PackIndex:
        """``mapped`` (a just loaded MappedIndex) as a PackIndex with ``meta["pack"] = pack``."""
        index = cls.__new__(cls)
        index.__dict__.update(mapped.__dict__)
        index.meta = {**mapped.meta, "pack": pack}
        return index

    def __reduce__(self) -> str | tuple[Any, ...]:
        reduced = super().__reduce__()
        if isinstance(reduced, tuple) and reduced[0] is load_index_file:
            return (_open_pack_index, (reduced[1], self.meta["pack"]))
        return reduced
