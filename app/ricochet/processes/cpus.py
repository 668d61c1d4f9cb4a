"""How many CPUs this process may use (RICOCHET_PROCESSES=auto): its affinity, capped by the CPU
quota of its cgroup (a container limited to 2 CPUs on a 64-core host gets 2)."""

import math
import os
from pathlib import Path
from typing import Literal

CGROUP_ROOT = Path("/sys/fs/cgroup")


def usable_cpus(affinity: int, quotas: list[float]) -> int:
    """The CPUs of the affinity mask, no more than the smallest quota (in CPUs) rounded up: a
    quota of 1.5 CPUs is used whole by 2 busy processes, and never less than 1."""
    limit = math.ceil(min(quotas)) if quotas else affinity
    return max(1, min(affinity, limit))


def cgroup2_quota(cpu_max: str) -> float | None:
    """A cgroup v2 `cpu.max` ("200000 100000": 2 CPUs; "max 100000": no quota) in CPUs."""
    quota, _, period = cpu_max.strip().partition(" ")
    if quota == "max" or not period:
        return None
    return int(quota) / int(period)


def cgroup1_quota(cfs_quota_us: str, cfs_period_us: str) -> float | None:
    """cgroup v1's `cpu.cfs_quota_us` (-1: no quota) over `cpu.cfs_period_us`, in CPUs."""
    quota, period = int(cfs_quota_us), int(cfs_period_us)
    if quota <= 0 or period <= 0:
        return None
    return quota / period


def cgroup_paths(proc_self_cgroup: str) -> tuple[str | None, str | None]:
    """The process's cgroup v2 path and cgroup v1 cpu controller path, from /proc/self/cgroup
    (lines `0::/path` and `N:cpu,cpuacct:/path`), each None when absent."""
    v2 = v1 = None
    for line in proc_self_cgroup.splitlines():
        hierarchy, _, rest = line.partition(":")
        controllers, _, path = rest.partition(":")
        if hierarchy == "0" and not controllers:
            v2 = path
        elif "cpu" in controllers.split(","):
            v1 = path
    return v2, v1


def _levels(mount: Path, path: str | None) -> list[Path]:
    """The cgroup's folder and each folder above it up to the mount (the quota in force is the
    smallest of theirs); inside a container the path the kernel shows may not exist below the
    mount, and then only the mount's own folder counts."""
    here = mount / (path or "/").lstrip("/")
    levels = [here, *here.parents] if here.is_dir() else [mount]
    return [level for level in levels if level.is_relative_to(mount)]


def _read(path: Path) -> str | None:
    try:
        return path.read_text()
    except OSError:
        return None


def cgroup_quotas(root: Path = CGROUP_ROOT) -> list[float]:
    """Every CPU quota set on this process's cgroup and the cgroups above it, in CPUs."""
    text = _read(Path("/proc/self/cgroup")) or ""
    v2, v1 = cgroup_paths(text)
    quotas: list[float | None] = []
    if v2 is not None and (root / "cgroup.controllers").exists():
        for level in _levels(root, v2):
            cpu_max = _read(level / "cpu.max")
            quotas.append(cgroup2_quota(cpu_max) if cpu_max else None)
    if v1 is not None:
        mount = next((m for m in (root / "cpu", root / "cpu,cpuacct") if m.is_dir()), None)
        for level in _levels(mount, v1) if mount else []:
            quota, period = _read(level / "cpu.cfs_quota_us"), _read(level / "cpu.cfs_period_us")
            quotas.append(cgroup1_quota(quota, period) if quota and period else None)
    return [q for q in quotas if q is not None]


def cpus_available() -> int:
    """The CPUs this process may use: its affinity, capped by its cgroup's CPU quota."""
    return usable_cpus(len(os.sched_getaffinity(0)), cgroup_quotas())


def process_count(setting: int | Literal["auto"]) -> int:
    """RICOCHET_PROCESSES as a number of processes."""
    return cpus_available() if setting == "auto" else setting
