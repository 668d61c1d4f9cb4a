"""RICOCHET_PROCESSES=auto: the CPUs this process may use, from its affinity and cgroup quotas."""

from pathlib import Path

import pytest
from ricochet.processes.cpus import (
    cgroup1_quota,
    cgroup2_quota,
    cgroup_paths,
    cgroup_quotas,
    cpus_available,
    process_count,
    usable_cpus,
)


@pytest.mark.parametrize(
    ("affinity", "quotas", "expected"),
    [
        (64, [], 64),  # no quota: every CPU of the affinity mask
        (64, [2.0], 2),  # a container limited to 2 CPUs on a 64-core host
        (64, [1.5], 2),  # a quota of 1.5 CPUs is used whole by 2 busy processes
        (64, [0.2], 1),  # never fewer than one process
        (4, [8.0], 4),  # a quota above the mask: the mask
        (64, [8.0, 3.0], 3),  # nested cgroups: the smallest quota is the one in force
        (1, [], 1),
    ],
)
def test_usable_cpus(affinity: int, quotas: list[float], expected: int) -> None:
    """The affinity mask, capped by the smallest quota rounded up, and at least 1."""
    assert usable_cpus(affinity, quotas) == expected


@pytest.mark.parametrize(
    ("cpu_max", "expected"),
    [
        ("max 100000\n", None),
        ("200000 100000\n", 2.0),
        ("150000 100000", 1.5),
        ("50000 100000", 0.5),
    ],
)
def test_cgroup2_quota(cpu_max: str, expected: float | None) -> None:
    """cgroup v2's cpu.max: "max" is no quota, else quota over period."""
    assert cgroup2_quota(cpu_max) == expected


@pytest.mark.parametrize(
    ("quota", "period", "expected"),
    [("-1\n", "100000\n", None), ("400000\n", "100000\n", 4.0), ("50000", "100000", 0.5)],
)
def test_cgroup1_quota(quota: str, period: str, expected: float | None) -> None:
    """cgroup v1's cfs quota: -1 is no quota, else quota over period."""
    assert cgroup1_quota(quota, period) == expected


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("0::/system.slice/app.service\n", ("/system.slice/app.service", None)),
        ("12:cpu,cpuacct:/docker/abc\n1:name=systemd:/docker/abc\n", (None, "/docker/abc")),
        ("4:memory:/x\n2:cpuacct:/\n1:cpu:/k8s/pod\n0::/\n", ("/", "/k8s/pod")),
        ("", (None, None)),
    ],
)
def test_cgroup_paths(text: str, expected: tuple[str | None, str | None]) -> None:
    """The v2 path (hierarchy 0, no controllers) and the v1 cpu controller's path."""
    assert cgroup_paths(text) == expected


def test_quotas_read_from_a_cgroup_tree(tmp_path: Path) -> None:
    """Every quota on the way up from the process's cgroup counts; "max" levels add none. Read
    from the machine's own /proc/self/cgroup, so the tree is laid out under both of its paths."""
    v2, v1 = cgroup_paths(Path("/proc/self/cgroup").read_text())
    (tmp_path / "cgroup.controllers").write_text("cpu\n")
    (tmp_path / "cpu.max").write_text("max 100000\n")
    if v2 is not None:
        own = tmp_path / v2.lstrip("/")
        own.mkdir(parents=True, exist_ok=True)
        (own / "cpu.max").write_text("300000 100000\n")
    mount = tmp_path / "cpu"
    if v1 is not None:
        own = mount / v1.lstrip("/")
        own.mkdir(parents=True, exist_ok=True)
        (own / "cpu.cfs_quota_us").write_text("150000\n")
        (own / "cpu.cfs_period_us").write_text("100000\n")
    expected = ([3.0] if v2 is not None else []) + ([1.5] if v1 is not None else [])
    assert sorted(cgroup_quotas(tmp_path)) == sorted(expected)


def test_auto_is_what_this_process_may_use() -> None:
    """auto: a number of processes between 1 and the CPUs of the affinity mask; a number as
    given."""
    import os

    assert 1 <= process_count("auto") == cpus_available() <= len(os.sched_getaffinity(0))
    assert process_count(3) == 3
