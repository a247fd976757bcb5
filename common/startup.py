"""StartupState: the startup phase records /health/* reads, and one log event per transition."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import structlog

PHASES = ("bind", "prefetch", "forkserver", "engine", "warmup", "compile", "ready")
SHARED_PHASES = ("bind", "forkserver")  # one for the appliance; with several models, the rest are per model
# compile runs on past ready unless WARMPOOL_COMPILE=required (engine/compiling/compilation.py)
MODEL_PHASES = ("prefetch", "engine", "warmup", "compile", "ready")
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
    model: str | None = None  # the model this phase belongs to, with several models

    def as_dict(self) -> dict[str, Any]:
        duration = self.duration_s
        if self.state == "running" and self.started_s is not None:
            duration = uptime() - self.started_s
        record = {
            "name": self.name,
            "state": self.state,
            "started_s": _round(self.started_s),
            "duration_s": _round(duration),
            "detail": dict(self.detail),
        }
        return record if self.model is None else {**record, "model": self.model}


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 4)


class StartupState:
    """Thread-safe phase table; startup threads write it, HTTP handlers read it.

    With several models (`models`), each has its own prefetch, engine, warmup and ready phases,
    named `engine:NAME`, written through its ModelPhases; `ready` is done once every model is."""

    def __init__(self, models: list[str] | None = None, tolerate_model_failures: bool = False) -> None:
        self._lock = threading.Lock()
        self.models = list(models or [])
        self.tolerate_model_failures = tolerate_model_failures
        if len(self.models) > 1:
            per_model = [Phase(f"{p}:{m}", model=m) for m in self.models for p in MODEL_PHASES]
            names = [Phase("bind"), Phase("forkserver"), *per_model, Phase("ready")]
            self._phases = {phase.name: phase for phase in names}
        else:
            self._phases = {name: Phase(name) for name in PHASES}
        self.draining = False
        self.on_demand: set[str] = set()  # models loaded and unloaded on demand: their failures are their own
        self._up: dict[str, bool] = {}  # per model (the one model: ""), whether an engine can serve
        self._watchers: list[Callable[[dict[str, Any]], None]] = []

    @property
    def engine_up(self) -> bool:
        """Every model that has not failed has an engine that can serve; a model on demand counts
        while it serves alone (while it loads or restarts its requests wait for it: the pod is no
        less ready for them, and its peers serve on)."""
        with self._lock:
            counted = [up for model, up in self._up.items() if up or model not in self.on_demand]
            return bool(counted) and all(counted)

    @engine_up.setter
    def engine_up(self, up: bool) -> None:
        self.set_up("", up)

    def set_up(self, model: str, up: bool) -> None:
        with self._lock:
            self._up[model] = up

    def model_up(self, model: str) -> bool:
        with self._lock:
            return self._up.get(model, False)

    @property
    def any_engine_up(self) -> bool:
        with self._lock:
            return any(self._up.values())

    def for_model(self, model: str) -> ModelPhases:
        """The phases one model's prefetch, supervisor and boot write."""
        return ModelPhases(self, model, len(self.models) > 1)

    def start(self, name: str, at: float | None = None, **detail: Any) -> None:
        """`name` running from now, or from `at` (a time.monotonic() reading: a phase begun before
        this state existed, the forkserver spawned first thing)."""
        self._move(name, "running", detail, start=True, at=at)

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
        """`name` failed; every phase still pending or running is skipped: the start stops here
        (only that model's phases, for a model's phase when model failures are tolerated)."""
        self._move(name, "failed", {"error": error, **detail})
        with self._lock:
            model = self._phases[name].model
            alone = (self.tolerate_model_failures or model in self.on_demand) and model is not None
            if alone:
                self._up.pop(str(model), None)
            rest = [
                p.name
                for p in self._phases.values()
                if p.state in ("pending", "running") and (not alone or p.model == model)
            ]
        for other in rest:
            self.skip(other, f"start failed in phase '{name}'")

    def reset_model(self, model: str, reason: str) -> None:
        """An on-demand model was unloaded (or is about to load again): its phases start over,
        skipped with `reason` until its next load, and it no longer counts for readiness."""
        with self._lock:
            self._up.pop(model, None)
            for phase in self._phases.values():
                if phase.model == model:
                    phase.state, phase.started_s, phase.duration_s = "skipped", None, None
                    phase.detail = {"reason": reason}

    def watch(self, watcher: Callable[[dict[str, Any]], None]) -> None:
        """Call `watcher` with each phase's record as it changes from now on, after every phase as
        it stands (records as /health/startup shows them); on the thread that moves the phase."""
        with self._lock:
            self._watchers.append(watcher)
            records = [phase.as_dict() for phase in self._phases.values()]
        for record in records:
            watcher(record)

    def _move(
        self, name: str, state: State, detail: dict[str, Any], start: bool = False, at: float | None = None
    ) -> None:
        now = uptime()
        with self._lock:
            phase = self._phases[name]
            if phase.state == "failed":  # a failed phase stays failed, whatever runs on after it
                return
            if start or phase.started_s is None:
                phase.started_s = now if at is None else at - _T0
            phase.state = state
            phase.detail.update(detail)
            phase.duration_s = None if state == "running" else now - phase.started_s
            record = phase.as_dict()
            watchers = list(self._watchers)
        for watcher in watchers:
            try:
                watcher(record)
            except Exception:  # a watcher (tracing) must not stop the start it watches
                log.exception("phase_watcher_failed", phase=name)
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

    def duration(self, name: str) -> float | None:
        """Seconds a finished phase took (None while it runs or before)."""
        with self._lock:
            return self._phases[name].duration_s

    @property
    def failed(self) -> bool:
        """The appliance failed: a shared phase did, or (unless model failures are tolerated) any
        phase did, or every model did."""
        with self._lock:
            lost = {p.model for p in self._phases.values() if p.state == "failed"}
            if not lost or None in lost or not self.models:
                return bool(lost)
            if not self.tolerate_model_failures:
                return bool(lost - self.on_demand)
            return lost >= set(self.models)

    def model_failed(self, model: str) -> bool:
        with self._lock:
            return any(p.state == "failed" and p.model == model for p in self._phases.values())

    @property
    def started(self) -> bool:
        return self.state("ready") == "done"

    @property
    def accepting(self) -> bool:
        """Some model can take work (it is ready and one of its engines is up), and we are
        neither draining nor failed: traffic for a ready model flows while another still starts."""
        return self.any_engine_up and not self.draining and not self.failed

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


