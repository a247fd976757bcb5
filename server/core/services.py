"""What every route shares: settings, the startup state, the executor, metrics and the served models."""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ParamSpec, Protocol, TypeVar

from fastapi import Request

from common.modelfolder import ModelFolder
from common.settings import Settings, cache_bound
from common.startup import StartupState
from server.core.adapters import AdapterSet
from server.core.admission import Admission
from server.core.cached_run import ResultCache
from server.core.engine_client import EngineClient
from server.core.engine_events import BatchStats
from server.core.engine_turns import Turns
from server.http.errors import APIError
from server.http.metrics import Metrics
from server.http.tracing import Tracing
from server.tokenizing.tokenizer import TokenizerPool

if TYPE_CHECKING:
    from server.batches.runner import BatchRunner
    from server.tenants.guard import KeySource
    from server.tenants.watcher import KeysWatcher

P = ParamSpec("P")
R = TypeVar("R")
SWITCH_POLL_S = 0.02  # how often a request waiting for a switch between models on demand looks again


@dataclass(frozen=True)
class ServedModel:
    """One model behind the port: the name clients use, its folder, its tokenizers, its engines."""

    name: str
    folder: ModelFolder
    tokenizers: TokenizerPool
    engine: EngineClient
    admission: Admission | None = None  # its own permits, with several models; else the server's
    # its LoRA adapters: a request naming one is served by this model, the adapter applied; None: none ever
    adapters: AdapterSet | None = None
    turns: Turns = field(default_factory=Turns)  # a demoted tenant's requests wait for the others' here

    def serves_adapter(self, name: str) -> bool:
        return self.adapters is not None and name in self.adapters


class ModelLoader(Protocol):
    """Models loaded and unloaded on demand within the memory budget: the orchestrator installs one
    (orchestrator/ondemand.py); the server only asks it. Errors leave as APIError."""

    def wakes(self, name: str) -> bool:
        """A request naming this configured model waits for its load (rather than a 503 at once)."""
        ...

    async def until_loaded(self, name: str, retry: bool = False) -> None:
        """Load the model unless it serves (one load however many ask), and wait for it at most
        WARMPOOL_LOAD_WAIT: 503 with Retry-After past it, 400 for a model larger than the budget.
        A model whose load failed is tried again only when `retry` (the admin API): else 503."""
        ...

    async def unload(self, name: str) -> None:
        """Unload the model (its in-flight requests finish first); nothing when it is not loaded."""
        ...

    def describe(self, name: str) -> dict[str, Any]:
        """state (ready, starting, loading, unloading, unloaded, failed), resident, memory_bytes, last_used."""
        ...

    def loading(self) -> bool:
        """A model is loading on demand (while none serves: the last one was unloaded to make room for it)."""
        ...


