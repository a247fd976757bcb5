"""Logs: one line a person reads per event at a terminal, JSON lines elsewhere."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest
import structlog

from orchestrator import logs

PHASE = {
    "event": "phase",
    "phase": "engine",
    "state": "done",
    "started_s": 5.24,
    "duration_s": 0.1127,
    "engines": 2,
    "memory": [{"process": "engine 0", "rss_mb": 296.3}],
    "backend": "transformers",
    "level": "info",
    "timestamp": "2026-12-03T02:50:13.044291Z",
}


@pytest.fixture
def restored() -> Iterator[None]:
    yield
    structlog.reset_defaults()


def test_a_phase_is_one_line_of_its_name_state_duration_and_scalar_details() -> None:
    """A finished phase reads `time phase: state in N s  key=value ...`; the nested memory table is
    left out, and so are the columns the line already says."""
    line = logs.Lines()(None, "info", dict(PHASE))
    assert line == "02:50:13.044 engine: done in 0.11 s  engines=2 backend=transformers"


def test_a_warning_names_its_level_and_its_traceback_follows() -> None:
    """A level past info is said; an exception's traceback comes on the lines after the event's."""
    event = {"event": "engine_died", "level": "warning", "timestamp": "2026-12-03T02:50:13.500000Z", "code": -9}
    line = logs.Lines()(None, "warning", {**event, "exception": "Traceback (most recent call last):\nOSError"})
    assert line.splitlines() == [
        "02:50:13.500 WARNING engine_died  code=-9",
        "Traceback (most recent call last):",
        "OSError",
    ]


def test_off_a_terminal_auto_writes_json_lines(capsys: pytest.CaptureFixture[str], restored: None) -> None:
    """`auto` writes JSON where stdout is not a TTY (pytest's capture is not), and `console` the lines."""
    logs.configure("info", "auto")
    structlog.get_logger().info("phase", phase="warmup", state="running", duration_s=0.0)
    assert json.loads(capsys.readouterr().out)["phase"] == "warmup"
    structlog.reset_defaults()
    logs.configure("info", "console")
    structlog.get_logger().info("phase", phase="warmup", state="running", duration_s=0.0)
    assert capsys.readouterr().out.strip().endswith("warmup: running")
