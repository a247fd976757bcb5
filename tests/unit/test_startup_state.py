"""StartupState: the phase table /health/* reads (pending -> running -> done, skipped or failed), the status
and readiness derived from it, and the one "phase" log event per transition."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import structlog
from structlog.testing import capture_logs

from common import startup
from common.startup import PHASES, StartupState


class Clock:
    """A stand-in for startup.uptime(): seconds since process start, moved by hand."""

    def __init__(self) -> None:
        self.now = 10.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Clock:
    fake = Clock()
    monkeypatch.setattr(startup, "uptime", fake)
    return fake


@pytest.fixture
def logs(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[dict[str, Any]]]:
    """The log events emitted meanwhile. The module's logger is swapped for a fresh proxy inside the capture,
    so a logger cached by an earlier structlog.configure(cache_logger_on_first_use=True) cannot bypass it."""
    with capture_logs() as captured:
        monkeypatch.setattr(startup, "log", structlog.get_logger("warmpool.phases"))
        yield captured


def record(state: StartupState, name: str) -> dict[str, Any]:
    """The snapshot's record of one phase."""
    return next(p for p in state.snapshot()["phases"] if p["name"] == name)


def finish(state: StartupState) -> None:
    """Every phase run to done, and an engine up: a server that has started."""
    for name in PHASES:
        state.start(name)
        state.done(name)
    state.engine_up = True


# The phase table


def test_phases_start_pending_in_order() -> None:
    """A new table lists every phase, in startup order, pending with no times or detail."""
    phases = StartupState().snapshot()["phases"]
    assert [p["name"] for p in phases] == list(PHASES)
    assert all(
        p == {"name": p["name"], "state": "pending", "started_s": None, "duration_s": None, "detail": {}}
        for p in phases
    )


def test_start_marks_phase_running(clock: Clock) -> None:
    """start() makes a phase running, started now, its duration counting up while it runs."""
    state = StartupState()
    state.start("prefetch", files=3)
    clock.now = 12.5
    assert state.state("prefetch") == "running"
    assert record(state, "prefetch") == {
        "name": "prefetch",
        "state": "running",
        "started_s": 10.0,
        "duration_s": 2.5,
        "detail": {"files": 3},
    }


def test_done_marks_phase_done_with_its_duration(clock: Clock) -> None:
    """done() after start() makes the phase done, with the time from start to done as its duration."""
    state = StartupState()
    state.start("engine")
    clock.now = 14.0
    state.done("engine")
    clock.now = 99.0
    assert state.state("engine") == "done"
    assert (record(state, "engine")["started_s"], record(state, "engine")["duration_s"]) == (10.0, 4.0)


def test_detail_accumulates_over_start_update_and_done() -> None:
    """Detail given to start(), update() and done() is merged into the phase's detail, later keys winning."""
    state = StartupState()
    state.start("engine", backend="native", pid=1)
    state.update("engine", pid=2, rss_mb=80)
    state.done("engine", threads=2)
    assert record(state, "engine")["detail"] == {"backend": "native", "pid": 2, "rss_mb": 80, "threads": 2}


def test_skip_records_reason(clock: Clock) -> None:
    """skip() marks a phase skipped with its reason, started and ended at once."""
    state = StartupState()
    state.skip("prefetch", reason="prefetch=off")
    assert state.state("prefetch") == "skipped"
    phase = record(state, "prefetch")
    assert (phase["detail"], phase["started_s"], phase["duration_s"]) == ({"reason": "prefetch=off"}, 10.0, 0.0)


def test_fail_records_error(clock: Clock) -> None:
    """fail() marks a running phase failed with its error, its duration up to the failure."""
    state = StartupState()
    state.start("engine")
    clock.now = 11.5
    state.fail("engine", error="model folder not found")
    assert state.state("engine") == "failed"
    phase = record(state, "engine")
    assert (phase["detail"], phase["duration_s"]) == ({"error": "model folder not found"}, 1.5)