class ModelPhases:
    """One model's view of the phase table: `engine` means `engine:NAME` with several models and
    `engine` with one; the shared phases (bind, forkserver) are the appliance's."""

    def __init__(self, state: StartupState, model: str, several: bool) -> None:
        self.state_table = state
        self.model = model
        self._several = several
        self._up_key = model if several else ""

    def key(self, name: str) -> str:
        return f"{name}:{self.model}" if self._several and name not in SHARED_PHASES else name

    def start(self, name: str, **detail: Any) -> None:
        if name in SHARED_PHASES and self.state_table.state(name) != "pending":
            self.state_table.update(name, **detail)  # another model's start got there first
            return
        self.state_table.start(self.key(name), **detail)

    def update(self, name: str, **detail: Any) -> None:
        self.state_table.update(self.key(name), **detail)

    def done(self, name: str, **detail: Any) -> None:
        if name in SHARED_PHASES and self.state_table.state(name) == "done":
            self.state_table.update(name, **detail)
            return
        self.state_table.done(self.key(name), **detail)

    def skip(self, name: str, reason: str, **detail: Any) -> None:
        self.state_table.skip(self.key(name), reason, **detail)

    def fail(self, name: str, error: str, **detail: Any) -> None:
        self.state_table.fail(self.key(name), error, **detail)

    def state(self, name: str) -> State:
        return self.state_table.state(self.key(name))

    def duration(self, name: str) -> float | None:
        return self.state_table.duration(self.key(name))

    @property
    def engine_up(self) -> bool:
        return self.state_table.model_up(self._up_key)

    @engine_up.setter
    def engine_up(self, up: bool) -> None:
        self.state_table.set_up(self._up_key, up)

    @property
    def failed(self) -> bool:
        return self.state_table.model_failed(self.model) if self._several else self.state_table.failed

    @property
    def draining(self) -> bool:
        return self.state_table.draining
