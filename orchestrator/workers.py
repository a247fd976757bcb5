"""Engine processes: a forkserver with torch preloaded, fork/watch/re-fork, bounded restarts.

The forkserver imports the heavy modules in its own process (never on a thread of this one:
upstream that raced with the main thread's imports, vLLM #40438) and stays up for re-forks.
"""

from __future__ import annotations

import multiprocessing.process
import queue
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
    """`settings.engines` engine processes from one forkserver, each restarted on its own when it dies."""

    def __init__(self, settings: Settings, phases: Phases, client: EngineClient, method: StartMethod) -> None:
        self.settings = settings
        self.phases = phases
        self.client = client
        self.method = method
        self.count = settings.engines
        # One flag per engine, set while it runs a batch: engines size their torch pools by it.
        self.busy = method.ctx.RawArray("b", self.count)  # type: ignore[attr-defined]
        self.processes: list[multiprocessing.process.BaseProcess | None] = [None] * self.count
        self.restarts: deque[float] = deque()
        self.on_fatal: Callable[[str], None] = lambda reason: None
        self.on_restart: Callable[[], None] = lambda: None
        self._stopping = threading.Event()
        self._lost: queue.SimpleQueue[int | None] = queue.SimpleQueue()
        client.on_lost = self._engine_lost

    def spec(self, slot: int) -> EngineSpec:
        return EngineSpec(
            model_path=self.settings.model_path,
            slot=slot,
            threads=self.settings.shared_engine_threads,
            solo_threads=self.settings.engine_threads,
            max_batch_tokens=self.settings.max_batch_tokens,
            max_batch_size=self.settings.max_batch_size,
            nice=self.settings.engine_nice,
        )

    @property
    def pids(self) -> list[int | None]:
        return [p.pid if p else None for p in self.processes]

    def _detail(self) -> dict[str, Any]:
        """The engine phase's detail: `pid` is the first engine's (DESIGN §6), `pids` all of them."""
        return {"pid": self.pids[0], "pids": self.pids, "up": self.client.attached, "restarts": len(self.restarts)}

    def start_engines(self) -> None:
        """The first engine warms up alone, on every core, and makes the server ready; the rest follow.

        Warming all engines side by side made readiness ~0.9 s later on 2 cores (bench.coldstart).
        """
        process, conn = self._fork(0)
        self.phases.done("forkserver", preload=self.method.preload)
        self.phases.start("engine", engines=self.count, **self._detail())
        loaded = self._expect(conn, process, Msg.LOADED)
        self.phases.done("engine", **{k: v for k, v in loaded.items() if k != "pid"})
        self.phases.start("warmup")
        self.phases.done("warmup", **self._expect(conn, process, Msg.READY))
        self._attach(0, conn)
        threading.Thread(target=self._supervise, name="engine-supervisor", daemon=True).start()
        threading.Thread(target=self._start_others, name="engine-start-others", daemon=True).start()

    def _start_others(self) -> None:
        for slot in range(1, self.count):
            try:
                self._bring_up(slot)
            except EngineStartError as exc:
                if self._stopping.is_set():
                    return
                log.error("engine_start_failed", slot=slot, error=str(exc))
                self._lost.put(slot)  # the supervisor retries it within the restart budget

    def _fork(self, slot: int) -> tuple[multiprocessing.process.BaseProcess, Connection]:
        if self._stopping.is_set():
            raise EngineStartError("stopping")
        parent, child = self.method.ctx.Pipe(duplex=True)
        process = self.method.ctx.Process(  # type: ignore[attr-defined]
            target=entry.run, args=(child, self.spec(slot), self.busy), name=f"warmpool-engine-{slot}", daemon=True
        )
        process.start()  # with forkserver, returns once the server has preloaded and forked
        child.close()
        self.processes[slot] = process
        return process, parent

    def _attach(self, slot: int, conn: Connection) -> None:
        self.client.attach(slot, conn)
        self.phases.engine_up = True
        self.phases.update("engine", **self._detail())
        log.info("engine_ready", slot=slot, pid=self.pids[slot], up=self.client.attached)

    def _bring_up(self, slot: int) -> None:
        process, conn = self._fork(slot)
        self._expect(conn, process, Msg.LOADED)
        self._expect(conn, process, Msg.READY)
        self._attach(slot, conn)

    def _expect(self, conn: Connection, process: Any, wanted: str) -> dict[str, Any]:
        while not self._stopping.is_set():
            if conn.poll(0.1):
                try:
                    kind, body = conn.recv()
                except (EOFError, OSError):  # it died: its exit code tells why
                    process.join(STOP_GRACE_S)
                    raise EngineStartError(f"engine exited with code {process.exitcode} while starting") from None
                if kind == Msg.FAILED:
                    process.join(STOP_GRACE_S)
                    raise EngineStartError(str(body))
                if kind == wanted:
                    return dict(body)
            elif not process.is_alive():
                raise EngineStartError(f"engine exited with code {process.exitcode} while starting")
        raise EngineStartError("stopping")

    def _engine_lost(self, slot: int) -> None:
        """Runs on the dead engine's reader thread; the others keep serving meanwhile."""
        self.busy[slot] = 0
        self.phases.engine_up = self.client.attached > 0
        self.phases.update("engine", **self._detail())
        if not self._stopping.is_set():
            process = self.processes[slot]
            log.error("engine_lost", slot=slot, pid=process.pid if process else None, up=self.client.attached)
            self._lost.put(slot)

    def _supervise(self) -> None:
        while (slot := self._lost.get()) is not None and not self._stopping.is_set():
            self._reap(slot)
            try:
                for attempt in Retrying(
                    retry=retry_if_exception_type(EngineStartError),
                    wait=wait_exponential(multiplier=0.5, max=10),
                    stop=self._restart_budget_spent,
                    before=self._count_restart,
                    reraise=True,
                ):
                    with attempt:
                        self._bring_up(slot)
                        self.on_restart()
            except Exception as exc:
                if self._stopping.is_set():
                    return
                reason = (
                    f"engines restarted {len(self.restarts)} times within "
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

    def _reap(self, slot: int) -> None:
        process = self.processes[slot]
        if process is not None:
            process.join(1.0)
            if process.is_alive():
                process.kill()

    def stop(self) -> None:
        """Stop the engines (each finishes its batch) and the forkserver; no process left behind."""
        self._stopping.set()
        self._lost.put(None)
        self.client.stop()
        for process in self.processes:
            if process is not None:
                process.join(STOP_GRACE_S)
                if process.is_alive():
                    process.kill()
                    process.join(STOP_GRACE_S)
        forkserver.stop(self.method)
