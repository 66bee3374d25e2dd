"""Reading and writing files safely, for every stage: :func:`read_capped` refuses what is not
a regular file (a FIFO would hang) or is over a cap before reading; :func:`atomic_write` is the
one way detloader writes a file (docs/reliability.md: a full disk is one :class:`DiskFullError`,
the previous file stays intact).
"""

from __future__ import annotations

import errno
import os
import shutil
import stat
import tempfile
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any, BinaryIO

from detloader.errors import DiskFullError, FileTooLargeError, NotRegularFileError

_KINDS = ((stat.S_ISFIFO, "a FIFO"), (stat.S_ISSOCK, "a socket"), (stat.S_ISCHR, "a character device"),
          (stat.S_ISBLK, "a block device"), (stat.S_ISDIR, "a folder"))


def file_kind(mode: int) -> str | None:
    """``"a FIFO"``, ``"a socket"``, ... for a ``st_mode`` that is not a regular file; None for one."""
    return None if stat.S_ISREG(mode) else next((k for test, k in _KINDS if test(mode)), "not a regular file")


def special_kind(path: str | os.PathLike[str]) -> str | None:
    """``"a FIFO"``, ``"a folder"``, ... when something other than a regular file is at ``path``
    (links followed; never opened, so never blocks); None for a regular file or nothing there."""
    try:
        return file_kind(os.stat(path).st_mode)
    except (OSError, ValueError):
        return None


def refuse_special(path: str | os.PathLike[str], doing: str = "not written over") -> None:
    """:class:`NotRegularFileError` naming ``path`` when a FIFO, socket, device or folder is
    there (:func:`special_kind`): ``<path>: a FIFO, not a regular file; not written over
    (remove it, or choose another path)``."""
    kind = special_kind(path)
    if kind is not None:
        raise NotRegularFileError(f"{path}: {kind}, not a regular file; {doing} (remove it, or choose another path)")


def open_regular(path: str | os.PathLike[str], cap: int | None = None, cap_name: str = "max_file_bytes") -> BinaryIO:
    """``path`` opened for binary reading. Opening does not block (``O_NONBLOCK``: a FIFO
    without a writer would wait forever); :class:`NotRegularFileError` for anything but a
    regular file, :class:`FileTooLargeError` when its size exceeds ``cap`` (``cap_name=cap``
    in the message)."""
    fd, _ = _open_regular_fd(path, cap, cap_name)
    try:
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def _open_regular_fd(path: str | os.PathLike[str], cap: int | None, cap_name: str) -> tuple[int, int]:
    """The file descriptor of :func:`open_regular` and the file's size then."""
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0))
    try:
        st = os.fstat(fd)
        kind = file_kind(st.st_mode)
        if kind is not None:
            raise NotRegularFileError(f"{kind}, not a regular file")
        if cap is not None and st.st_size > cap:
            raise FileTooLargeError(f"size={st.st_size} bytes exceeds {cap_name}={cap}")
        return fd, st.st_size
    except BaseException:
        os.close(fd)
        raise


def read_capped(path: str | os.PathLike[str], cap: int | None, cap_name: str = "max_file_bytes") -> bytes:
    """The bytes of the regular file ``path`` (:func:`open_regular`), refused by its size
    before anything is read, and by what it holds should it grow meanwhile (None: no cap).
    Read with ``os.read`` of the size the file has plus one byte (then to its end): no buffered
    file object, and no buffer of ``cap`` bytes allocated per file (a third of reading an
    image of 50 kB through ``open().read(cap + 1)``)."""
    fd, size = _open_regular_fd(path, cap, cap_name)
    try:
        chunks, total, want = [], 0, size + 1
        while cap is None or total <= cap:
            chunk = os.read(fd, want if cap is None else min(want, cap + 1 - total))
            if not chunk:
                break
            chunks.append(chunk)
            total += len(chunk)
            want = max(want - len(chunk), 1 << 16)  # grown since the fstat: on to its end
    finally:
        os.close(fd)
    if cap is not None and total > cap:
        raise FileTooLargeError(f"size>{cap} bytes exceeds {cap_name}={cap}")
    return chunks[0] if len(chunks) == 1 else b"".join(chunks)


#: errno values that mean "no room for this write": a full disk, a quota, the file size limit (``ulimit -f``).
_NO_ROOM = {errno.ENOSPC: "no space left on the device", getattr(errno, "EDQUOT", errno.ENOSPC): "disk quota exceeded",
            errno.EFBIG: "the file size limit (ulimit -f) was reached"}


def no_room_error(err: BaseException) -> OSError | None:
    """The ``OSError`` meaning "no room" (:data:`_NO_ROOM`) that ``err`` is, or that caused it:
    ``torch.save`` wraps the writer's ``OSError`` in a ``RuntimeError`` (``__context__``)."""
    seen: set[int] = set()
    cur: BaseException | None = err
    while cur is not None and id(cur) not in seen:
        seen.add(id(cur))
        if isinstance(cur, OSError) and cur.errno in _NO_ROOM:
            return cur
        cur = cur.__cause__ or cur.__context__
    return None


