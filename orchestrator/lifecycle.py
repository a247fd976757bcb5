"""uvicorn on the early-bound socket, plus warmpool's boot, supervision wiring, drain and exit codes."""

from __future__ import annotations

import asyncio
import gc
import signal
import socket
import threading
from collections.abc import Callable, Coroutine
from concurrent.futures import Future, ThreadPoolExecutor
from multiprocessing.connection import Connection
from pathlib import Path
from types import FrameType
from typing import Any, TypeVar

import structlog
import uvicorn

from common import m3
from common.folderjson import ModelError
from common.modelfolder import ModelFolder, read_model_folder
from common.settings import Settings
from common.startup import ModelPhases, StartupState
from orchestrator.binding import EarlyResponder
from orchestrator.forkserver import StartMethod
from orchestrator.ondemand import ModelPool
from orchestrator.supervisor import EngineStartError, EngineSupervisor
from server.core.adapters import model_adapters
from server.core.admission import Admission
from server.core.engine_client import BatchStats, EngineClient
from server.core.engine_modes import EAGER
from server.core.services import ServedModel, Services
from server.http import tracing
from server.http.app import create_app, with_middleware
from server.http.request_head import with_head_limits
from server.tokenizing.tokenizer import TokenizerPool

log = structlog.get_logger("warmpool.lifecycle")

T = TypeVar("T")


class EngineWiring:
    """Connects one model's engine client and its supervisor, which know nothing of each other:
    the client's events go to the supervisor and the metrics, the supervisor's to the client."""

    def __init__(self, services: Services, phases: ModelPhases, on_fatal: Callable[[str], None]) -> None:
        self.services = services
        self.phases = phases
        self.on_fatal = on_fatal
        self.client: EngineClient | None = None
        self.supervisor: EngineSupervisor | None = None
        self._compiles: dict[int, dict[str, Any]] = {}
        self._compiles_lock = threading.Lock()
        self.retired = False  # the model was unloaded: its engines' exits are no losses

    # EngineEvents (engine client, on its reader threads)
    def batch_done(self, stats: BatchStats) -> None:
        self.services.batch_done(self.phases.model, stats)

    def engine_lost(self, slot: int) -> None:
        assert self.supervisor is not None
        if self.retired:
            return
        self.engine_compile(slot, None)  # compiled or not, it serves nothing now
        self.supervisor.engine_lost(slot)

    def engine_stalled(self, slot: int, seconds: float) -> None:
        assert self.supervisor is not None
        self.services.metrics.stalls.labels(model=self.phases.model).inc()
        self.supervisor.kill(slot, f"no answer for {seconds:.1f} s with work outstanding", seconds)

    def engines_stalled(self, slots: list[int], every: bool) -> None:
        # Shown, not made a readiness failure: with every engine briefly slower than a quarter of
        # the stall timeout on a loaded machine, readiness flapped (the chaos test, 2 cores).
        self.phases.update("engine", stalled=slots)

    def engine_compile(self, slot: int, detail: dict[str, Any] | None) -> None:
        """The compile phase from every engine's last word (None: the engine is gone): running
        while any compiles, done while every engine up is compiled (one started later reports in
        turn), else skipped with the reason an engine stayed eager."""
        with self._compiles_lock:
            if detail is None:
                self._compiles.pop(slot, None)
            else:
                self._compiles[slot] = detail
            engines = {str(s): d for s, d in sorted(self._compiles.items())}
            if any(d.get("compiling") for d in engines.values()):
                if self.phases.state("compile") == "running":
                    self.phases.update("compile", engines=engines)
                else:
                    self.phases.start("compile", engines=engines)
            elif any(d.get("reason") for d in engines.values()):
                reason = next(str(d["reason"]) for d in engines.values() if d.get("reason"))
                self.phases.skip("compile", reason, engines=engines)
            elif engines:
                self.phases.done("compile", engines=engines)

    # SupervisorEvents (supervisor threads)
    def engine_ready(self, slot: int, conn: Connection, warmup: dict[str, Any]) -> None:
        assert self.client is not None
        if warmup.get("compile"):
            self.engine_compile(slot, warmup["compile"])
        if self.client.stalls.timeout_s is None:  # the first engine's warm-up sizes the watchdog
            ms_per_token = float(warmup.get("ms_per_token", 0.0))
            timeout = self.services.settings.stall_timeout(ms_per_token, warmup.get("group_tokens"))
            self.client.stalls.group_s = ms_per_token * int(warmup.get("group_tokens") or 0) / 1000
            self.client.stalls.timeout_s = timeout
            self.phases.update("engine", stall_timeout_s=round(timeout, 1), stalled=[])
        self.client.attach(slot, conn, (warmup.get("compile") or {}).get("mode", EAGER))

    def engine_restarted(self, slot: int) -> None:
        self.services.metrics.restarts.labels(model=self.phases.model).inc()

    def gave_up(self, reason: str) -> None:
        assert self.client is not None
        self.client.fail_all("the engine could not be restarted")
        self.on_fatal(reason)


