"""The forkserver spawned first thing, before the settings and the logging are imported.

The forkserver's preload (torch and the engine, ~1.8 s) is the start's floor; the HTTP process's own
imports before it knows its models (pydantic settings, structlog: ~0.35 s) used to run before it,
in series. Spawned here with the preload every model needs (engine.forkserver_preload imports
engine.process first), it imports torch while they run; what depends on the model folders — the
transformers fallback's modules, the CPU engines' native models — follows in a plan file written
once the settings are read (orchestrator.forkserver.start), which the forkserver waits for after
its torch import.

Standard library only: importing anything heavier here would put it back in front of the spawn.
"""

from __future__ import annotations

import multiprocessing
import os
import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from common.wire import FORKSERVER_PLAN_ENV

PRELOAD = "engine.forkserver_preload"  # imports engine.process (torch), then waits for the plan


@dataclass
class EarlyForkserver:
    """The stdlib forkserver started by spawn(); `plan` is the file its preload waits for (it
    removes it once read)."""

    plan: Path
    spawned: float  # time.monotonic() at the spawn
    settled: bool = False  # its plan written, or it was stopped

    def cleanup(self) -> None:
        """Remove the plan's folder (the forkserver is gone without reading it)."""
        shutil.rmtree(self.plan.parent, ignore_errors=True)


def spawn() -> EarlyForkserver | None:
    """Start the forkserver now (returns at once); None where there is none (the settings' start
    then decides as before)."""
    if "forkserver" not in multiprocessing.get_all_start_methods():
        return None
    from multiprocessing import forkserver

    plan = Path(tempfile.mkdtemp(prefix="warmpool-forkserver-")) / "plan.json"
    os.environ[FORKSERVER_PLAN_ENV] = str(plan)  # inherited by it, and by any forkserver started later
    multiprocessing.get_context("forkserver").set_forkserver_preload([PRELOAD])
    spawned = time.monotonic()
    try:
        forkserver.ensure_running()
    except Exception:  # orchestrator.forkserver.start tries again, and says why if it fails
        del os.environ[FORKSERVER_PLAN_ENV]
        shutil.rmtree(plan.parent, ignore_errors=True)
        return None
    return EarlyForkserver(plan, spawned)


def write_plan(early: EarlyForkserver, modules: list[str], models: list[list[str]]) -> None:
    """The rest of the forkserver's preload, written whole (a rename): it never reads half of it."""
    import json

    partial = early.plan.with_suffix(".partial")
    partial.write_text(json.dumps({"modules": modules, "models": models}))
    os.replace(partial, early.plan)
    early.settled = True
