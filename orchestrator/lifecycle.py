"""uvicorn on the early-bound socket, plus warmpool's boot, supervision wiring, drain and exit codes."""

from __future__ import annotations

import asyncio
import signal
import socket
import threading
from collections.abc import Callable, Coroutine
from concurrent.futures import Future, ThreadPoolExecutor
from multiprocessing.connection import Connection
from pathlib import Path
from types import FrameType
from typing import Any

import structlog
import uvicorn

from common.modelfolder import ModelError, ModelFolder, read_model_folder
from common.settings import Settings
from common.startup import StartupState
from orchestrator.binding import EarlyResponder
from orchestrator.forkserver import StartMethod
from orchestrator.supervisor import EngineStartError, EngineSupervisor
from server.app import create_app, with_middleware
from server.engine_client import BatchStats, EngineClient
from server.header_timeout import with_header_timeout
from server.services import ServedModel, Services
from server.tokenizer import TokenizerPool

log = structlog.get_logger("warmpool.lifecycle")


class EngineWiring:
    """Connects one model's engine client and its supervisor, which know nothing of each other:
    the client's events go to the supervisor and the metrics, the supervisor's to the client."""

    def __init__(self, services: Services, on_fatal: Callable[[str], None]) -> None:
        self.services = services
        self.on_fatal = on_fatal
        self.client: EngineClient | None = None
        self.supervisor: EngineSupervisor | None = None

    # EngineEvents (engine client, on its reader threads)
    def batch_done(self, stats: BatchStats) -> None:
        self.services.batch_done(stats)

    def engine_lost(self, slot: int) -> None:
        assert self.supervisor is not None
        self.supervisor.engine_lost(slot)

    def engine_stalled(self, slot: int, seconds: float) -> None:
        assert self.supervisor is not None
        self.services.metrics.stalls.inc()
        self.supervisor.kill(slot, f"no answer for {seconds:.1f} s with work outstanding", seconds)

    # SupervisorEvents (supervisor threads)
    def engine_ready(self, slot: int, conn: Connection, warmup: dict[str, Any]) -> None:
        assert self.client is not None
        if self.client.stall_timeout_s is None:  # the first engine's warm-up sizes the watchdog
            timeout = self.services.settings.stall_timeout(float(warmup.get("ms_per_token", 0.0)))
            self.client.stall_timeout_s = timeout
            self.services.startup.update("engine", stall_timeout_s=round(timeout, 1))
        self.client.attach(slot, conn)

    def engine_restarted(self, slot: int) -> None:
        self.services.metrics.restarts.inc()

    def gave_up(self, reason: str) -> None:
        assert self.client is not None
        self.client.fail_all("the engine could not be restarted")
        self.on_fatal(reason)


