"""Imported by the forkserver alone (its preload list): build the models the orchestrator named in
common.wire.FORKSERVER_MODELS_ENV before the first engine is forked (engine/runtime/preloaded.py says why).

The forkserver's only inputs are module names, so the work happens at import; it never raises (the
forkserver must come up whatever the folder holds: an engine then loads the model itself and reports
what went wrong).
"""

from __future__ import annotations

import json
import os

from common.wire import FORKSERVER_MODELS_ENV
from engine.runtime.preloaded import build_all


def _entries() -> list[tuple[str, str]]:
    try:
        return [(str(folder), str(dtype)) for folder, dtype in json.loads(os.environ.get(FORKSERVER_MODELS_ENV, "[]"))]
    except (ValueError, TypeError):
        return []


build_all(_entries())
