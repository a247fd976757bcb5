"""Memory really available to this process: the host's MemAvailable, capped by a cgroup v1/v2 limit."""

from __future__ import annotations

from pathlib import Path

_CGROUP_V2 = (Path("/sys/fs/cgroup/memory.max"), Path("/sys/fs/cgroup/memory.current"))
_CGROUP_V1 = (
    Path("/sys/fs/cgroup/memory/memory.limit_in_bytes"),
    Path("/sys/fs/cgroup/memory/memory.usage_in_bytes"),
)
_UNLIMITED = 1 << 60


def available_bytes() -> int | None:
    """None when nothing can be read (then no guard applies)."""
    candidates = [v for v in (_meminfo("MemAvailable"), _cgroup_headroom()) if v is not None]
    return min(candidates) if candidates else None


def _meminfo(key: str) -> int | None:
    """A /proc/meminfo line's value in bytes; None where it cannot be read."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith(f"{key}:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def _cgroup_headroom() -> int | None:
    for limit_file, usage_file in (_CGROUP_V2, _CGROUP_V1):
        try:
            raw = limit_file.read_text().strip()
            usage = int(usage_file.read_text().strip())
        except (OSError, ValueError):
            continue
        if raw == "max" or int(raw) >= _UNLIMITED:
            return None
        return max(int(raw) - usage, 0)
    return None


def limit_bytes() -> int | None:
    """The memory this process may use at most: its cgroup's limit, else the host's MemTotal (what
    a WARMPOOL_MEMORY_BUDGET of `80%` is a share of); None when neither can be read."""
    for limit_file, _ in (_CGROUP_V2, _CGROUP_V1):
        try:
            raw = limit_file.read_text().strip()
        except OSError:
            continue
        if raw != "max" and raw.isdigit() and int(raw) < _UNLIMITED:
            return int(raw)
        break
    return _meminfo("MemTotal")