class LifecycleServer(uvicorn.Server):
    """uvicorn's server that also boots the engines after it starts, drains on SIGTERM/SIGINT and
    keeps a failed start readable for fail_linger seconds before exiting 1."""

    def __init__(
        self,
        config: uvicorn.Config,
        services: Services,
        method: StartMethod,
        models: list[Settings],
        budget: int | None = None,
    ) -> None:
        super().__init__(config)
        self.services = services
        self.method = method
        self.models = models  # one settings object per served model, in the configured order
        self.budget = budget  # WARMPOOL_MEMORY_BUDGET in bytes (orchestrator/ondemand.py)
        self.pool: ModelPool | None = None
        self.exit_code = 0
        self.wirings: list[EngineWiring] = []
        self._loop: asyncio.AbstractEventLoop | None = None
        self._draining = False
        self._tasks: set[asyncio.Task[None]] = set()
        self.grpc: Any = None  # server.grpc.server.GrpcServer, with WARMPOOL_GRPC_PORT set

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets)
        self._loop = asyncio.get_running_loop()
        if self.services.settings.grpc_port is not None:
            from server.grpc.server import GrpcServer  # grpcio is imported only when the port is set

            try:
                self.grpc = GrpcServer(self.services)
            except RuntimeError as exc:  # its port is taken: the start fails as a taken HTTP port fails it
                reason = f"cannot listen for gRPC on port {self.services.settings.grpc_port}: {exc}"
                self.services.startup.fail("bind", reason)
                self._spawn(self.fail(reason))
                return
            await self.grpc.start()
        self.pool = ModelPool(self, self.models, self.budget)
        self.services.loader = self.pool
        self._spawn(self.boot())

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def boot(self) -> None:
        """Every model boots at once, each on its own phases; each serves as soon as it is ready."""
        startup = self.services.startup
        assert self.pool is not None
        booted = await self.pool.boot()  # the models that fit the memory budget; the rest load on demand
        if any(m.keep_alive is not None and m.resident == "auto" for m in self.models):
            self._spawn(self.pool.keep_alive())
        self.services.booted.set()  # held requests (WARMPOOL_HOLD_DURING_START) go on: served, or refused
        if self.services.batches is not None and not self._draining:
            self.services.batches.start()  # jobs a stop or a crash interrupted resume
        if len(self.models) > 1 and any(booted) and not startup.failed and not self._draining:
            startup.start("ready")
            startup.done("ready", models=[s.model_name for s, ok in zip(self.models, booted, strict=True) if ok])
        elif len(self.models) > 1 and not any(booted) and not startup.failed and not self._draining:
            reason = "no model started: each failed, or none fits WARMPOOL_MEMORY_BUDGET"
            startup.fail("ready", reason)
            await self.fail(reason)
        if any(booted):
            # What the start built lives as long as the process: frozen out of the collector's view, a
            # full collection scans only what came after (one over all of it took 30-40 ms on 2 cores
            # of an AMD Zen 4, a pause of the event loop and of every request and probe on it).
            gc.freeze()
            log.info("ready", summary=startup.summary(), frozen_objects=gc.get_freeze_count())

    async def boot_model(self, settings: Settings) -> bool:
        """One model: its tokenizer here, its engines forked; True once it serves."""
        svc, name = self.services, settings.model_name
        phases = svc.startup.for_model(name)
        loop = asyncio.get_running_loop()

        def on_fatal(reason: str) -> None:  # called from the supervisor thread
            loop.call_soon_threadsafe(self._spawn, self.model_lost(name, reason))

        wiring = EngineWiring(svc, phases, on_fatal)
        self.wirings.append(wiring)
        wiring.client = EngineClient(loop, svc.executor, wiring, adapters=settings.adapter_folders)
        wiring.supervisor = EngineSupervisor(settings, phases, self.method, wiring)
        wiring.client.busy = wiring.supervisor.busy
        engine_started = asyncio.wrap_future(_in_thread(wiring.supervisor.start_engines, f"engine-start-{name}"))
        try:
            folder, tokenizers = await svc.off_loop(_load_model_side, settings.model_path)
            loaded = await engine_started
            folder = m3.as_loaded(folder, loaded)  # bge-m3's heads: refused or not
        except Exception as exc:
            wiring.supervisor.abort()  # no engine is forked for a model that failed
            engine_started.add_done_callback(lambda f: f.cancelled() or f.exception())  # nobody awaits it now
            if not self._draining:
                failed = "warmup" if phases.state("warmup") == "running" else "engine"
                message = str(exc) if isinstance(exc, ModelError | EngineStartError) else repr(exc)
                phases.fail(failed, message)
                await self.model_lost(name, message)
            return False
        admission = Admission(settings.admission_permits, settings.priority_reserve) if len(self.models) > 1 else None
        adapters = model_adapters(name, wiring.client, settings, loaded, svc.metrics, phases)
        svc.models[name] = ServedModel(name, folder, tokenizers, wiring.client, admission, adapters)
        phases.start("ready")
        phases.done("ready", model=name, kind=folder.kind)
        adapters.publish()  # its adapters in the ready phase's detail
        return True

    def wiring(self, name: str) -> EngineWiring | None:
        """The model's engine client and supervisor, while it is loaded."""
        return next((w for w in self.wirings if w.phases.model == name), None)

    def retire(self, name: str) -> EngineWiring | None:
        """The model is being unloaded: its engines are no longer this server's to stop at exit."""
        wiring = self.wiring(name)
        if wiring is not None:
            self.wirings.remove(wiring)
        return wiring

    async def model_lost(self, name: str, reason: str) -> None:
        """A model failed to start or ran out of restarts: the appliance fails (exits after the
        linger), unless other models serve on: model failures are tolerated, or it loads on demand."""
        self.services.models.pop(name, None)
        if self.pool is not None:
            self.pool.lost(name)
        if self.services.startup.failed:
            await self.fail(reason)
        else:
            log.error("model_failed", model=name, reason=reason, serving=list(self.services.models))

    async def fail(self, reason: str) -> None:
        """Keep /health/startup up for fail_linger seconds so people can read why, then exit 1."""
        self.exit_code = 1
        self.services.booted.set()  # held requests get their 503 now, not after the linger
        log.error("startup_failed", reason=reason, exit_in_s=self.services.settings.fail_linger)
        await asyncio.sleep(self.services.settings.fail_linger)
        if self.grpc is not None:
            await self.grpc.stop(0)
        await self.shutdown_engines()
        self.should_exit = True

    async def drain(self, sig: int) -> None:
        """Readiness 503 at once, new work 503, in-flight work finishes, then engines stop."""
        log.info("signal", signal=signal.Signals(sig).name)
        svc = self.services
        svc.startup.draining = True
        svc.booted.set()  # held requests are answered 503 (draining) at once
        if svc.batches is not None:
            await svc.batches.stop()  # its running group is dropped: resumed from its last commit at the next start
        log.info("draining", in_flight=svc.in_flight, timeout_s=svc.settings.drain_timeout)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + svc.settings.drain_timeout
        if self.grpc is not None:  # NOT_SERVING at once; its calls in flight count in svc.in_flight
            await self.grpc.draining()
        while svc.in_flight > 0 and loop.time() < deadline:
            await asyncio.sleep(0.02)
        if svc.in_flight:
            log.warning("drain_timeout", in_flight=svc.in_flight)
        if svc.end_body_reads():  # uploads still arriving: answered 503 before uvicorn closes them
            ended = loop.time() + 1.0
            while svc.body_reads and loop.time() < ended:
                await asyncio.sleep(0.01)
        if self.grpc is not None:
            await self.grpc.stop(0)  # what is left are health watches, or calls past the drain timeout
        await self.shutdown_engines()  # what is still waiting for an engine is answered 503
        log.info("drained")
        self.should_exit = True

    async def shutdown_engines(self) -> None:
        """Pending inputs are answered 503, then every model's engines stop."""
        for wiring in self.wirings:
            if wiring.client is not None:
                wiring.client.stop()
        stops = [w.supervisor.stop for w in self.wirings if w.supervisor is not None]
        await asyncio.gather(*(asyncio.wrap_future(_in_thread(stop, "engine-stop")) for stop in stops))

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        """A signal handler: it runs between two bytecodes of the main thread, which may be holding
        a lock (the log's, mid-line) it would then wait on for good, so it takes none: no logging
        here, only flags and a wake-up of the loop (bench.startstop found SIGTERM ignored so)."""
        if self._draining or self._loop is None:
            self.force_exit = self._draining and sig == signal.SIGINT
            self.should_exit = True
            return
        self._draining = True
        self._loop.call_soon_threadsafe(self._spawn, self.drain(sig))


