"""The files of an image store (:mod:`detloader.store`): its build lock (:func:`locked`, also the
index cache's and a run folder's), opening it for reading or writing (special files refused by
name, never waited on), and the lifetime of a ``"ram"`` store in shared memory.

A ``"ram"`` store lives while a process uses it: every process that maps it holds a shared
``flock`` on the file (DataLoader workers forked from it share their parent's; spawned ones
and other ranks take their own when they map it). When a process that holds one lets go of
the store (the store is collected, or the interpreter exits), it takes the build lock without
waiting and, when the exclusive ``flock`` is free, removes the file and its lock: it was the
last user. A process killed before it could (``SIGKILL``, out of memory) leaves its store
behind; the next ``"ram"`` store opened by the same user removes such unused stores and
the temporary files of builds that died (:func:`sweep`).
"""

from __future__ import annotations

import errno
import fcntl
import hashlib
import math
import os
import resource
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from detloader._files import file_kind
from detloader.errors import NotRegularFileError

SUFFIX = ".dlstore"


def _refuse(path: Path, fd: int | None, what: str) -> None:
    """Raise :class:`NotRegularFileError` naming ``path`` when it (``fd`` open on it, else by
    ``os.stat``) is not a regular file."""
    try:
        mode = os.fstat(fd).st_mode if fd is not None else os.stat(path).st_mode
    except OSError:
        return
    kind = file_kind(mode)
    if kind is not None:
        raise NotRegularFileError(
            f"{path}: {kind}, not a regular file, where the image store keeps its {what}; remove it "
            "(the store is then rebuilt) or use cache=None"
        )


def _open(path: Path, flags: int, what: str, blocking: bool = False) -> int:
    """A descriptor of the regular file ``path`` opened with ``flags`` without blocking (a FIFO
    without a writer would wait forever), then made ``blocking``; :func:`_refuse` for anything else."""
    try:
        fd = os.open(path, flags | os.O_NONBLOCK | os.O_CLOEXEC, 0o666)
    except OSError as err:
        if err.errno in (errno.ENXIO, errno.EISDIR, errno.ENODEV):  # a socket, a folder, a device
            _refuse(path, None, what)
        raise
    try:
        _refuse(path, fd, what)
        os.set_blocking(fd, blocking)
    except BaseException:
        os.close(fd)
        raise
    return fd


def open_store(path: Path, write: bool = False, what: str = "images") -> int:
    """A descriptor of the regular file ``path`` for reading (``write``: and writing), opened
    without blocking (a FIFO without a writer would wait forever).

    Raises:
        NotRegularFileError: ``path`` is a FIFO, socket, device or folder (named, with what to do).
    """
    return _open(path, os.O_RDWR if write else os.O_RDONLY, what, blocking=True)


def _same_file(path: Path, fd: int) -> bool:
    try:
        a, b = os.stat(path), os.fstat(fd)
    except OSError:
        return False
    return (a.st_dev, a.st_ino) == (b.st_dev, b.st_ino)


@contextmanager
def locked(path: Path, wait: bool = True, remove: bool = False) -> Iterator[bool]:
    """Hold the exclusive ``flock`` of the lock file ``path`` (created if needed) for the block;
    yields True, or False at once when ``wait`` is False and another process holds it. The lock
    is taken on the file the name still names (checked after locking), so a holder may remove
    it: a waiter then locks the new file. With ``remove`` the holder does so when the block
    ends, normally or by an exception: no lock file stays behind (a store's build lock, the
    index cache's, :mod:`detloader.annotations.cache`, and a run folder's ``.train.lock``,
    :mod:`detloader.train.runs`).

    Why removing is safe here, and why not filelock's ``FileLock``: a process waiting for the
    lock holds a descriptor of the file it opened; were the name removed and that process
    to lock the removed file, a third one would create and lock a new file at the same time.
    So the holder unlinks while it still holds the lock, and a waiter, once it has the lock,
    checks that the name still names its file and otherwise starts again on the new one.
    filelock's ``UnixFileLock`` leaves the file on release by design, for this reason: 3.12
    does not check the file after locking, so removing its file is not safe. A process killed
    while holding the lock (``SIGKILL``) leaves the file; its next holder removes it.

    Raises:
        NotRegularFileError: ``path`` is a FIFO, socket, device or folder.
    """
    while True:
        try:
            fd = _open(path, os.O_RDWR | os.O_CREAT, "lock")
        except PermissionError:  # another user's lock: a shared flock works on a read-only descriptor
            fd = open_store(path, what="lock")
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | (0 if wait else fcntl.LOCK_NB))
        except BlockingIOError:
            os.close(fd)
            yield False
            return
        except BaseException:
            os.close(fd)
            raise
        if _same_file(path, fd):
            break
        os.close(fd)  # removed or replaced while we waited: lock the file the name names now
    try:
        yield True
    finally:
        try:
            if remove and _same_file(path, fd):
                os.unlink(path)  # while still locked: a waiter on this file then sees the name gone
        except OSError:
            pass  # another user's lock in a folder we cannot write: it stays
        finally:
            os.close(fd)


