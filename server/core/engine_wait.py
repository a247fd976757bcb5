"""A request's inputs on its model's engines: the wait for their answer, bounded by the request's
deadline and its client (engine loss, timeouts and an engine without the request's adapter become 503s,
never a hang), and the LoRA adapter it names held loaded while they run."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from typing import Any

from common.wire import Tokens
from server.core.engine_adapters import AdapterUnavailable
from server.core.engine_client import EngineFailed, EngineUnavailable
from server.core.inputs import RequestContext
from server.core.outcome import Outcome
from server.core.services import ServedModel, Services
from server.core.timings import Timings
from server.http.errors import APIError, ClientDisconnected


async def run_on_engine(
    svc: Services,
    model: ServedModel,
    tokens: list[Tokens],
    timings: Timings,
    abandon: asyncio.Future[Any] | None = None,
    then: Callable[[Outcome], Any] | None = None,
    deadline: float | None = None,
    tenant: str = "",
    demoted: bool = False,
) -> Outcome:
    """Send inputs to the model's engines and wait; engine loss and timeouts become 503, never a hang.

    If `abandon` finishes first (the client left), the engine drops the inputs. `then` runs on
    the executor on the engine's output (EngineClient.submit, told the `tenant`); its result comes back in
    `Outcome.rendered`. One await on the engine's future, with a timer and a callback, instead
    of wait_for inside asyncio.wait: two tasks and their wake-ups fewer per request. A `demoted` request
    (its tenant presses past its quota) lets the other interactive requests go first (server/core/engine_turns.py).
    """
    loop = asyncio.get_running_loop()
    if deadline is None:
        deadline = loop.time() + svc.settings.request_timeout
    held_ms = 0.0
    if demoted:
        held = loop.time()
        await model.turns.wait(deadline)
        held_ms = (loop.time() - held) * 1000
    with model.turns.counted(bool(tokens) and tokens[0].priority <= 0):
        outcome = await _answered(svc, model, tokens, abandon, then, deadline, tenant)
    svc.last_used[model.name] = time.time()  # what keep_alive and the least-recently-used choice read
    timings.queue_ms = outcome.queue_ms + held_ms
    timings.inference_ms = outcome.inference_ms
    svc.metrics.queue_time.labels(model=model.name).observe(timings.queue_ms / 1000)
    svc.metrics.inference_time.labels(model=model.name).observe(outcome.inference_ms / 1000)
    return outcome


async def _answered(
    svc: Services,
    model: ServedModel,
    tokens: list[Tokens],
    abandon: asyncio.Future[Any] | None,
    then: Callable[[Outcome], Any] | None,
    deadline: float,
    tenant: str,
) -> Outcome:
    """The engines' answer to `tokens`, or the APIError why not, by `deadline`."""
    engine = model.engine
    try:
        future, keys = engine.submit(tokens, then, tenant)
    except EngineUnavailable:
        raise svc.unavailable() from None
    stopped_by: str | None = None  # why this function cancelled the future, if it did

    def stop(why: str) -> None:
        nonlocal stopped_by
        if not future.done():
            stopped_by = why
            future.cancel()

    timer = asyncio.get_running_loop().call_at(deadline, stop, "timeout")
    if abandon is not None:
        abandon.add_done_callback(lambda _: stop("client_gone"))
    try:
        outcome = await future
    except asyncio.CancelledError:
        engine.cancel(keys)
        if stopped_by == "timeout":
            raise svc.unavailable("timed out waiting for the engine") from None
        if stopped_by == "client_gone":
            svc.metrics.disconnects.inc()
            raise ClientDisconnected() from None
        raise
    except EngineUnavailable as exc:
        raise svc.unavailable(str(exc)) from None
    except AdapterUnavailable as exc:  # that engine refused the adapter the others loaded: another may serve it
        raise APIError(
            503,
            f"{exc} (model '{model.name}'): retry later",
            param="model",
            code="adapter_unavailable",
            headers={"Retry-After": "1"},
        ) from None
    except EngineFailed as exc:
        raise APIError(500, f"the engine failed on this batch: {exc}", code="engine_error") from None
    finally:
        timer.cancel()
    return outcome


async def adapter_in_use(
    svc: Services, ctx: RequestContext, deadline: float
) -> contextlib.AbstractContextManager[None]:
    """The request's LoRA adapter loaded on its engines (a dropped one loaded again, one load however many
    wait, by the request's deadline) and held in use until its inputs are answered: an unload waits for it."""
    adapters = ctx.model.adapters
    if not ctx.adapter or adapters is None:
        return contextlib.nullcontext()
    await adapters.until_loaded(ctx.adapter, deadline)
    svc.metrics.adapter_requests.labels(model=ctx.model.name, adapter=ctx.adapter).inc()
    return adapters.use(ctx.adapter)  # no await since until_loaded: still loaded
