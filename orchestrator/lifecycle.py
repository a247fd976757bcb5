"""Bind early, boot in the background, drain on SIGTERM/SIGINT, exit with a code that means something."""

from __future__ import annotations

import asyncio
import signal
import socket
import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from types import FrameType

import structlog
import uvicorn

from orchestrator.binding import EarlyResponder
from orchestrator.forkserver import StartMethod
from orchestrator.phases import Phases
from orchestrator.settings import Settings
from orchestrator.workers import EngineStartError, Workers
from server.app import create_app, with_middleware
from server.ipc import EngineClient
from server.modelinfo import ModelError, ModelInfo, load_model_info
from server.runtime import Runtime
from server.tokenizer import TokenizerPool

log = structlog.get_logger("warmpool.lifecycle")


class Appliance(uvicorn.Server):
    """uvicorn's server plus warmpool's boot, supervision and drain."""

    def __init__(self, config: uvicorn.Config, rt: Runtime, method: StartMethod) -> None:
        super().__init__(config)
        self.rt = rt
        self.method = method
        self.exit_code = 0
        self.workers: Workers | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._draining = False
        self._tasks: set[asyncio.Task[None]] = set()

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets)
        self._loop = asyncio.get_running_loop()
        self._spawn(self.boot())

    def _spawn(self, coro: object) -> None:
        task = asyncio.ensure_future(coro)  # type: ignore[call-overload]
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def boot(self) -> None:
        rt, phases, settings = self.rt, self.rt.phases, self.rt.settings
        loop = asyncio.get_running_loop()
        rt.attach_engine(EngineClient(loop, rt.executor))
        assert rt.engine is not None
        workers = self.workers = Workers(settings, phases, rt.engine, self.method)

        def on_fatal(reason: str) -> None:  # called from the supervisor thread
            loop.call_soon_threadsafe(self._spawn, self.fail(reason))

        workers.on_fatal = on_fatal
        workers.on_restart = rt.metrics.restarts.inc
        engine_started = asyncio.wrap_future(_in_thread(workers.start_engines, "engine-start"))
        try:
            info, rt.tokenizers = await rt.run(_load_model_side, settings.model_path)
            rt.model = info
            await engine_started
        except Exception as exc:
            if not self._draining:
                failed = "warmup" if phases.state("warmup") == "running" else "engine"
                message = str(exc) if isinstance(exc, ModelError | EngineStartError) else repr(exc)
                phases.fail(failed, message)
                await self.fail(message)
            return
        phases.start("ready")
        phases.done("ready", model=settings.model_name, kind=info.kind)

    async def fail(self, reason: str) -> None:
        """Keep /health/startup up for fail_linger seconds so people can read why, then exit 1."""
        self.exit_code = 1
        log.error("startup_failed", reason=reason, exit_in_s=self.rt.settings.fail_linger)
        await asyncio.sleep(self.rt.settings.fail_linger)
        await self.shutdown_engines()
        self.should_exit = True

    async def drain(self) -> None:
        """Readiness 503 at once, new work 503, in-flight work finishes, then engines stop."""
        phases = self.rt.phases
        phases.draining = True
        log.info("draining", in_flight=self.rt.in_flight, timeout_s=self.rt.settings.drain_timeout)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.rt.settings.drain_timeout
        while self.rt.in_flight > 0 and loop.time() < deadline:
            await asyncio.sleep(0.02)
        if self.rt.in_flight:
            log.warning("drain_timeout", in_flight=self.rt.in_flight)
        await self.shutdown_engines()
        log.info("drained")
        self.should_exit = True

    async def shutdown_engines(self) -> None:
        if self.workers is not None:
            await asyncio.wrap_future(_in_thread(self.workers.stop, "engine-stop"))

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        if self._draining or self._loop is None:
            self.force_exit = self._draining and sig == signal.SIGINT
            self.should_exit = True
            return
        self._draining = True
        log.info("signal", signal=signal.Signals(sig).name)
        self._loop.call_soon_threadsafe(self._spawn, self.drain())


def _load_model_side(path: Path) -> tuple[ModelInfo, TokenizerPool]:
    """What the HTTP process needs of the model: its config and its tokenizer (no weights)."""
    return load_model_info(path), TokenizerPool(path)


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


def run(
    settings: Settings,
    phases: Phases,
    sock: socket.socket,
    early: EarlyResponder,
    method: StartMethod,
) -> int:
    """Serve on the bound socket until drained or failed; the exit code for the process."""
    executor = ThreadPoolExecutor(settings.executor_threads, thread_name_prefix="warmpool-exec")
    rt = Runtime(settings=settings, phases=phases, executor=executor)
    config = uvicorn.Config(
        with_middleware(create_app(rt)),
        log_config=None,
        access_log=False,
        lifespan="off",
        timeout_keep_alive=30,
        timeout_graceful_shutdown=max(int(settings.drain_timeout), 1),
    )
    config.load()
    server = Appliance(config, rt, method)
    early.stop()
    server.run(sockets=[sock])
    executor.shutdown(wait=False, cancel_futures=True)
    log.info("exit", code=server.exit_code)
    return server.exit_code
