"""Imported by the forkserver alone (its preload list): build the models the orchestrator named
before the first engine is forked (engine/runtime/preloaded.py says why).

The forkserver's only inputs are module names, so the work happens at import. A forkserver started
with the settings read finds the models in common.wire.FORKSERVER_MODELS_ENV; one started before
(orchestrator/forkserver_early.py) imports the engine first, then waits for the plan file its
environment names (FORKSERVER_PLAN_ENV): the rest of the preload list and the models. It never
raises (the forkserver must come up whatever the folder holds: an engine then loads the model
itself and reports what went wrong).
"""

from __future__ import annotations

import contextlib
import importlib
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import engine.process  # noqa: F401  torch and the engine: the preload every model needs, paid first
from common.wire import FORKSERVER_MODELS_ENV, FORKSERVER_PLAN_ENV
from engine.runtime.preloaded import build_all

PLAN_WAIT_S = 60.0  # for the orchestrator's settings; it normally wrote the plan during the torch import
POLL_S = 0.005


def _entries(raw: Any) -> list[tuple[str, str, Path | None]]:
    """[folder, dtype, GEMM records' folder or ""] entries (engine/runtime/preloaded.py build_all)."""
    try:
        return [(str(folder), str(dtype), Path(records) if records else None) for folder, dtype, records in raw]
    except (ValueError, TypeError):
        return []


def wait_plan(path: Path, parent: int, deadline_s: float = PLAN_WAIT_S) -> dict[str, Any] | None:
    """The plan at `path` once it is there (then removed: it is this process's alone), or None if
    the process that spawned this one is gone, the deadline passed or the file is unreadable."""
    deadline = time.monotonic() + deadline_s
    while not path.exists():  # rarely waited on: the settings are read long before torch is imported
        if os.getppid() != parent or time.monotonic() > deadline:
            return None
        time.sleep(POLL_S)
    try:
        plan = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    with contextlib.suppress(OSError):
        path.unlink()
        path.parent.rmdir()
    return plan if isinstance(plan, dict) else None


def run(environ: dict[str, str], parent: int) -> None:
    if FORKSERVER_MODELS_ENV in environ or FORKSERVER_PLAN_ENV not in environ:
        try:
            models = _entries(json.loads(environ.get(FORKSERVER_MODELS_ENV, "[]")))
        except ValueError:
            models = []
        build_all(models)
        return
    plan = wait_plan(Path(environ[FORKSERVER_PLAN_ENV]), parent)
    if plan is None:  # the engines load their models themselves
        print("warmpool forkserver: no plan from the orchestrator; preloaded the engine only", file=sys.stderr)
        return
    for module in plan.get("modules", []):
        with contextlib.suppress(ImportError):  # as the stdlib's forkserver imports its preload list
            importlib.import_module(str(module))
    build_all(_entries(plan.get("models", [])))


run(dict(os.environ), os.getppid())
