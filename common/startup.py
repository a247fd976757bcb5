"""StartupState: the startup phase records /health/* reads, and one log event per transition."""

from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import structlog

PHASES = ("bind", "prefetch", "forkserver", "engine", "warmup", "ready")
State = Literal["pending", "running", "done", "skipped", "failed"]

log = structlog.get_logger("warmpool.phases")


def _process_age() -> float:
    """Seconds this process has existed, so phase times count from exec, not from this import."""
    try:
        start_ticks = int(Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()[19])
        boot_uptime = float(Path("/proc/uptime").read_text().split()[0])
        return max(boot_uptime - start_ticks / os.sysconf("SC_CLK_TCK"), 0.0)
    except (OSError, ValueError, IndexError):
        return 0.0


_T0 = time.monotonic() - _process_age()


def uptime() -> float:
    """Seconds since this process started importing warmpool (≈ process start)."""
    return time.monotonic() - _T0


@dataclass
class Phase:
    name: str
    state: State = "pending"
    started_s: float | None = None
    duration_s: float | None = None
    detail: dict[str, Any] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        duration = self.duration_s
        if self.state == "running" and self.started_s is not None:
            duration = uptime() - self.started_s
        return {
            "name": self.name,
            "state": self.state,
            "started_s": _round(self.started_s),
            "duration_s": _round(duration),
            "detail": dict(self.detail),
        }


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 4)


class StartupState:
    """Thread-safe phase table; startup threads write it, HTTP handlers read it."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._phases = {name: Phase(name) for name in PHASES}
        self.draining = False
        self.engine_up = False

    def start(self, name: str, **detail: Any) -> None:
        self._move(name, "running", detail, start=True)

    def update(self, name: str, **detail: Any) -> None:
        with self._lock:
            if self._phases[name].state != "failed":
                self._phases[name].detail.update(detail)

    def done(self, name: str, **detail: Any) -> None:
        self._move(name, "done", detail)

    def skip(self, name: str, reason: str, **detail: Any) -> None:
        """A phase that will not run (or stops running): a running one keeps its start time."""
        self._move(name, "skipped", {"reason": reason, **detail})

    def fail(self, name: str, error: str, **detail: Any) -> None:
        """`name` failed; every phase still pending or running is skipped: the start stops here."""
        self._move(name, "failed", {"error": error, **detail})
        with self._lock:
            rest = [p.name for p in self._phases.values() if p.state in ("pending", "running")]
        for other in rest:
            self.skip(other, f"start failed in phase '{name}'")

    def _move(self, name: str, state: State, detail: dict[str, Any], start: bool = False) -> None:
        now = uptime()
        with self._lock:
            phase = self._phases[name]
            if phase.state == "failed":  # a failed phase stays failed, whatever runs on after it
                return
            if start or phase.started_s is None:
                phase.started_s = now
            phase.state = state
            phase.detail.update(detail)
            phase.duration_s = None if state == "running" else now - phase.started_s
            record = phase.as_dict()
        event = log.error if state == "failed" else log.info
        event(
            "phase",
            phase=name,
            state=state,
            started_s=record["started_s"],
            duration_s=record["duration_s"],
            **record["detail"],
        )

    def state(self, name: str) -> State:
        with self._lock:
            return self._phases[name].state

    @property
    def failed(self) -> bool:
        with self._lock:
            return any(p.state == "failed" for p in self._phases.values())

    @property
    def started(self) -> bool:
        return self.state("ready") == "done"

    @property
    def serving(self) -> bool:
        """An engine can take work now, and we are neither draining nor failed (a spent restart
        budget fails the engine phase while another engine may still be up: the process is about
        to exit, so readiness turns 503 at once)."""
        return self.started and self.engine_up and not self.draining and not self.failed

    def status(self) -> str:
        if self.failed:
            return "failed"
        if self.draining:
            return "draining"
        if not self.started:
            return "starting"
        return "ready" if self.engine_up else "recovering"

    def current(self) -> str | None:
        """The phase a client waiting for readiness is held up by."""
        with self._lock:
            for phase in self._phases.values():
                if phase.state in ("running", "failed"):
                    return phase.name
            pending = [p.name for p in self._phases.values() if p.state == "pending"]
        return pending[0] if pending else None

    def summary(self) -> str:
        """One line for people: 'ready in 2.1 s: bind 0.0 s, prefetch 0.1 s, ...' (phases that ran)."""
        with self._lock:
            ran = [p for p in self._phases.values() if p.duration_s is not None and p.state == "done"]
            parts = ", ".join(f"{p.name} {p.duration_s:.2f} s" for p in ran if p.name != "ready")
        return f"ready in {uptime():.2f} s: {parts}"

    def snapshot(self) -> dict[str, Any]:
        with self._lock:
            phases = [p.as_dict() for p in self._phases.values()]
        return {"status": self.status(), "uptime_s": round(uptime(), 4), "phases": phases}
