"""The plan an early-spawned forkserver waits for (engine/forkserver_preload.py): read once there,
given up on when its orchestrator is gone or the deadline has passed."""

from __future__ import annotations

import json
import os
from pathlib import Path

from engine.forkserver_preload import wait_plan
from orchestrator.forkserver_early import EarlyForkserver, write_plan


def test_a_written_plan_is_read_and_removed(tmp_path: Path) -> None:
    early = EarlyForkserver(tmp_path / "plans" / "plan.json", spawned=0.0)
    early.plan.parent.mkdir()
    write_plan(early, ["engine.transformers_preload"], [["/models/m", "float32"]])
    assert early.settled
    plan = wait_plan(early.plan, os.getppid(), deadline_s=0.0)
    assert plan == {"modules": ["engine.transformers_preload"], "models": [["/models/m", "float32"]]}
    assert not early.plan.parent.exists()  # the forkserver's alone: nothing left behind


def test_no_plan_once_the_orchestrator_is_gone(tmp_path: Path) -> None:
    """A parent pid that is not this process's parent: the orchestrator died and it was reparented."""
    assert wait_plan(tmp_path / "plan.json", parent=os.getppid() + 1, deadline_s=60.0) is None


def test_no_plan_past_the_deadline(tmp_path: Path) -> None:
    assert wait_plan(tmp_path / "plan.json", os.getppid(), deadline_s=0.0) is None


def test_an_unreadable_plan_is_none(tmp_path: Path) -> None:
    (tmp_path / "plan.json").write_text(json.dumps(["not", "a", "plan"])[:5])
    assert wait_plan(tmp_path / "plan.json", os.getppid(), deadline_s=0.0) is None