def held_elsewhere(path: Path) -> bool:
    """Whether a process holds the ``flock`` of the lock file ``path``, found without waiting
    and without creating the file (absent, or not a regular file: False)."""
    try:
        fd = _open(path, os.O_RDONLY, "lock")
    except (OSError, NotRegularFileError):
        return False
    try:  # a lock file is only ever locked exclusively: a shared probe (allowed read-only) tells
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    except OSError:
        return False
    finally:
        os.close(fd)
    return False


def hold(fd: int) -> None:
    """Mark the calling process a user of the ``"ram"`` store open on ``fd`` (a shared ``flock``)."""
    fcntl.flock(fd, fcntl.LOCK_SH)


def release(path: Path, fd: int, pid: int) -> None:
    """Let go of the ``"ram"`` store ``path`` held on ``fd`` by process ``pid``; its last user
    removes it and its lock file. Never raises (it runs at exit); a forked child only closes
    its copy of ``fd`` (its parent's hold is the same one)."""
    try:
        if os.getpid() == pid:
            _remove_if_unused(path, fd)
    except OSError:
        pass
    finally:
        try:
            os.close(fd)
        except OSError:
            pass


def _remove_if_unused(path: Path, fd: int) -> bool:
    """Remove ``path`` (open on ``fd``) and its lock when no process holds it or builds it."""
    lock = Path(f"{path}.lock")
    with locked(lock, wait=False) as mine:
        if not mine:
            return False  # another process is opening it: it becomes a user and removes it later
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return False
        if _same_file(path, fd):
            os.unlink(path)
        os.unlink(lock)
        return True


def remove_unused(path: Path) -> bool:
    """Remove the store ``path`` and its lock unless a process uses it (a ``"ram"`` store's
    shared ``flock``) or builds it (its build lock): True when removed or already gone."""
    try:
        fd = open_store(path)
    except FileNotFoundError:
        return True
    try:
        return _remove_if_unused(path, fd)
    finally:
        os.close(fd)


def sweep(folder: Path) -> list[Path]:
    """Remove this user's ``"ram"`` stores in ``folder`` that no process uses, and the
    temporary files of builds whose process died (their lock is free); the paths removed."""
    removed = []
    uid = os.getuid()
    for path in folder.glob(f"*{SUFFIX}"):
        try:
            if path.lstat().st_uid != uid or not path.is_file():
                continue
            fd = open_store(path)
        except OSError:
            continue
        try:
            if _remove_if_unused(path, fd):
                removed.append(path)
        except OSError:
            pass
        finally:
            os.close(fd)
    for tmp in folder.glob(f".*{SUFFIX}.*.tmp"):  # atomic_write's ".NAME.dlstore.XXXX.tmp"
        store = folder / (tmp.name[1:].split(f"{SUFFIX}.")[0] + SUFFIX)
        lock = Path(f"{store}.lock")
        try:
            if tmp.lstat().st_uid != uid:
                continue
            with locked(lock, wait=False, remove=True) as mine:
                if mine:  # no build of that store runs: the process that wrote it died
                    tmp.unlink()
                    removed.append(tmp)
        except OSError:
            pass
    return removed


def root_tag(root: Path) -> str:
    """8 hex digits of the dataset's absolute root, in a ``"ram"`` store's name."""
    return hashlib.blake2b(str(root.resolve()).encode("utf-8"), digest_size=4).hexdigest()


def store_dir(kind: str, root: Path) -> Path:
    """Where the stores of ``kind`` of the dataset at ``root`` live: ``"disk"`` beside its
    index cache, ``"ram"`` in ``/dev/shm`` (else the temporary folder)."""
    if kind == "disk":
        from detloader.annotations.cache import cache_dir_for

        return cache_dir_for(root)
    shm = Path("/dev/shm")
    return shm if shm.is_dir() and os.access(shm, os.W_OK) else Path(tempfile.gettempdir())


def store_paths(root: str | os.PathLike[str]) -> list[Path]:
    """The store files of the dataset at ``root``: its ``"disk"`` stores and its ``"ram"``
    stores in shared memory (any cache size, EXIF policy or images)."""
    root = Path(root)
    ram = store_dir("ram", root).glob(f"{root.resolve().name}-{root_tag(root)}-*{SUFFIX}")
    return sorted([*store_dir("disk", root).glob(f"*{SUFFIX}"), *ram])


def free_bytes(kind: str, folder: Path) -> int:
    """Free bytes in ``folder``; for ``"ram"`` at most the memory available."""
    free = shutil.disk_usage(folder).free
    if kind == "ram":
        import psutil

        free = min(free, psutil.virtual_memory().available)
    return int(free)


def file_size_limit() -> float:
    """The largest file this process may write (``RLIMIT_FSIZE``; inf when unlimited)."""
    soft = resource.getrlimit(resource.RLIMIT_FSIZE)[0]
    return math.inf if soft == resource.RLIM_INFINITY else float(soft)


def reserve(fd: int, size: int) -> None:
    """Give the file ``fd`` ``size`` bytes of blocks now (``posix_fallocate``), so that writing
    it cannot run out of space later (a full disk raises ``ENOSPC`` here, before any decoding);
    where the file system cannot reserve, only its size is set."""
    try:
        os.posix_fallocate(fd, 0, size)
    except OSError as err:
        if err.errno not in (errno.EOPNOTSUPP, errno.EINVAL, errno.ENOSYS):
            raise
        os.ftruncate(fd, size)
    except AttributeError:  # no posix_fallocate (macOS)
        os.ftruncate(fd, size)
