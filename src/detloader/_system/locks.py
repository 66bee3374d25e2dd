"""File locks that leave nothing behind (:func:`locked`: the index cache's build lock, an
image store's, a run folder's ``.train.lock``), whether another process holds one
(:func:`held_elsewhere`), and opening a file so that a FIFO, socket, device or folder where a
regular file belongs is refused by name at once, never waited on (:func:`open_store`).
"""

from __future__ import annotations

import errno
import fcntl
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from detloader._system.files import file_kind
from detloader.errors import NotRegularFileError


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
    :mod:`detloader.train.run_data`).

    Removing is safe because the holder unlinks while it holds the lock and a waiter re-checks
    the name after locking (filelock's ``UnixFileLock`` does not, so it never removes its file).
    A holder killed by ``SIGKILL`` leaves the file; its next holder removes it.

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
    and without creating the file (absent, or not a regular file: False). A lock file is only
    ever locked exclusively: a shared probe (allowed read-only) tells."""
    return _locked_by_another(path, "lock", fcntl.LOCK_SH)


def _locked_by_another(path: str | os.PathLike[str], what: str, probe: int) -> bool:
    """Whether a ``flock`` of ``probe`` (``LOCK_SH`` or ``LOCK_EX``) on ``path`` would wait for
    another process; False when ``path`` is absent or not a regular file."""
    try:
        fd = _open(Path(path), os.O_RDONLY, what)
    except (OSError, NotRegularFileError):
        return False
    try:
        fcntl.flock(fd, probe | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    except OSError:
        return False
    finally:
        os.close(fd)
    return False


def hold_shared(path: str | os.PathLike[str]) -> int | None:
    """Mark the calling process a reader of the regular file ``path``: a descriptor holding a
    shared ``flock`` on it (close it to let go; forked children share it), found by
    :func:`read_elsewhere` in other processes. None when the file cannot be opened or is being
    removed (an exclusive holder): a mapping of it stays valid either way."""
    try:
        fd = _open(Path(path), os.O_RDONLY, "file")
    except (OSError, NotRegularFileError):
        return None
    return fd if try_flock(fd, fcntl.LOCK_SH) else None


def try_flock(fd: int, op: int) -> bool:
    """Take the ``flock`` ``op`` (``LOCK_SH`` or ``LOCK_EX``) on ``fd`` without waiting: True,
    or False with ``fd`` closed when another process holds a clashing one (or it fails)."""
    try:
        fcntl.flock(fd, op | fcntl.LOCK_NB)
    except OSError:
        os.close(fd)
        return False
    return True


def read_elsewhere(path: str | os.PathLike[str]) -> bool:
    """Whether another process reads the regular file ``path`` (holds a ``flock`` on it:
    :func:`hold_shared`), found without waiting (absent, or not a regular file: False)."""
    return _locked_by_another(path, "file", fcntl.LOCK_EX)
