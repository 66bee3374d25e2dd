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
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0))
    try:
        st = os.fstat(fd)
        kind = file_kind(st.st_mode)
        if kind is not None:
            raise NotRegularFileError(f"{kind}, not a regular file")
        if cap is not None and st.st_size > cap:
            raise FileTooLargeError(f"size={st.st_size} bytes exceeds {cap_name}={cap}")
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def read_capped(path: str | os.PathLike[str], cap: int | None, cap_name: str = "max_file_bytes") -> bytes:
    """The bytes of the regular file ``path`` (:func:`open_regular`), refused by its size
    before anything is read, and by what it holds should it grow meanwhile (None: no cap)."""
    with open_regular(path, cap, cap_name) as fh:
        data = fh.read(-1 if cap is None else cap + 1)
    if cap is not None and len(data) > cap:
        raise FileTooLargeError(f"size>{cap} bytes exceeds {cap_name}={cap}")
    return data


def _disk_full(err: OSError, path: Path) -> OSError:
    """``err``, or for a full disk or quota a :class:`DiskFullError` naming the free space."""
    if err.errno not in (errno.ENOSPC, getattr(errno, "EDQUOT", errno.ENOSPC)):
        return err
    try:
        free = f"{shutil.disk_usage(path.parent).free / 2**20:.1f} MiB free on {path.parent}"
    except OSError:
        free = f"free space on {path.parent} unknown"
    what = "no space left on the device" if err.errno == errno.ENOSPC else "disk quota exceeded"
    full = DiskFullError(f"{path}: not written, {what} ({free}); any previous file is unchanged")
    full.errno = err.errno
    return full


@contextmanager
def atomic_write(path: str | os.PathLike[str], mode: str = "wb") -> Iterator[IO[Any]]:
    """A file object writing to a temporary file beside ``path``, renamed over ``path`` when
    the block ends without error (readers never see half a file), removed otherwise; a full
    disk raises :class:`DiskFullError`. The file gets ``open()``'s mode (``0666 & ~umask``),
    so the group that reads the dataset reads it too. A FIFO, socket, device or folder at
    ``path`` is never replaced: :class:`NotRegularFileError` (:func:`refuse_special`)."""
    path, tmp = Path(path), None
    refuse_special(path)
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
        with os.fdopen(fd, mode, encoding=None if "b" in mode else "utf-8") as fh:
            os.fchmod(fd, 0o666 & ~_umask())  # mkstemp's 0600 would hide the file from the group
            yield fh
        os.replace(tmp, path)
    except BaseException as err:
        if tmp is not None and os.path.exists(tmp):
            os.unlink(tmp)
        named = _disk_full(err, path) if isinstance(err, OSError) else err
        if named is not err:
            raise named from err
        raise


def write_file(path: str | os.PathLike[str], data: str | bytes) -> None:
    """Write ``data`` (text as UTF-8) to ``path`` with :func:`atomic_write`."""
    with atomic_write(path, "wb") as fh:
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