@dataclass
class Services:
    settings: Settings
    startup: StartupState
    executor: ThreadPoolExecutor
    models: dict[str, ServedModel] = field(default_factory=dict)  # those ready to serve
    configured: list[str] = field(default_factory=list)  # every model's name, the default first
    in_flight: int = 0  # HTTP requests being answered; draining waits for 0
    # Requests whose body is still arriving, and those of them the drain ended (pipeline.read_body)
    body_reads: set[asyncio.Task[Any]] = field(default_factory=set)
    body_reads_ended: set[asyncio.Task[Any]] = field(default_factory=set)
    tracing: Tracing | None = None  # WARMPOOL_OTLP_ENDPOINT set: spans per request (server/http/tracing.py)
    keys: KeysWatcher | None = None  # WARMPOOL_API_KEYS_FILE's tenants, reloaded on change (server/tenants/)
    key_source: KeySource | None = None  # whoever checks keys: the keys file, or WARMPOOL_API_KEY alone
    # the start is over: every model has started or failed, or the start failed, or the server drains
    booted: asyncio.Event = field(default_factory=asyncio.Event)
    held: int = 0  # requests waiting for the start to end (WARMPOOL_HOLD_DURING_START)
    loader: ModelLoader | None = None  # set by the orchestrator: models on demand
    last_used: dict[str, float] = field(default_factory=dict)  # model -> time.time() of its last answer
    batches: BatchRunner | None = None  # the Batch API's jobs (server/http/app.py makes it)
    # the result cache's bound, out of the memory budget (the orchestrator's); None: WARMPOOL_CACHE_BYTES alone
    cache_bytes: int | None = None
    admission: Admission = field(init=False)
    metrics: Metrics = field(init=False)
    cache: ResultCache | None = field(init=False)  # None: WARMPOOL_CACHE_BYTES=0

    def __post_init__(self) -> None:
        self.admission = Admission(self.settings.admission_permits, self.settings.priority_reserve)
        self.metrics = Metrics(self.startup.snapshot, lambda: self.configured[0] if self.configured else "", self.ready)
        self.metrics.in_flight.set_function(
            lambda: self.admission.used + sum(m.admission.used for m in self.models.values() if m.admission)
        )
        self.metrics.queue_depth.set_function(lambda: sum(m.engine.queued_inputs for m in self.models.values()))
        bound = self.cache_bytes if self.cache_bytes is not None else cache_bound(self.settings.cache_bytes, None)
        self.cache = ResultCache(self.settings, bound, self.metrics, self.executor) if bound > 0 else None

    def end_body_reads(self) -> int:
        """Cancel every body read still waiting for bytes; each answers 503 (pipeline.read_body)."""
        for task in self.body_reads:
            self.body_reads_ended.add(task)
            task.cancel()
        return len(self.body_reads)

    def batch_done(self, model: str, stats: BatchStats) -> None:
        """Batch statistics from a model's engine client (on its reader thread) into the metrics."""
        self.metrics.batch_size.labels(model=model).observe(stats.batch_size)
        self.metrics.batch_tokens.labels(model=model).observe(stats.batch_tokens)

    async def off_loop(self, fn: Callable[P, R], *args: P.args, **kwargs: P.kwargs) -> R:
        """fn on the executor (parsing, tokenizing, response building): the loop stays free."""
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self.executor, functools.partial(fn, *args, **kwargs))

    def holding(self) -> bool:
        """Requests are held, not refused: WARMPOOL_HOLD_DURING_START=on and the start not over
        (neither failed nor drained: those end it, and wake every held request, LifecycleServer)."""
        startup = self.startup
        return (
            self.settings.hold_during_start == "on"
            and not self.booted.is_set()
            and not startup.failed
            and not startup.draining
        )

    async def until_booted(self) -> None:
        """Wait for every model to have started (or failed), at most WARMPOOL_LOAD_WAIT: 503 past it."""
        try:
            await asyncio.wait_for(self.booted.wait(), self.settings.load_wait)
        except TimeoutError:
            self.metrics.rejections.labels(reason="load_wait").inc()
            raise self.unavailable(
                f"still starting after WARMPOOL_LOAD_WAIT ({self.settings.load_wait:g} s): retry later"
            ) from None

    async def serving_model(self) -> ServedModel:
        """default_model(), at once where a model serves; else, where requests are held
        (holding()), once the start is over: at most as many held at once as the admission permits,
        the rest refused as without holding."""
        serving = self.startup.accepting and self.models
        if not serving and (self.holding() or self.switching()) and self.held < self.settings.admission_permits:
            self.held += 1
            try:
                await (self.until_booted() if self.holding() else self.until_switched())
            finally:
                self.held -= 1
        return self.default_model()

    def ready(self) -> bool:
        """What /health/ready answers: an engine can serve and we are neither draining nor failed;
        or no model serves only because one on demand loads in place of the one unloaded for it
        (switching()), its requests held meanwhile."""
        startup = self.startup
        return startup.serving or (startup.started and self.switching())

    def switching(self) -> bool:
        """No model serves because the last one loaded was unloaded for the one loading now (models
        on demand whose budget holds one of them): requests wait for it rather than a 503."""
        startup = self.startup
        return self.loader is not None and self.loader.loading() and not startup.failed and not startup.draining

    async def until_switched(self) -> None:
        """Wait while switching() and no model serves, at most WARMPOOL_LOAD_WAIT (then default_model's 503)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.settings.load_wait
        while self.switching() and not (self.startup.accepting and self.models) and loop.time() < deadline:
            await asyncio.sleep(SWITCH_POLL_S)

    def default_model(self) -> ServedModel:
        """The first configured model that serves (the first ready one while it starts), or 503
        while none can: starting, recovering, draining. A request naming another model selects it."""
        if not self.startup.accepting or not self.models:
            self.metrics.rejections.labels(reason=self.startup.status()).inc()
            raise self.unavailable()
        name = next((n for n in self.configured if n in self.models), None)
        return self.models[name] if name is not None else next(iter(self.models.values()))

    def unavailable(self, message: str | None = None) -> APIError:
        """503 with Retry-After, saying which state or phase holds the server up."""
        status = self.startup.status()
        phase = self.startup.current()
        text = message or {
            "draining": "server is shutting down",
            "recovering": "the engine is restarting",
            "failed": f"startup failed in phase '{phase}'",
        }.get(status, f"server is starting (phase '{phase}')")
        return APIError(
            503,
            text,
            code="not_ready",
            headers={"Retry-After": "1"},
            extra={"status": status, "phase": phase},
        )


def services(request: Request) -> Services:
    found: Services = request.app.state.services
    return found