def _load_model_side(path: Path) -> tuple[ModelFolder, TokenizerPool]:
    """What the HTTP process needs of the model: its config and its tokenizer (no weights)."""
    folder = read_model_folder(path)
    return folder, TokenizerPool(folder.path, folder.pair_template, folder.late)  # a Router's: its encoder's


def _in_thread(fn: Callable[[], T], name: str) -> Future[T]:
    future: Future[T] = Future()

    def target() -> None:
        try:
            result = fn()
        except BaseException as exc:
            future.set_exception(exc)
        else:
            future.set_result(result)

    threading.Thread(target=target, name=name, daemon=True).start()
    return future


def run_server(
    settings: Settings,
    models: list[Settings],
    startup: StartupState,
    sock: socket.socket,
    early: EarlyResponder,
    method: StartMethod,
    budget: int | None = None,
    cache_bytes: int | None = None,
) -> int:
    """Serve on the bound socket until drained or failed; the exit code for the process. `budget`: what
    the models may hold, the result cache's `cache_bytes` taken out of WARMPOOL_MEMORY_BUDGET already."""
    executor = ThreadPoolExecutor(settings.executor_threads, thread_name_prefix="warmpool-exec")
    svc = Services(
        settings=settings,
        startup=startup,
        executor=executor,
        tracing=tracing.configure(settings),
        cache_bytes=cache_bytes,
    )
    if svc.tracing is not None:
        svc.tracing.watch_startup(startup)
    svc.configured = [m.model_name for m in models]
    config = uvicorn.Config(
        with_middleware(create_app(svc)),
        log_config=None,
        access_log=False,
        lifespan="off",
        timeout_keep_alive=30,
        http=with_head_limits(settings.read_timeout, settings.max_header_bytes, settings.max_headers),
        # The drain has already waited for in-flight work and answered the rest 503: uvicorn only
        # closes connections, so SIGTERM exits within WARMPOOL_DRAIN_TIMEOUT + ~2 s.
        timeout_graceful_shutdown=1,
    )
    config.load()
    server = LifecycleServer(config, svc, method, models, budget)
    early.stop()
    server.run(sockets=[sock])
    executor.shutdown(wait=False, cancel_futures=True)
    if svc.tracing is not None:
        svc.tracing.shutdown()
    log.info("exit", code=server.exit_code)
    return server.exit_code
