"""The real app in this process: create_app with its middleware, the orchestrator's engine wiring,
and each model's real engine loop (engine.process.run_engine) on a thread over a real Pipe.

With `grpc_port` set, TEI's gRPC API listens on that port, on the app's loop, as in the server.
What it leaves out is what only processes have: uvicorn's HTTP parsing, signals, the forkserver,
prefetch, supervision and restarts (tests/ starts real servers for those). Requests go through
starlette's TestClient, an httpx.Client: client packages take it as their HTTP client.
"""

from __future__ import annotations

import asyncio
import contextlib
import multiprocessing
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

from starlette.testclient import TestClient

from common import m3
from common.settings import Settings
from common.startup import StartupState
from common.wire import Msg
from engine.process import run_engine
from orchestrator.forkserver import StartMethod
from orchestrator.lifecycle import EngineWiring, _load_model_side
from orchestrator.supervisor import EngineSupervisor
from server.core.adapters import model_adapters
from server.core.admission import Admission
from server.core.engine_client import EngineClient
from server.core.services import ServedModel, Services
from server.http.app import create_app, with_middleware
from tests.server_process import DEFAULT_SETTINGS, Served

START_TIMEOUT_S = 120.0  # an engine's load and warm-up on a loaded 2-core machine
STOP_TIMEOUT_S = 30.0
URL = "http://testserver"  # TestClient's host: only a name, nothing listens


class InProcessServer(Served):
    """A serving app as tests/ sees a ServerProcess: `client`, `url`, get/post, startup, batches."""

    def __init__(self, client: TestClient, services: Services) -> None:
        self.client = client
        self.url = URL
        self.services = services


@dataclass
class _Engine:
    wiring: EngineWiring
    thread: threading.Thread


def settings_for(model: Path | str, **overrides: Any) -> Settings:
    """The server's settings as `serving(model, log, **overrides)` would give them: compiling off
    (tests/test_compiled_engine.py compiles), one engine per model (one thread each), the tests'
    compile cache (tests/conftest.py: not the user's)."""
    values: dict[str, Any] = {"model": str(model), "compile": "off", "engines": 1}
    if "compile_cache" in DEFAULT_SETTINGS:
        values["compile_cache"] = DEFAULT_SETTINGS["compile_cache"]
    values.update(overrides)
    return Settings(_cli_parse_args=[], **values)  # type: ignore[call-arg]


@contextlib.contextmanager
def serving(model: Path | str, **overrides: Any) -> Iterator[InProcessServer]:
    """The app serving `model` (and WARMPOOL_MODELS' others) until the block ends; then every
    engine is told to stop and its thread joined."""
    settings = settings_for(model, **overrides)
    models = settings.per_model()
    startup = StartupState([m.model_name for m in models] if settings.models else None)
    startup.start("bind")
    startup.done("bind", host="testserver", port=0)
    executor = ThreadPoolExecutor(settings.executor_threads, thread_name_prefix="warmpool-exec")
    svc = Services(settings=settings, startup=startup, executor=executor)
    svc.configured = [m.model_name for m in models]
    engines: list[_Engine] = []
    try:
        with TestClient(with_middleware(create_app(svc)), base_url=URL, raise_server_exceptions=False) as client:
            assert client.portal is not None
            loop = client.portal.call(asyncio.get_running_loop)
            for model_settings in models:
                engines.append(_boot_model(svc, model_settings, loop, several=len(models) > 1))
            if len(models) > 1:  # the appliance's own ready phase, as LifecycleServer.boot ends it
                startup.start("ready")
                startup.done("ready", models=list(svc.models))
            client.portal.call(svc.booted.set)
            grpc = client.portal.call(_start_grpc, svc) if settings.grpc_port is not None else None
            try:
                yield InProcessServer(client, svc)
            finally:
                if grpc is not None:
                    client.portal.call(grpc.stop, 0)
    finally:
        for engine in engines:
            assert engine.wiring.client is not None
            engine.wiring.client.stop()
        for engine in engines:
            engine.thread.join(STOP_TIMEOUT_S)
            assert not engine.thread.is_alive(), "an engine thread did not stop"
        executor.shutdown(wait=False, cancel_futures=True)


async def _start_grpc(svc: Services) -> Any:
    """TEI's gRPC API on the app's own loop, as LifecycleServer.startup starts it."""
    from server.grpc.server import GrpcServer

    server = GrpcServer(svc)
    await server.start()
    return server


def _boot_model(svc: Services, settings: Settings, loop: asyncio.AbstractEventLoop, several: bool) -> _Engine:
    """One model as LifecycleServer.boot_model serves it, its engine on a thread: the supervisor
    object gives the engine's spec and shared busy slots and takes its events, but forks nothing."""
    name = settings.model_name
    phases = svc.startup.for_model(name)
    phases.skip("prefetch", "in-process test app")
    wiring = EngineWiring(svc, phases, on_fatal=lambda reason: None)
    wiring.client = EngineClient(loop, svc.executor, wiring, adapters=settings.adapter_folders)
    wiring.supervisor = EngineSupervisor(settings, phases, StartMethod(multiprocessing.get_context("fork")), wiring)
    wiring.client.busy = wiring.supervisor.busy
    phases.start("forkserver", method="thread")
    phases.done("forkserver")
    parent, child = multiprocessing.Pipe(duplex=True)
    spec = wiring.supervisor.spec(0)
    thread = threading.Thread(
        target=run_engine, args=(child, spec, wiring.supervisor.busy), name=f"engine-{name}", daemon=True
    )
    thread.start()
    phases.start("engine", engines=1)
    loaded = _expect(parent, Msg.LOADED)
    phases.done("engine", **loaded)
    phases.start("warmup")
    warmup = _expect(parent, Msg.READY)
    phases.done("warmup", **{k: v for k, v in warmup.items() if k != "compile"})
    wiring.engine_ready(0, parent, warmup)
    phases.engine_up = True
    folder, tokenizers = _load_model_side(settings.model_path)
    folder = m3.as_loaded(folder, loaded)
    admission = Admission(settings.admission_permits, settings.priority_reserve) if several else None
    adapters = model_adapters(name, wiring.client, settings, loaded, svc.metrics, phases)
    svc.models[name] = ServedModel(name, folder, tokenizers, wiring.client, admission, adapters)
    phases.start("ready")
    phases.done("ready", model=name, kind=folder.kind)
    adapters.publish()
    return _Engine(wiring, thread)


def _expect(conn: Connection, wanted: str) -> dict[str, Any]:
    """The engine's next start-up message of kind `wanted`, within START_TIMEOUT_S."""
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if conn.poll(0.1):
            kind, body = conn.recv()
            if kind == Msg.FAILED:
                raise RuntimeError(f"engine failed to start: {body[0]}\n{body[1] or ''}")
            if kind == wanted:
                return dict(body)
    raise TimeoutError(f"no {wanted} from the engine within {START_TIMEOUT_S:.0f} s")