def _disk_full(err: BaseException, path: Path) -> BaseException:
    """``err``, or for a full disk, quota or file size limit a :class:`DiskFullError` naming the file
    and the free space."""
    cause = no_room_error(err)
    if cause is None:
        return err
    try:
        free = f"{shutil.disk_usage(path.parent).free / 2**20:.1f} MiB free on {path.parent}"
    except OSError:
        free = f"free space on {path.parent} unknown"
    full = DiskFullError(
        f"{path}: not written, {_NO_ROOM[cause.errno]} ({free}); any previous file is unchanged: "
        "free some space (or write elsewhere) and run again"
    )
    full.errno = cause.errno
    return full


def refuse_link(path: str | os.PathLike[str]) -> None:
    """:class:`NotRegularFileError` when ``path`` exists as anything but a regular file: a symbolic
    link (named with where it points: a write would land outside the folder), a FIFO, a folder...
    Nothing at ``path`` is fine."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    if stat.S_ISLNK(st.st_mode):
        try:
            target = os.readlink(path)
        except OSError:
            target = "?"
        raise NotRegularFileError(
            f"{path}: a symbolic link (to {target}), not a regular file; detloader does not write through links: "
            "remove the link (the file it points to is untouched) or write elsewhere"
        )
    kind = file_kind(st.st_mode)
    if kind is not None:
        raise NotRegularFileError(f"{path}: {kind}, not a regular file; remove it or write elsewhere")


@contextmanager
def atomic_write(
    path: str | os.PathLike[str], mode: str = "wb", *, durable: bool = False, no_follow: bool = False
) -> Iterator[IO[Any]]:
    """A file object writing to a temporary file beside ``path``, renamed over ``path`` when
    the block ends without error (readers never see half a file), removed otherwise; a full
    disk raises :class:`DiskFullError`. The file gets ``open()``'s mode (``0666 & ~umask``),
    so the group that reads the dataset reads it too. A FIFO, socket, device or folder at
    ``path`` is never replaced: :class:`NotRegularFileError` (:func:`refuse_special`). The
    rename replaces a link at ``path`` itself, never the file it points to.

    ``durable``: the file's data reaches the disk before the rename, and the rename before the
    return (``fsync`` of the file, then of its folder, as SQLite and git do): after a crash
    ``path`` is the old file or the new one, whole. ``no_follow``: refuse (:func:`refuse_link`)
    a link or any other non-regular file at ``path``, before writing and again before the rename."""
    path, tmp = Path(path), None
    refuse_special(path)
    try:
        if no_follow:
            refuse_link(path)
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
        with os.fdopen(fd, mode, encoding=None if "b" in mode else "utf-8") as fh:
            os.fchmod(fd, 0o666 & ~_umask())  # mkstemp's 0600 would hide the file from the group
            yield fh
            if durable:
                fh.flush()
                os.fsync(fd)
        if no_follow:
            refuse_link(path)
        os.replace(tmp, path)
        tmp = None
        if durable:
            _fsync_dir(path.parent)
    except BaseException as err:
        if tmp is not None and os.path.lexists(tmp):
            os.unlink(tmp)
        named = _disk_full(err, path) if isinstance(err, Exception) else err  # torch.save wraps an OSError
        if named is not err:
            raise named from err
        raise


def _fsync_dir(folder: Path) -> None:
    """Make a rename in ``folder`` durable (where the system lets a folder be opened)."""
    try:
        fd = os.open(folder, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:  # some file systems refuse fsync on a folder: the rename stands anyway
        pass
    finally:
        os.close(fd)


def write_file(
    path: str | os.PathLike[str], data: str | bytes, *, durable: bool = False, no_follow: bool = False
) -> None:
    """Write ``data`` (text as UTF-8) to ``path`` with :func:`atomic_write` (same keywords)."""
    with atomic_write(path, "wb", durable=durable, no_follow=no_follow) as fh:
        fh.write(data.encode("utf-8") if isinstance(data, str) else data)


def _umask() -> int:
    try:
        with open("/proc/self/status", encoding="ascii") as fh:
            for line in fh:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    mask = os.umask(0o022)  # no /proc: the classic read-and-restore
    os.umask(mask)
    return mask


def find_child_dir(parent: Path, names: Iterable[str]) -> Path | None:
    """The first child folder of ``parent`` whose name matches one of ``names``, ignoring case."""
    try:
        children = {p.name.lower(): p for p in parent.iterdir() if p.is_dir()}
    except OSError:
        return None
    return next((children[name.lower()] for name in names if name.lower() in children), None)
