"""CPUs this process may really use: its affinity set, capped by a cgroup CPU quota.

os.cpu_count() is the host's: in a Kubernetes pod limited to 2 CPUs on a 64-core node it says 64,
and an engine running 64 torch threads on 2 CPUs' worth of time is throttled in every period (each
barrier waits on a descheduled thread). A quota of 2.5 CPUs gives 2 threads: a thread more than the
quota pays for is throttled, a thread less costs half a core.
"""

from __future__ import annotations

import os
from pathlib import Path

CGROUP = Path("/sys/fs/cgroup")


def usable_cpus(root: Path = CGROUP) -> int:
    """CPUs in this process's affinity set, at most the cgroup's quota (rounded down, at least 1)."""
    cpus = len(os.sched_getaffinity(0))
    quota = cgroup_quota(root)
    return max(1, min(cpus, int(quota))) if quota is not None else cpus


def cgroup_quota(root: Path = CGROUP) -> float | None:
    """CPUs' worth of time per period the cgroup allows (cgroup v2 cpu.max, else v1's CFS quota);
    None when unlimited or unreadable."""
    for cpu_max in (root / _own_v2_path() / "cpu.max", root / "cpu.max"):
        try:
            quota, period = cpu_max.read_text().split()[:2]
        except (OSError, ValueError):
            continue
        return None if quota == "max" else int(quota) / int(period)
    for folder in (root / "cpu", root / "cpu,cpuacct"):
        try:
            quota_us = int((folder / "cpu.cfs_quota_us").read_text())
            period_us = int((folder / "cpu.cfs_period_us").read_text())
        except (OSError, ValueError):
            continue
        return None if quota_us <= 0 else quota_us / period_us
    return None


def _own_v2_path() -> str:
    """This process's cgroup v2 path ("0::/a/b" in /proc/self/cgroup), relative; "" if none."""
    try:
        for line in Path("/proc/self/cgroup").read_text().splitlines():
            if line.startswith("0::"):
                return line[3:].strip().lstrip("/")
    except OSError:
        pass
    return ""
