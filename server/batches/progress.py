"""RunningJob — the running Batch API job's progress as /status, /health/startup and the status page
show it: lines answered of its total, its rate since this server took it up, and the time left at that rate."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any


@dataclass
class RunningJob:
    batch_id: str
    total: int
    done: int  # lines answered (output or error line), by earlier runs of the job too
    failed: int
    started: float = field(default_factory=time.monotonic)

    def __post_init__(self) -> None:
        self.done_at_start = self.done  # a resumed job's earlier lines are not this run's rate

    def advance(self, completed: int, failed: int) -> None:
        self.done += completed + failed
        self.failed += failed

    def as_dict(self, now: float | None = None) -> dict[str, Any]:
        elapsed = (time.monotonic() if now is None else now) - self.started
        rate = (self.done - self.done_at_start) / elapsed if elapsed > 0 else 0.0
        left = self.total - self.done
        return {
            "id": self.batch_id,
            "total": self.total,
            "done": self.done,
            "failed": self.failed,
            "lines_per_s": round(rate, 3),
            "eta_s": round(left / rate, 1) if rate > 0 else None,
        }
