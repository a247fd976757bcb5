"""Engine processes: a forkserver with torch preloaded, fork/watch/re-fork, bounded restarts.

The forkserver imports the heavy modules in its own process (never on a thread of this one:
upstream that raced with the main thread's imports, vLLM #40438) and stays up for re-forks.
"""

from __future__ import annotations

import multiprocessing.process
import threading
import time
from collections import deque
from collections.abc import Callable
from multiprocessing.connection import Connection
from typing import Any

import structlog
from tenacity import RetryCallState, Retrying, retry_if_exception_type, wait_exponential

from orchestrator import forkserver
from orchestrator.forkserver import StartMethod
from orchestrator.phases import Phases
from orchestrator.settings import Settings
from server.engine import entry
from server.ipc import EngineClient, EngineSpec, Msg

STOP_GRACE_S = 5.0

log = structlog.get_logger("warmpool.workers")


class EngineStartError(Exception):
    pass


class Workers:
    def __init__(self, settings: Settings, phases: Phases, client: EngineClient, method: StartMethod) -> None:
        self.settings = settings
        self.phases = phases
        self.client = client
        self.method = method
        self.spec = EngineSpec(
            model_path=settings.model_path,
            threads=settings.engine_threads,
            max_batch_tokens=settings.max_batch_tokens,
            max_batch_size=settings.max_batch_size,
            nice=settings.engine_nice,
        )
        self.process: multiprocessing.process.BaseProcess | None = None
        self.restarts: deque[float] = deque()
        self.on_fatal: Callable[[str], None] = lambda reason: None
        self.on_restart: Callable[[], None] = lambda: None
        self._stopping = threading.Event()
        self._lost = threading.Event()
        client.on_lost = self._engine_lost

    def start_engine(self) -> None:
        """First engine: blocks until it is warm (runs on its own thread)."""
        self._launch(first=True)
        threading.Thread(target=self._supervise, name="engine-supervisor", daemon=True).start()

    def _launch(self, first: bool = False) -> None:
        parent, child = self.method.ctx.Pipe(duplex=True)
        process = self.method.ctx.Process(  # type: ignore[attr-defined]
            target=entry.run, args=(child, self.spec), name="warmpool-engine", daemon=True
        )
        process.start()  # with forkserver, returns once the server has preloaded and forked
        child.close()
        self.process = process
        if first:
            self.phases.done("forkserver", preload=self.method.preload)
            self.phases.start("engine", pid=process.pid)
        loaded = self._expect(parent, process, Msg.LOADED)
        if first:
            self.phases.done("engine", **loaded)
            self.phases.start("warmup")
        warm = self._expect(parent, process, Msg.READY)
        if first:
            self.phases.done("warmup", **warm)
        else:
            self.phases.update("engine", pid=loaded["pid"], restarts=len(self.restarts), **warm)
            self.on_restart()
        self.client.attach(parent)
        self.phases.engine_up = True
        log.info("engine_ready", pid=process.pid, restart=not first)

    def _expect(self, conn: Connection, process: Any, wanted: str) -> dict[str, Any]:
        while not self._stopping.is_set():
            if conn.poll(0.1):
                try:
                    kind, body = conn.recv()
                except (EOFError, OSError):
                    continue  # the exit code below tells why
                if kind == Msg.FAILED:
                    process.join(STOP_GRACE_S)
                    raise EngineStartError(str(body))
                if kind == wanted:
                    return dict(body)
            elif not process.is_alive():
                raise EngineStartError(f"engine exited with code {process.exitcode} while starting")
        raise EngineStartError("stopping")

    def _engine_lost(self) -> None:
        self.phases.engine_up = False
        if not self._stopping.is_set():
            log.error("engine_lost", pid=self.process.pid if self.process else None)
            self._lost.set()

    def _supervise(self) -> None:
        while True:
            self._lost.wait()
            self._lost.clear()
            if self._stopping.is_set():
                return
            self._reap()
            try:
                for attempt in Retrying(
                    retry=retry_if_exception_type(EngineStartError),
                    wait=wait_exponential(multiplier=0.5, max=10),
                    stop=self._restart_budget_spent,
                    before=self._count_restart,
                    reraise=True,
                ):
                    with attempt:
                        self._launch()
            except Exception as exc:
                if self._stopping.is_set():
                    return
                reason = (
                    f"engine restarted {len(self.restarts)} times within "
                    f"{self.settings.restart_window:.0f} s; last error: {exc}"
                )
                self.client.fail_all("the engine could not be restarted")
                self.phases.fail("engine", reason)
                self.on_fatal(reason)
                return

    def _count_restart(self, _: RetryCallState) -> None:
        now = time.monotonic()
        self.restarts.append(now)
        while self.restarts and now - self.restarts[0] > self.settings.restart_window:
            self.restarts.popleft()
        if len(self.restarts) > self.settings.max_restarts:
            raise EngineStartError(f"more than {self.settings.max_restarts} restarts")

    def _restart_budget_spent(self, _: RetryCallState) -> bool:
        return self._stopping.is_set() or len(self.restarts) >= self.settings.max_restarts

    def _reap(self) -> None:
        if self.process is not None:
            self.process.join(1.0)
            if self.process.is_alive():
                self.process.kill()

    def stop(self) -> None:
        """Stop the engine (let it finish its batch) and the forkserver; no process left behind."""
        self._stopping.set()
        self._lost.set()
        self.client.stop()
        if self.process is not None:
            self.process.join(STOP_GRACE_S)
            if self.process.is_alive():
                self.process.kill()
                self.process.join(STOP_GRACE_S)
        forkserver.stop(self.method)
