"""The engine phase's detail (/health/startup) as the supervisor publishes it from several threads."""

from __future__ import annotations

import multiprocessing
import threading
from pathlib import Path
from typing import Any

from common.settings import Settings
from orchestrator.forkserver import StartMethod
from orchestrator.supervisor import EngineSupervisor


class Phases:
    """Records each detail published for the engine phase."""

    engine_up = False

    def __init__(self) -> None:
        self.published: list[dict[str, Any]] = []

    def update(self, name: str, **detail: Any) -> None:
        self.published.append(detail)


class Events:
    def engine_ready(self, slot: int, conn: Any, warmup: dict[str, Any]) -> None:
        pass


def test_two_engines_ready_at_once_publish_both_up(model_dir: Path) -> None:
    """A restarted engine and a follower ready together: the detail published last counts both,
    although the first read its count before the second was up (its memory read is slow)."""
    phases = Phases()
    method = StartMethod(multiprocessing.get_context("fork"))
    supervisor = EngineSupervisor(Settings(model=str(model_dir), engines=2), phases, method, Events())  # type: ignore[arg-type]
    first_reading, second_reading, go_on = threading.Event(), threading.Event(), threading.Event()

    def memory() -> list[dict[str, Any]]:
        if threading.current_thread().name == "first":
            first_reading.set()
            go_on.wait(10)
        else:
            second_reading.set()
        return []

    supervisor._memory = memory  # type: ignore[method-assign]
    first = threading.Thread(target=supervisor._ready, args=(0, None, {}), name="first")
    second = threading.Thread(target=supervisor._ready, args=(1, None, {}), name="second")
    first.start()
    assert first_reading.wait(10)  # its detail says 1 up, and is not published yet
    second.start()
    # Unlocked, the second reads and publishes now (2 up) and the first's 1 lands after it; locked,
    # the second waits for the first to publish.
    if second_reading.wait(0.2):
        second.join(10)
    go_on.set()
    first.join(10)
    second.join(10)
    assert [detail["up"] for detail in phases.published][-1] == 2
