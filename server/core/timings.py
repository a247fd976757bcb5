"""A request's stage timings: TEI's timing headers and the spans of its trace."""

from __future__ import annotations

import time
from dataclasses import dataclass, field


@dataclass
class Timings:
    """TEI's timing headers, in milliseconds; and when each stage ended (perf_counter), for traces."""

    started: float = field(default_factory=time.perf_counter)
    wall_ns: int = field(default_factory=time.time_ns)  # `started` on the clock spans are stamped with
    tokenization_ms: float = 0.0
    queue_ms: float = 0.0
    inference_ms: float = 0.0
    arrived: float | None = None  # the body read
    submitted: float | None = None  # prepared: sent to the engine
    answered: float | None = None  # rendered
    cache: str | None = None  # how the result cache answered: hit, miss or partial (None: the cache is off)

    def stages(self) -> list[tuple[str, int, int]]:
        """(name, start, end) in ns since the epoch, for the stages the request went through."""

        def ns(at: float) -> int:
            return self.wall_ns + int((at - self.started) * 1e9)

        if self.arrived is None:
            return []
        stages = [("read body", ns(self.started), ns(self.arrived))]
        if self.submitted is None:
            return stages
        queued = self.submitted + self.queue_ms / 1000
        inferred = queued + self.inference_ms / 1000
        stages.append(("tokenize", ns(self.arrived), ns(self.submitted)))
        if self.answered is not None:
            stages.append(("queue", ns(self.submitted), ns(queued)))
            stages.append(("inference", ns(queued), ns(inferred)))
            stages.append(("render", ns(inferred), ns(max(self.answered, inferred))))
        return stages

    def headers(self) -> dict[str, str]:
        total = (time.perf_counter() - self.started) * 1000
        return {
            "x-total-time": f"{total:.0f}",
            "x-tokenization-time": f"{self.tokenization_ms:.0f}",
            "x-queue-time": f"{self.queue_ms:.0f}",
            "x-inference-time": f"{self.inference_ms:.0f}",
        } | ({"x-cache": self.cache} if self.cache else {})