def test_snapshot_reports_status_and_uptime(clock: Clock) -> None:
    """snapshot() carries the status and the process uptime besides the phases."""
    snapshot = StartupState().snapshot()
    assert (snapshot["status"], snapshot["uptime_s"]) == ("starting", 10.0)


# current(): what a client waiting for readiness is held up by


def test_current_is_first_phase_before_anything_runs() -> None:
    """Before any phase moves, current() is the first phase."""
    assert StartupState().current() == PHASES[0]


def test_current_names_running_phase() -> None:
    """current() names the phase that is running."""
    state = StartupState()
    state.start("bind")
    state.done("bind")
    state.start("prefetch")
    assert state.current() == "prefetch"


def test_current_names_failed_phase() -> None:
    """current() names the phase that failed, even with later phases pending."""
    state = StartupState()
    state.start("bind")
    state.done("bind")
    state.skip("prefetch", reason="off")
    state.start("forkserver")
    state.fail("forkserver", error="boom")
    assert state.current() == "forkserver"


def test_current_names_first_pending_phase_between_phases() -> None:
    """With nothing running or failed, current() is the first pending phase, past done and skipped ones."""
    state = StartupState()
    state.start("bind")
    state.done("bind")
    state.skip("prefetch", reason="off")
    assert state.current() == "forkserver"


def test_current_is_none_once_every_phase_is_over() -> None:
    """With every phase done or skipped, nothing holds readiness up."""
    state = StartupState()
    finish(state)
    assert state.current() is None


# status() and serving


def test_status_is_starting_until_ready_is_done() -> None:
    """Every phase but ready done, and an engine up: still starting, not serving."""
    state = StartupState()
    for name in PHASES[:-1]:
        state.start(name)
        state.done(name)
    state.start("ready")
    state.engine_up = True
    assert (state.status(), state.serving) == ("starting", False)


def test_serving_once_ready_is_done_with_an_engine_up() -> None:
    """ready done and an engine up: status ready, serving."""
    state = StartupState()
    finish(state)
    assert (state.status(), state.serving) == ("ready", True)


def test_no_engine_up_means_recovering() -> None:
    """Started, but no engine up (one is restarting): status recovering, not serving."""
    state = StartupState()
    finish(state)
    state.engine_up = False
    assert (state.status(), state.serving) == ("recovering", False)


def test_draining_stops_serving() -> None:
    """A started server that drains reports draining and stops serving."""
    state = StartupState()
    finish(state)
    state.draining = True
    assert (state.status(), state.serving) == ("draining", False)


def test_draining_before_ready_reports_draining() -> None:
    """A drain that begins while starting reports draining, not starting."""
    state = StartupState()
    state.start("bind")
    state.draining = True
    assert state.status() == "draining"


def test_failure_makes_status_failed() -> None:
    """A failed phase makes the status failed, whatever else holds (even draining)."""
    state = StartupState()
    state.start("warmup")
    state.fail("warmup", error="out of memory")
    state.draining = True
    assert state.status() == "failed"


def test_failure_after_start_stops_serving() -> None:
    """A phase failing after startup (a spent restart budget fails engine) stops serving at once, though an
    engine is still up."""
    state = StartupState()
    finish(state)
    state.fail("engine", error="restart budget spent")
    assert (state.status(), state.serving) == ("failed", False)


# Log events


def test_each_transition_logs_one_phase_event(logs: list[dict[str, Any]]) -> None:
    """start, done, skip and fail each log one "phase" event naming the phase and its new state."""
    state = StartupState()
    state.start("bind")
    state.done("bind")
    state.skip("prefetch", reason="off")
    state.start("forkserver")
    state.fail("forkserver", error="boom")
    assert [(e["event"], e["phase"], e["state"]) for e in logs] == [
        ("phase", "bind", "running"),
        ("phase", "bind", "done"),
        ("phase", "prefetch", "skipped"),
        ("phase", "forkserver", "running"),
        ("phase", "forkserver", "failed"),
        ("phase", "engine", "skipped"),  # the start stops at a failure: the rest is skipped
        ("phase", "warmup", "skipped"),
        ("phase", "compile", "skipped"),
        ("phase", "ready", "skipped"),
    ]


