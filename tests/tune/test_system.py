"""Machine facts: cgroup v1/v2 discovery and limits from fixture trees, busy-CPU arithmetic."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from detloader import _system
from detloader._system import cgroups

GIB = 2**30


def _write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def _proc(tmp_path: Path, cgroup: str, mountinfo: str) -> str:
    proc = tmp_path / "proc" / "self"
    _write(proc / "cgroup", cgroup)
    _write(proc / "mountinfo", mountinfo)
    return str(proc)


@pytest.fixture
def cgroup_v2(tmp_path: Path) -> str:
    """A cgroup v2 host: the job's cgroup is /user.slice/job.scope under /sys/fs/cgroup.

    cpu.max: 1.5 CPUs on the job, 4 CPUs on its parent (the smaller wins);
    memory.max: unlimited on the job, 1 GiB on the parent (the parent's limit applies).
    """
    mount = tmp_path / "cg2"
    leaf = mount / "user.slice" / "job.scope"
    _write(leaf / "cpu.max", "150000 100000\n")
    _write(leaf.parent / "cpu.max", "400000 100000\n")
    _write(leaf / "memory.max", "max\n")
    _write(leaf.parent / "memory.max", f"{GIB}\n")
    _write(leaf / "memory.current", "123456789\n")
    mountinfo = (
        "22 1 0:21 / /proc rw,nosuid - proc proc rw\n"
        f"30 23 0:26 / {mount} rw,nosuid,nodev,noexec,relatime shared:4 - cgroup2 cgroup2 rw,nsdelegate\n"
    )
    return _proc(tmp_path, "0::/user.slice/job.scope\n", mountinfo)


@pytest.fixture
def cgroup_v1(tmp_path: Path) -> str:
    """A cgroup v1 container seen from the host: cpu,cpuacct and memory hierarchies, the
    process in /docker/abc. CFS quota 2 CPUs; memory unlimited on the leaf (v1's 2**63-4096),
    2 GiB on /docker."""
    cpu = tmp_path / "cg1" / "cpu,cpuacct"
    mem = tmp_path / "cg1" / "memory"
    _write(cpu / "docker" / "abc" / "cpu.cfs_quota_us", "200000\n")
    _write(cpu / "docker" / "abc" / "cpu.cfs_period_us", "100000\n")
    _write(cpu / "docker" / "cpu.cfs_quota_us", "-1\n")
    _write(cpu / "docker" / "cpu.cfs_period_us", "100000\n")
    _write(mem / "docker" / "abc" / "memory.limit_in_bytes", "9223372036854771712\n")
    _write(mem / "docker" / "memory.limit_in_bytes", f"{2 * GIB}\n")
    _write(mem / "docker" / "abc" / "memory.usage_in_bytes", "5000\n")
    cgroup = (
        "12:pids:/docker/abc\n"
        "4:memory:/docker/abc\n"
        "3:cpu,cpuacct:/docker/abc\n"
        "1:name=systemd:/docker/abc\n"
        "0::/docker/abc\n"
    )
    mountinfo = (
        f"32 31 0:29 / {cpu} rw,relatime shared:9 - cgroup cgroup rw,cpu,cpuacct\n"
        f"35 31 0:32 / {mem} rw,relatime shared:12 - cgroup cgroup rw,memory\n"
        f"40 31 0:37 / {tmp_path / 'cg1' / 'systemd'} rw,relatime - cgroup cgroup rw,xattr,name=systemd\n"
    )
    return _proc(tmp_path, cgroup, mountinfo)


def test_cgroup_v2_limits_walk_up_to_the_mount(cgroup_v2: str) -> None:
    assert _system.cgroup_cpu_limit(proc_self=cgroup_v2) == 1.5
    assert _system.cgroup_memory_limit(proc_self=cgroup_v2) == GIB
    assert _system.cgroup_memory_usage(proc_self=cgroup_v2) == 123456789


def test_cgroup_v1_limits(cgroup_v1: str) -> None:
    assert _system.cgroup_cpu_limit(proc_self=cgroup_v1) == 2.0
    assert _system.cgroup_memory_limit(proc_self=cgroup_v1) == 2 * GIB
    assert _system.cgroup_memory_usage(proc_self=cgroup_v1) == 5000


def test_cgroup_v1_chain_starts_at_the_leaf(cgroup_v1: str, tmp_path: Path) -> None:
    proc = Path(cgroup_v1)
    version, chain = cgroups.cgroup_chain("memory", (proc / "cgroup").read_text(), (proc / "mountinfo").read_text())
    mem = tmp_path / "cg1" / "memory"
    assert version == 1
    assert chain == [mem / "docker" / "abc", mem / "docker", mem]


def test_namespaced_container_sees_its_cgroup_at_the_mount_point(tmp_path: Path) -> None:
    # cgroup namespace: /proc/self/cgroup says "/", the mount root is "/" -> the mount point
    mount = tmp_path / "fs" / "cgroup"
    _write(mount / "cpu.max", "50000 100000\n")
    _write(mount / "memory.max", "536870912\n")
    proc = _proc(tmp_path, "0::/\n", f"1 0 0:1 / {mount} rw - cgroup2 cgroup2 rw\n")
    assert _system.cgroup_cpu_limit(proc_self=proc) == 0.5
    assert _system.cgroup_memory_limit(proc_self=proc) == 536870912


def test_bind_mounted_subtree_maps_to_the_mount_point(tmp_path: Path) -> None:
    # without a namespace, docker bind-mounts the container's own cgroup: root = its path
    mount = tmp_path / "memory"
    _write(mount / "memory.limit_in_bytes", f"{3 * GIB}\n")
    proc = _proc(tmp_path, "4:memory:/docker/abc\n", f"35 31 0:32 /docker/abc {mount} rw - cgroup cgroup rw,memory\n")
    assert _system.cgroup_memory_limit(proc_self=proc) == 3 * GIB


def test_mount_point_with_a_space_is_unescaped(tmp_path: Path) -> None:
    mount = tmp_path / "my cgroup"
    _write(mount / "cpu.max", "300000 100000\n")
    escaped = str(mount).replace(" ", "\\040")
    proc = _proc(tmp_path, "0::/\n", f"1 0 0:1 / {escaped} rw - cgroup2 cgroup2 rw\n")
    assert _system.cgroup_cpu_limit(proc_self=proc) == 3.0


def test_no_cgroup_files_means_no_limit(tmp_path: Path) -> None:
    proc = _proc(tmp_path, "0::/\n", f"1 0 0:1 / {tmp_path / 'empty'} rw - cgroup2 cgroup2 rw\n")
    assert _system.cgroup_cpu_limit(proc_self=proc) is None
    assert _system.cgroup_memory_limit(proc_self=proc) is None
    assert _system.cgroup_memory_usage(proc_self=proc) is None


def test_explicit_root_reads_v2_then_v1_layout(tmp_path: Path) -> None:
    v2 = tmp_path / "v2"
    _write(v2 / "cpu.max", "max 100000\n")
    _write(v2 / "memory.max", "max\n")
    assert _system.cgroup_cpu_limit(str(v2)) is None
    assert _system.cgroup_memory_limit(str(v2)) is None
    v1 = tmp_path / "v1"
    _write(v1 / "cpu" / "cpu.cfs_quota_us", "250000")
    _write(v1 / "cpu" / "cpu.cfs_period_us", "100000")
    _write(v1 / "memory" / "memory.limit_in_bytes", "1048576")
    assert _system.cgroup_cpu_limit(str(v1)) == 2.5
    assert _system.cgroup_memory_limit(str(v1)) == 1048576


@pytest.mark.parametrize(
    ("text", "expected"),
    [("max", None), ("9223372036854771712", None), ("0", None), ("junk", None), ("1073741824\n", GIB)],
)
def test_parse_memory_limit(text: str, expected: int | None) -> None:
    assert cgroups.parse_memory_limit(text) == expected


def test_parse_proc_cgroup_splits_controllers() -> None:
    paths = cgroups.parse_proc_cgroup("3:cpu,cpuacct:/a\n0::/b\nbroken line\n")
    assert paths == {"cpu": "/a", "cpuacct": "/a", "": "/b"}


# per-CPU (busy, total) seconds: over the window cpu0 is fully busy, cpu1 busy 25 of 100
BEFORE = {0: (150.0, 650.0), 1: (150.0, 650.0)}
AFTER = {0: (250.0, 750.0), 1: (175.0, 750.0)}


def test_busy_from_cpu_samples() -> None:
    assert _system.busy_from_samples(BEFORE, AFTER, own_cpu_s=0.0, wall_s=1.0) == pytest.approx(1.25)
    # our own process took 0.5 CPU: the others kept 0.75 busy
    assert _system.busy_from_samples(BEFORE, AFTER, own_cpu_s=0.5, wall_s=1.0) == pytest.approx(0.75)
    # only CPU 1 is in our affinity set
    assert _system.busy_from_samples(BEFORE, AFTER, 0.0, 1.0, cpus=[1]) == pytest.approx(0.25)
    # never negative
    assert _system.busy_from_samples(BEFORE, AFTER, own_cpu_s=5.0, wall_s=1.0) == 0.0


def test_cpu_sample_counts_every_cpu() -> None:
    sample = _system.cpu_sample()
    assert len(sample) == _system.logical_cores()
    assert all(0.0 <= busy <= total for busy, total in sample.values())


@given(
    st.lists(st.tuples(st.integers(0, 10**6), st.integers(0, 10**6), st.integers(0, 10**6)), min_size=1, max_size=8),
    st.floats(0, 8),
)
def test_busy_is_between_zero_and_the_cpu_count(deltas: list[tuple[int, int, int]], own: float) -> None:
    before = {i: (0.0, 0.0) for i in range(len(deltas))}
    after = {i: (float(b), float(b + idle)) for i, (b, idle, _) in enumerate(deltas)}
    busy = _system.busy_from_samples(before, after, own_cpu_s=own, wall_s=1.0)
    assert 0.0 <= busy <= len(deltas)


def test_live_machine_facts_are_consistent() -> None:
    assert 1 <= _system.usable_cpus() <= _system.affinity_cpus() <= _system.logical_cores()
    physical = _system.physical_cores()
    assert physical is None or 1 <= physical <= _system.logical_cores()
    mem = _system.memory_facts()
    assert 0 < mem.available <= mem.total or mem.cgroup_limit is not None
    busy = _system.busy_cpus(0.05)
    assert 0.0 <= busy <= _system.affinity_cpus()
