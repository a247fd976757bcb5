"""How engines are started: the forkserver with its preload list, or spawn with the reason said."""

from __future__ import annotations

import multiprocessing
import os
import signal
import time
from multiprocessing.connection import Connection
from pathlib import Path

from structlog.testing import capture_logs

from common.startup import StartupState
from orchestrator import forkserver


def test_spawn_on_request_is_logged_and_shown_with_its_reason() -> None:
    """WARMPOOL_START_METHOD=spawn starts no forkserver: the forkserver phase and a warning say why."""
    startup = StartupState()
    with capture_logs() as logs:
        method = forkserver.start("spawn", startup, [forkserver.ENGINE])
    assert method.name == "spawn" and method.preload == []
    warnings = [e for e in logs if e["event"] == "forkserver_unavailable"]
    assert len(warnings) == 1 and warnings[0]["log_level"] == "warning"
    assert "WARMPOOL_START_METHOD" in warnings[0]["reason"]
    detail = next(p["detail"] for p in startup.snapshot()["phases"] if p["name"] == "forkserver")
    assert detail["method"] == "spawn" and "WARMPOOL_START_METHOD" in detail["fallback_reason"]


def test_a_native_model_preloads_the_engine_alone(model_dir: Path) -> None:
    """A BERT folder the native engine serves preloads engine.process only: no transformers."""
    assert forkserver.preload_for(model_dir) == [forkserver.ENGINE]


def test_a_broken_folder_preloads_both_so_the_engine_phase_reports_it(tmp_path: Path) -> None:
    """An unreadable folder is not the forkserver's to judge: it preloads everything, and the engine
    phase fails with the folder's error."""
    assert forkserver.preload_for(tmp_path / "missing") == [forkserver.ENGINE, forkserver.TRANSFORMERS]


def _stop_a_stopped_forkserver(conn: Connection) -> None:
    """In a child of its own: starts a forkserver, stops it with SIGSTOP, then stop() with a
    0.5 s bound; sends (seconds stop() took, whether the forkserver process is gone)."""
    import multiprocessing.forkserver as stdlib_forkserver

    ctx = multiprocessing.get_context("forkserver")
    stdlib_forkserver.ensure_running()
    pid = stdlib_forkserver._forkserver._forkserver_pid  # type: ignore[attr-defined]
    os.kill(pid, signal.SIGSTOP)
    started = time.monotonic()
    forkserver.stop(forkserver.StartMethod(ctx), timeout_s=0.5)
    conn.send((time.monotonic() - started, not Path(f"/proc/{pid}").exists()))


def test_a_hung_forkserver_is_killed_when_stop_waits_too_long() -> None:
    """stop() on a forkserver that does not exit when asked (SIGSTOPped) kills it once its bound has
    passed, instead of waiting for it for good."""
    ctx = multiprocessing.get_context("spawn")
    parent, child = ctx.Pipe()
    proc = ctx.Process(target=_stop_a_stopped_forkserver, args=(child,))
    proc.start()
    assert parent.poll(30), "stop() did not return"
    took, gone = parent.recv()
    proc.join(10)
    assert 0.5 <= took < 5 and gone
