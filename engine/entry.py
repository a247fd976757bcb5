"""Light trampoline the HTTP process can pickle as a Process target without importing torch."""

from __future__ import annotations

from collections.abc import MutableSequence
from multiprocessing.connection import Connection

from common.wire import EngineSpec


def engine_main(conn: Connection, spec: EngineSpec, busy: MutableSequence[float]) -> None:
    from engine.process import run_engine  # preloaded in the forkserver: no cost there

    run_engine(conn, spec, busy)