def test_update_logs_nothing(logs: list[dict[str, Any]]) -> None:
    """update() changes detail without a transition, so it logs no event."""
    state = StartupState()
    state.start("engine")
    state.update("engine", pid=7)
    assert [e["state"] for e in logs] == ["running"]


def test_failed_transition_logs_at_error_level(logs: list[dict[str, Any]]) -> None:
    """A failed transition logs at level error; the others at info."""
    state = StartupState()
    state.start("engine")
    state.fail("engine", error="boom")
    assert [(e["state"], e["log_level"]) for e in logs if e["phase"] in ("engine", "warmup")] == [
        ("running", "info"),
        ("failed", "error"),
        ("skipped", "info"),
    ]


def test_phase_event_carries_timings_and_detail(clock: Clock, logs: list[dict[str, Any]]) -> None:
    """A phase event carries the phase's start time, its duration and its detail (the error of a failure)."""
    state = StartupState()
    state.start("engine", backend="native")
    clock.now = 13.0
    state.fail("engine", error="boom")
    assert next(e for e in logs if e["state"] == "failed") == {
        "event": "phase",
        "log_level": "error",
        "phase": "engine",
        "state": "failed",
        "started_s": 10.0,
        "duration_s": 3.0,
        "backend": "native",
        "error": "boom",
    }


def test_a_failed_phase_stays_failed_and_the_rest_is_skipped() -> None:
    """After a failure, later transitions of that phase change nothing (a forkserver coming up must
    not put a failed engine phase back to running), and the phases still to come are skipped."""
    state = StartupState()
    state.start("bind")
    state.done("bind")
    state.fail("engine", error="model folder not found")
    state.start("engine", pid=7)
    state.update("engine", pid=8)
    phases = {p["name"]: p for p in state.snapshot()["phases"]}
    assert phases["engine"]["state"] == "failed" and phases["engine"]["detail"] == {"error": "model folder not found"}
    assert phases["bind"]["state"] == "done"
    for name in ("prefetch", "forkserver", "warmup", "compile", "ready"):
        assert phases[name]["state"] == "skipped"
        assert phases[name]["detail"]["reason"] == "start failed in phase 'engine'"
    assert state.status() == "failed" and state.current() == "engine"


def test_the_summary_is_one_line_of_the_phases_that_ran(clock: Clock) -> None:
    """summary() says how long the start took and each finished phase's time, skipped ones left out."""
    state = StartupState()
    state.start("bind")
    clock.now = 10.5
    state.done("bind")
    state.skip("prefetch", reason="off")
    state.start("engine")
    clock.now = 12.0
    state.done("engine")
    assert state.summary() == "ready in 12.00 s: bind 0.50 s, engine 1.50 s"


def test_a_watcher_gets_every_phase_then_each_change(clock: Clock) -> None:
    """watch() replays the table as it stands, then calls the watcher once per transition."""
    state = StartupState()
    state.start("bind")
    clock.now = 0.25
    state.done("bind")
    seen: list[tuple[str, str]] = []
    state.watch(lambda record: seen.append((record["name"], record["state"])))
    assert seen == [("bind", "done"), *((name, "pending") for name in PHASES[1:])]
    seen.clear()
    state.start("prefetch")
    state.skip("compile", "off")
    assert seen == [("prefetch", "running"), ("compile", "skipped")]


def test_a_model_on_demand_loading_leaves_the_others_serving_ready() -> None:
    """A model on demand counts for readiness while it serves, not while it loads or restarts (its
    requests wait for it); an always-resident model without an engine still makes the server unready."""
    state = StartupState(["a", "b"])
    state.on_demand = {"b"}
    state.start("ready")
    state.done("ready")
    state.set_up("a", True)
    state.set_up("b", False)  # loading
    assert state.engine_up and state.serving
    state.set_up("b", True)
    assert state.engine_up
    state.set_up("a", False)
    assert not state.engine_up and not state.serving
