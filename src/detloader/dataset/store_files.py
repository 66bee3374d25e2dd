"""The files of an image store (:mod:`detloader.dataset.store`): where it goes and how much room
is there, its temporary files, and the lifetime of a ``"ram"`` store in shared memory (its build
lock and opening it: :mod:`detloader._system.locks`). A ``"disk"`` store's users hold the same
shared ``flock``, so that ``detloader cache clear`` leaves it while one maps it.

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
from pathlib import Path

from detloader._system.locks import _same_file, locked, open_store

SUFFIX = ".dlstore"


def hold(fd: int) -> None:
    """Mark the calling process a user of the store open on ``fd`` (a shared ``flock``)."""
    fcntl.flock(fd, fcntl.LOCK_SH)


def release(path: Path, fd: int, pid: int, last_removes: bool = True) -> None:
    """Let go of the store ``path`` held on ``fd`` by process ``pid``; with ``last_removes`` (a
    ``"ram"`` store) its last user removes it and its lock file. Never raises (it runs at exit);
    a forked child only closes its copy of ``fd`` (its parent's hold is the same one)."""
    try:
        if last_removes and os.getpid() == pid:
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
    temporary files of builds whose process died (:func:`sweep_temporaries`); the paths removed."""
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
    return removed + sweep_temporaries(folder)


def sweep_temporaries(folder: Path) -> list[Path]:
    """Remove this user's temporary store files in ``folder`` (``"disk"`` or ``"ram"``) whose
    build died: no process holds their store's build lock; the paths removed."""
    removed = []
    uid = os.getuid()
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
