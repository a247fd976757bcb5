"""The SIGTERM handler runs between two bytecodes of the main thread: it must take no lock that
thread may hold. It once logged, and a SIGTERM landing while the main thread was writing a log line
waited on the log's write lock for good (the server never exited)."""

from __future__ import annotations

import asyncio
import signal
import threading
from concurrent.futures import ThreadPoolExecutor

import uvicorn
from structlog import PrintLogger
from structlog.testing import capture_logs

from common.settings import Settings
from common.startup import StartupState
from orchestrator.forkserver import StartMethod
from orchestrator.lifecycle import LifecycleServer
from server.core.services import Services


def test_the_sigterm_handler_logs_nothing_and_the_drain_it_starts_logs_the_signal() -> None:
    """handle_exit itself emits no log event (the drain coroutine it schedules does), so it never
    waits on the log's write lock, which the thread it interrupted may be holding."""
    with ThreadPoolExecutor(1) as executor:
        svc = Services(settings=Settings(drain_timeout=0), startup=StartupState(), executor=executor)
        server = LifecycleServer(uvicorn.Config(app=None), svc, StartMethod(None), [])  # type: ignore[arg-type]

        async def scenario() -> list[dict[str, object]]:
            server._loop = asyncio.get_running_loop()
            server.shutdown_engines = _nothing  # type: ignore[method-assign]
            with capture_logs() as in_handler:
                server.handle_exit(signal.SIGTERM, None)
            assert in_handler == []
            with capture_logs() as in_drain:
                while not any(e["event"] == "signal" for e in in_drain):
                    await asyncio.sleep(0.005)
            return in_drain

        logs = asyncio.run(asyncio.wait_for(scenario(), 5))
    assert next(e for e in logs if e["event"] == "signal")["signal"] == "SIGTERM"


def test_structlogs_write_lock_is_not_reentrant() -> None:
    """Why the above matters: the lock PrintLogger writes under cannot be taken again by the thread
    holding it, so a handler logging on that thread would wait for ever."""
    lock = PrintLogger()._lock
    assert isinstance(lock, type(threading.Lock())) and lock.acquire() and not lock.acquire(timeout=0.05)
    lock.release()


async def _nothing() -> None:
    return None
