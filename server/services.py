"""What every route shares: settings, the startup state, the executor, metrics and the served models."""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import ParamSpec, TypeVar

from fastapi import Request

from common.modelfolder import ModelFolder
from common.settings import Settings
from common.startup import StartupState
from server.admission import Admission
from server.engine_client import BatchStats, EngineClient
from server.errors import APIError
from server.metrics import Metrics
from server.tokenizer import TokenizerPool

P = ParamSpec("P")
R = TypeVar("R")


@dataclass(frozen=True)
class ServedModel:
    """One model behind the port: the name clients use, its folder, its tokenizers, its engines."""

    name: str
    folder: ModelFolder
    tokenizers: TokenizerPool
    engine: EngineClient


@dataclass
class Services:
    settings: Settings
    startup: StartupState
    executor: ThreadPoolExecutor
    models: dict[str, ServedModel] = field(default_factory=dict)  # in the order they were configured
    in_flight: int = 0  # HTTP requests being answered; draining waits for 0
    admission: Admission = field(init=False)
    metrics: Metrics = field(init=False)

    def __post_init__(self) -> None:
        self.admission = Admission(self.settings.admission_permits)
        self.metrics = Metrics(self.startup.snapshot)
        self.metrics.in_flight.set_function(lambda: self.admission.used)
        self.metrics.queue_depth.set_function(lambda: sum(m.engine.queued_inputs for m in self.models.values()))

    def batch_done(self, stats: BatchStats) -> None:
        """Batch statistics from an engine client (on its reader thread) into the metrics."""
        self.metrics.batch_size.observe(stats.batch_size)
        self.metrics.batch_tokens.observe(stats.batch_tokens)

    async def off_loop(self, fn: Callable[P, R], *args: P.args, **kwargs: P.kwargs) -> R:
        """fn on the executor (parsing, tokenizing, response building): the loop stays free."""
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self.executor, functools.partial(fn, *args, **kwargs))

    def default_model(self) -> ServedModel:
        """The first configured model, or 503 while starting, recovering or draining."""
        if not self.startup.serving or not self.models:
            self.metrics.rejections.labels(reason=self.startup.status()).inc()
            raise self.unavailable()
        return next(iter(self.models.values()))

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