class LifecycleServer(uvicorn.Server):
    """uvicorn's server that also boots the engines after it starts, drains on SIGTERM/SIGINT and
    keeps a failed start readable for fail_linger seconds before exiting 1."""

    def __init__(self, config: uvicorn.Config, services: Services, method: StartMethod) -> None:
        super().__init__(config)
        self.services = services
        self.method = method
        self.exit_code = 0
        self.wiring: EngineWiring | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._draining = False
        self._tasks: set[asyncio.Task[None]] = set()

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets)
        self._loop = asyncio.get_running_loop()
        self._spawn(self.boot())

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def boot(self) -> None:
        svc, startup, settings = self.services, self.services.startup, self.services.settings
        loop = asyncio.get_running_loop()

        def on_fatal(reason: str) -> None:  # called from the supervisor thread
            loop.call_soon_threadsafe(self._spawn, self.fail(reason))

        wiring = self.wiring = EngineWiring(svc, on_fatal)
        wiring.client = EngineClient(loop, svc.executor, wiring)
        wiring.supervisor = EngineSupervisor(settings, startup, self.method, wiring)
        engine_started = asyncio.wrap_future(_in_thread(wiring.supervisor.start_engines, "engine-start"))
        try:
            folder, tokenizers = await svc.off_loop(_load_model_side, settings.model_path)
            await engine_started
        except Exception as exc:
            wiring.supervisor.abort()  # no engine is forked for a model that failed
            engine_started.add_done_callback(lambda f: f.cancelled() or f.exception())  # nobody awaits it now
            if not self._draining:
                failed = "warmup" if startup.state("warmup") == "running" else "engine"
                message = str(exc) if isinstance(exc, ModelError | EngineStartError) else repr(exc)
                startup.fail(failed, message)
                await self.fail(message)
            return
        svc.models[settings.model_name] = ServedModel(settings.model_name, folder, tokenizers, wiring.client)
        startup.start("ready")
        startup.done("ready", model=settings.model_name, kind=folder.kind)
        log.info("ready", summary=startup.summary())

    async def fail(self, reason: str) -> None:
        """Keep /health/startup up for fail_linger seconds so people can read why, then exit 1."""
        self.exit_code = 1
        log.error("startup_failed", reason=reason, exit_in_s=self.services.settings.fail_linger)
        await asyncio.sleep(self.services.settings.fail_linger)
        await self.shutdown_engines()
        self.should_exit = True

    async def drain(self) -> None:
        """Readiness 503 at once, new work 503, in-flight work finishes, then engines stop."""
        svc = self.services
        svc.startup.draining = True
        log.info("draining", in_flight=svc.in_flight, timeout_s=svc.settings.drain_timeout)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + svc.settings.drain_timeout
        while svc.in_flight > 0 and loop.time() < deadline:
            await asyncio.sleep(0.02)
        if svc.in_flight:
            log.warning("drain_timeout", in_flight=svc.in_flight)
        await self.shutdown_engines()  # what is still waiting for an engine is answered 503
        log.info("drained")
        self.should_exit = True

    async def shutdown_engines(self) -> None:
        """Pending inputs are answered 503, then engines and the forkserver stop."""
        wiring = self.wiring
        if wiring is not None and wiring.client is not None:
            wiring.client.stop()
        if wiring is not None and wiring.supervisor is not None:
            await asyncio.wrap_future(_in_thread(wiring.supervisor.stop, "engine-stop"))

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        if self._draining or self._loop is None:
            self.force_exit = self._draining and sig == signal.SIGINT
            self.should_exit = True
            return
        self._draining = True
        log.info("signal", signal=signal.Signals(sig).name)
        self._loop.call_soon_threadsafe(self._spawn, self.drain())


def _load_model_side(path: Path) -> tuple[ModelFolder, TokenizerPool]:
    """What the HTTP process needs of the model: its config and its tokenizer (no weights)."""
    return read_model_folder(path), TokenizerPool(path)


def _in_thread(fn: Callable[[], None], name: str) -> Future[None]:
    future: Future[None] = Future()

    def target() -> None:
        try:
            fn()
        except BaseException as exc:
            future.set_exception(exc)
        else:
            future.set_result(None)

    threading.Thread(target=target, name=name, daemon=True).start()
    return future


def run_server(
    settings: Settings,
    startup: StartupState,
    sock: socket.socket,
    early: EarlyResponder,
    method: StartMethod,
) -> int:
    """Serve on the bound socket until drained or failed; the exit code for the process."""
    executor = ThreadPoolExecutor(settings.executor_threads, thread_name_prefix="warmpool-exec")
    svc = Services(settings=settings, startup=startup, executor=executor)
    config = uvicorn.Config(
        with_middleware(create_app(svc)),
        log_config=None,
        access_log=False,
        lifespan="off",
        timeout_keep_alive=30,
        http=with_header_timeout(settings.read_timeout),
        # The drain has already waited for in-flight work and answered the rest 503: uvicorn only
        # closes connections, so SIGTERM exits within WARMPOOL_DRAIN_TIMEOUT + ~2 s.
        timeout_graceful_shutdown=1,
    )
    config.load()
    server = LifecycleServer(config, svc, method)
    early.stop()
    server.run(sockets=[sock])
    executor.shutdown(wait=False, cancel_futures=True)
    log.info("exit", code=server.exit_code)
    return server.exit_code
