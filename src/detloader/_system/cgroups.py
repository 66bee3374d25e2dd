"""cgroups: where this process's cgroup is, and the CPU quota and memory limit set on it.

A limit on any ancestor cgroup applies too, so limits are read at every level from the process's
cgroup up to the mount point and the smallest wins (docs/tuning.md, "What the tuner does").
Parsers take text and are pure; readers take the folders to read, so tests point them at fixtures.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

#: Memory limits at or above this are cgroup v1's way of saying "unlimited" (2**63 - page size).
_UNLIMITED_BYTES = 1 << 60


# -- discovery ---------------------------------------------------------------------------------
@dataclass(frozen=True)
class CgroupMount:
    """One cgroup file system mount: ``root`` is the cgroup path the mount point shows (``/`` on
    the host; a container's own cgroup when the mount binds a sub-tree), ``controllers`` the v1
    controllers of the hierarchy (empty for cgroup v2)."""

    mount_point: Path
    root: str
    version: int
    controllers: frozenset[str]


def parse_proc_cgroup(text: str) -> dict[str, str]:
    """``/proc/self/cgroup`` -> {controller: cgroup path}; the v2 hierarchy has the key ``""``.

    ``"4:memory:/a/b"`` gives ``{"memory": "/a/b"}``; ``"3:cpu,cpuacct:/x"`` gives both
    ``cpu`` and ``cpuacct``; ``"0::/user.slice"`` gives ``{"": "/user.slice"}``; named
    hierarchies (``name=systemd``) are kept under their name.
    """
    out: dict[str, str] = {}
    for line in text.splitlines():
        parts = line.strip().split(":", 2)
        if len(parts) != 3:
            continue
        _, controllers, path = parts
        if not controllers:
            out[""] = path
        for name in controllers.split(","):
            if name:
                out[name] = path
    return out


def _unescape(field: str) -> str:
    # mountinfo escapes space, tab, newline and backslash as \ooo octal
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), field)


def parse_mountinfo(text: str) -> list[CgroupMount]:
    """The cgroup (v1) and cgroup2 mounts listed in a ``/proc/self/mountinfo`` text.

    Line layout: ``id parent major:minor root mount_point options [optional...] - fstype
    source super_options``; v1 controllers are among the super options.
    """
    mounts: list[CgroupMount] = []
    for line in text.splitlines():
        fields = line.split()
        if "-" not in fields:
            continue
        sep = fields.index("-")
        if sep < 5 or len(fields) < sep + 3:
            continue
        fstype, super_options = fields[sep + 1], fields[sep + 3] if len(fields) > sep + 3 else ""
        if fstype not in ("cgroup", "cgroup2"):
            continue
        root, mount_point = _unescape(fields[3]), _unescape(fields[4])
        if fstype == "cgroup2":
            mounts.append(CgroupMount(Path(mount_point), root, 2, frozenset()))
        else:
            opts = frozenset(o for o in super_options.split(",") if o and "=" not in o)
            named = frozenset(o for o in super_options.split(",") if o.startswith("name="))
            mounts.append(CgroupMount(Path(mount_point), root, 1, opts | named))
    return mounts


def cgroup_chain(controller: str, proc_cgroup: str, mountinfo: str) -> tuple[int, list[Path]]:
    """Folders of this process's cgroup for ``controller``, leaf first, up to the mount point.

    Returns ``(version, folders)``; cgroup v1 is preferred when the controller is mounted
    there (hybrid systems mount controllers on v1 and leave v2 empty), else v2. ``folders`` is
    empty when the controller is not found. The cgroup path is taken relative to the mount's
    root; when it is not below it (a cgroup namespace shows ``/``) the mount point is the leaf.
    """
    paths = parse_proc_cgroup(proc_cgroup)
    mounts = parse_mountinfo(mountinfo)
    v1 = [(1, m, paths[controller]) for m in mounts if m.version == 1 and controller in m.controllers
          and controller in paths]
    v2 = [(2, m, paths[""]) for m in mounts if m.version == 2 and "" in paths]
    if not v1 + v2:
        return 0, []
    version, mount, path = (v1 + v2)[0]
    root = mount.root.rstrip("/")
    rel = path[len(root):] if not root or path == root or path.startswith(root + "/") else ""
    parts = [p for p in rel.split("/") if p and p not in (".", "..")]
    chain = [mount.mount_point.joinpath(*parts[:i]) for i in range(len(parts), -1, -1)]
    return version, chain


def read_text(path: Path | str) -> str | None:
    """A small file's text (``/proc``, ``/sys``), or None when it cannot be read."""
    try:
        with open(path) as fh:
            return fh.read()
    except OSError:
        return None


def proc_chain(controller: str, proc_self: Path | str) -> tuple[int, list[Path]]:
    """:func:`cgroup_chain` for the process whose ``/proc/<pid>`` folder is ``proc_self``."""
    cgroup = read_text(Path(proc_self) / "cgroup")
    mountinfo = read_text(Path(proc_self) / "mountinfo")
    if cgroup is None or mountinfo is None:
        return 0, []
    return cgroup_chain(controller, cgroup, mountinfo)


# -- limits ----------------------------------------------------------------------------------
def parse_cpu_max(text: str) -> float | None:
    """cgroup v2 ``cpu.max`` ("QUOTA PERIOD" or "max PERIOD") -> CPUs, or None for
    ``max``/unparseable."""
    parts = text.split()
    try:
        quota, period = int(parts[0]), int(parts[1]) if len(parts) > 1 else 100_000
    except (ValueError, IndexError):
        return None
    return quota / period if quota > 0 and period > 0 else None


def parse_memory_limit(text: str) -> int | None:
    """cgroup ``memory.max`` (v2) or ``memory.limit_in_bytes`` (v1) -> bytes, None if unlimited."""
    try:
        n = int(text.strip())
    except ValueError:
        return None
    return n if 0 < n < _UNLIMITED_BYTES else None


def _cpu_at(folder: Path, v1: bool) -> float | None:
    if not v1:
        text = read_text(folder / "cpu.max")
        return parse_cpu_max(text) if text is not None else None
    quota, period = read_text(folder / "cpu.cfs_quota_us"), read_text(folder / "cpu.cfs_period_us")
    # v1's quota (-1: none) and period, read as v2's "QUOTA PERIOD"
    return parse_cpu_max(f"{quota} {period}") if quota is not None and period is not None else None


def _memory_at(folder: Path, v1: bool) -> int | None:
    text = read_text(folder / ("memory.limit_in_bytes" if v1 else "memory.max"))
    return parse_memory_limit(text) if text is not None else None


def _smallest(controller: str, read: Callable[[Path, bool], float | None], cgroup_root: str | None,
              proc_self: str) -> float | None:
    """The smallest limit ``read`` finds from this process's cgroup up to the mount point;
    with ``cgroup_root`` (or when the cgroup is not found: ``/sys/fs/cgroup``) in that folder
    alone, cgroup v2 files in it, else v1 files in its ``controller`` sub-folder."""
    version, chain = proc_chain(controller, proc_self) if cgroup_root is None else (0, [])
    if not chain:
        root = Path(cgroup_root or "/sys/fs/cgroup")
        v2 = read(root, False)
        return v2 if v2 is not None else read(root / controller, True)
    limits = [x for x in (read(folder, version == 1) for folder in chain) if x is not None]
    return min(limits) if limits else None


def cgroup_cpu_limit(cgroup_root: str | None = None, proc_self: str = "/proc/self") -> float | None:
    """CPU quota of this process's cgroup in CPUs (e.g. 1.5), or None when unlimited/unknown.
    ``cgroup_root``: read only that folder, as inside a container whose own cgroup is mounted
    at ``/sys/fs/cgroup``."""
    return _smallest("cpu", _cpu_at, cgroup_root, proc_self)


def cgroup_memory_limit(cgroup_root: str | None = None, proc_self: str = "/proc/self") -> int | None:
    """Memory limit of this process's cgroup in bytes, or None when unlimited/unknown.
    ``cgroup_root``: as for :func:`cgroup_cpu_limit`."""
    limit = _smallest("memory", _memory_at, cgroup_root, proc_self)
    return int(limit) if limit is not None else None


def cgroup_memory_usage(cgroup_root: str | None = None, proc_self: str = "/proc/self") -> int | None:
    """Bytes charged to this process's cgroup (v2 ``memory.current``, v1
    ``memory.usage_in_bytes``), or None when unknown."""
    if cgroup_root is not None:
        root = Path(cgroup_root)
        files = [root / "memory.current", root / "memory" / "memory.usage_in_bytes"]
    else:
        version, chain = proc_chain("memory", proc_self)
        files = [chain[0] / ("memory.current" if version == 2 else "memory.usage_in_bytes")] if chain else []
    for f in files:
        text = read_text(f)
        if text is not None:
            try:
                return int(text.strip())
            except ValueError:
                return None
    return None
