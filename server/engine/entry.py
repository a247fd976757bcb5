"""Light trampoline the HTTP process can pickle as a Process target without importing torch."""

from __future__ import annotations

from collections.abc import MutableSequence
from multiprocessing.connection import Connection

from server.ipc import EngineSpec


def run(conn: Connection, spec: EngineSpec, busy: MutableSequence[int]) -> None:
    from server.engine.main import run as engine_main  # preloaded in the forkserver: no cost there

    engine_main(conn, spec, busy)
