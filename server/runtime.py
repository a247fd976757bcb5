"""What every route shares: settings, phases, the executor, the engine client, the loaded model."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, ParamSpec, TypeVar

from fastapi import Request
from fastapi.responses import Response

from orchestrator.phases import Phases
from orchestrator.settings import Settings
from server.admission import Admission
from server.errors import APIError, ClientDisconnected
from server.ipc import BatchStats, EngineClient, EngineFailed, EngineUnavailable, Outcome
from server.metrics import Metrics
from server.modelinfo import ModelInfo
from server.processing import make_async
from server.tokenizer import TokenizerPool, Tokens

P = ParamSpec("P")
R = TypeVar("R")


@dataclass
class Timings:
    started: float = field(default_factory=time.perf_counter)
    tokenization_ms: float = 0.0
    queue_ms: float = 0.0
    inference_ms: float = 0.0

    def headers(self) -> dict[str, str]:
        total = (time.perf_counter() - self.started) * 1000
        return {
            "x-total-time": f"{total:.0f}",
            "x-tokenization-time": f"{self.tokenization_ms:.0f}",
            "x-queue-time": f"{self.queue_ms:.0f}",
            "x-inference-time": f"{self.inference_ms:.0f}",
        }


@dataclass
class Runtime:
    settings: Settings
    phases: Phases
    executor: ThreadPoolExecutor
    engine: EngineClient | None = None
    model: ModelInfo | None = None
    tokenizers: TokenizerPool | None = None
    in_flight: int = 0  # HTTP requests being answered; draining waits for 0
    admission: Admission = field(init=False)
    metrics: Metrics = field(init=False)

    def __post_init__(self) -> None:
        self.admission = Admission(self.settings.admission_permits)
        self.metrics = Metrics(self.phases.snapshot)
        self.metrics.in_flight.set_function(lambda: self.admission.used)
        self.metrics.queue_depth.set_function(lambda: self.engine.queued_inputs if self.engine else 0)

    def attach_engine(self, engine: EngineClient) -> None:
        """Batch statistics flow from the engine client into the metrics."""
        self.engine = engine

        def on_batch(stats: BatchStats) -> None:
            self.metrics.batch_size.observe(stats.batch_size)
            self.metrics.batch_tokens.observe(stats.batch_tokens)

        engine.on_batch = on_batch

    async def run(self, fn: Callable[P, R], *args: P.args, **kwargs: P.kwargs) -> R:
        """fn on the executor (tokenizing, validation, response building)."""
        return await make_async(fn, self.executor)(*args, **kwargs)

    def loaded(self) -> tuple[ModelInfo, TokenizerPool]:
        """The model, or 503 while starting, recovering or draining."""
        if not self.phases.serving or self.model is None or self.tokenizers is None:
            self.metrics.rejections.labels(reason=self.phases.status()).inc()
            raise self.unavailable()
        return self.model, self.tokenizers

    def unavailable(self, message: str | None = None) -> APIError:
        status = self.phases.status()
        phase = self.phases.current()
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

    async def pool(
        self,
        tokens: list[Tokens],
        timings: Timings,
        abandon: asyncio.Future[Any] | None = None,
        then: Callable[[Outcome], Any] | None = None,
    ) -> Outcome:
        """Send inputs to the engine and wait; engine loss and timeouts become 503, never a hang.

        If `abandon` finishes first (the client left), the engine drops the inputs. `then` runs on
        the executor on the engine's output (EngineClient.submit); its result comes back in
        `Outcome.rendered`. One await on the engine's future, with a timer and a callback, instead
        of wait_for inside asyncio.wait: two tasks and their wake-ups fewer per request.
        """
        if self.engine is None:
            raise self.unavailable()
        try:
            future, keys = self.engine.submit(tokens, then)
        except EngineUnavailable:
            raise self.unavailable() from None
        stopped_by: str | None = None  # why this method cancelled the future, if it did

        def stop(why: str) -> None:
            nonlocal stopped_by
            if not future.done():
                stopped_by = why
                future.cancel()

        timer = asyncio.get_running_loop().call_later(self.settings.request_timeout, stop, "timeout")
        if abandon is not None:
            abandon.add_done_callback(lambda _: stop("client_gone"))
        try:
            outcome = await future
        except asyncio.CancelledError:
            self.engine.cancel(keys)
            if stopped_by == "timeout":
                raise self.unavailable("timed out waiting for the engine") from None
            if stopped_by == "client_gone":
                self.metrics.disconnects.inc()
                raise ClientDisconnected() from None
            raise
        except EngineUnavailable as exc:
            raise self.unavailable(str(exc)) from None
        except EngineFailed as exc:
            raise APIError(500, f"the engine failed on this batch: {exc}", code="engine_error") from None
        finally:
            timer.cancel()
        timings.queue_ms = outcome.queue_ms
        timings.inference_ms = outcome.inference_ms
        self.metrics.queue_time.observe(outcome.queue_ms / 1000)
        self.metrics.inference_time.observe(outcome.inference_ms / 1000)
        return outcome


def runtime(request: Request) -> Runtime:
    rt: Runtime = request.app.state.runtime
    return rt


def json_response(body: bytes, timings: Timings | None = None) -> Response:
    headers = timings.headers() if timings else None
    return Response(content=body, media_type="application/json", headers=headers)
