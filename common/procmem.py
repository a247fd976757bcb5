"""A process's memory as the kernel accounts it (/proc/PID/smaps_rollup), for the engine phase.

RSS counts every page a process has mapped, shared or not, so N engines mapping one copy of the
weights each show its full size; PSS divides each page by the processes mapping it, so the PSS of
all of them adds up to what they really hold; private pages are what one process holds alone (what
another engine adds). Linux 4.14 or later; None elsewhere or when the process is gone.
"""

from __future__ import annotations

from pathlib import Path

_FIELDS = ("Rss", "Pss", "Shared_Clean", "Shared_Dirty", "Private_Clean", "Private_Dirty")


def smaps_rollup(pid: int) -> dict[str, int] | None:
    """smaps_rollup's totals in kB, by field name; None when it cannot be read."""
    try:
        text = Path(f"/proc/{pid}/smaps_rollup").read_text()
    except OSError:
        return None
    values: dict[str, int] = {}
    for line in text.splitlines():
        name, _, rest = line.partition(":")
        if rest.strip().endswith("kB"):
            values[name] = int(rest.split()[0])
    return values if "Pss" in values else None


def process_memory(pid: int) -> dict[str, float] | None:
    """rss_mb, pss_mb, shared_mb and private_mb of a process (MB of 10^6 bytes)."""
    kb = smaps_rollup(pid)
    if kb is None:
        return None
    got = {name: kb.get(name, 0) for name in _FIELDS}

    def mb(value: int) -> float:
        return round(value * 1024 / 1e6, 1)

    return {
        "rss_mb": mb(got["Rss"]),
        "pss_mb": mb(got["Pss"]),
        "shared_mb": mb(got["Shared_Clean"] + got["Shared_Dirty"]),
        "private_mb": mb(got["Private_Clean"] + got["Private_Dirty"]),
    }


def parent_pid(pid: int) -> int | None:
    """The process's parent (an engine's is the forkserver), from /proc/PID/stat."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return int(stat.rpartition(")")[2].split()[1])
