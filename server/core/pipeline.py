"""The request pipeline every pooling route shares: admit, prepare on the executor, run on an engine,
render on the executor. A route supplies two synchronous functions, `prepare(raw, ctx) -> Prepared`
and `render(prepared, outcome, ctx) -> bytes`, both run on the executor, never on the event loop:
prepare through Services.off_loop, render handed over by the engine client at the request's last row.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import time
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

import numpy as np
import orjson
from fastapi import Request
from fastapi.responses import Response

from common.wire import Tokens
from server.core.cached_run import FlightTimeout, Lookup, ResultCache
from server.core.engine_wait import adapter_in_use, run_on_engine
from server.core.inputs import ModelStarting, RequestContext, overloaded
from server.core.outcome import Outcome
from server.core.outputs import RawBody
from server.core.services import ServedModel, Services, services
from server.core.timings import Timings
from server.http.errors import APIError, ClientDisconnected, Shape, bad_request
from server.protocols.openai import PRIORITY_LIMIT
from server.tenants.guard import TenantPass
from server.vision.url_images import UrlImages

B = TypeVar("B")
S = TypeVar("S")
T = TypeVar("T")


@dataclass
class Prepared(Generic[B, S]):
    """A request ready for the engine: its body, its inputs, and its state (what render maps rows back by)."""

    body: B
    tokens: list[Tokens]
    state: S = None  # type: ignore[assignment]
    cached: Lookup | None = None  # its inputs' keys and what the result cache held for them (cache on)

    @property
    def n_tokens(self) -> int:
        return sum(len(t.input_ids) for t in self.tokens)

    def usage(self) -> dict[str, int]:
        return {"prompt_tokens": self.n_tokens, "total_tokens": self.n_tokens}


Prepare = Callable[[bytes, RequestContext], Prepared[Any, Any]]
Render = Callable[[Prepared[Any, Any], Outcome, RequestContext], "bytes | RawBody"]


def request_context(svc: Services) -> RequestContext:
    """A context on the default model (a request's `model` field may select another); 503 if not serving."""
    model = svc.default_model()
    return RequestContext(
        model, svc.models, svc.settings, model.admission or svc.admission, configured=tuple(svc.configured)
    )


async def read_body(request: Request, svc: Services) -> bytes:
    """The whole body within WARMPOOL_READ_TIMEOUT, else 408. Read before any admission permit is
    taken, so uploads that never arrive cannot hold the permits admitted work needs."""
    return await receive_body(svc, request.body())


async def receive_body(svc: Services, reading: Awaitable[T]) -> T:
    """`reading` (a body read whole, or streamed somewhere as it arrives) within WARMPOOL_READ_TIMEOUT,
    else 408. A body still arriving when the drain ends (Services.end_body_reads) is answered 503, not
    cancelled with the server's shutdown (which would answer 500)."""
    task = asyncio.current_task()
    if task is not None:
        svc.body_reads.add(task)
    try:
        return await asyncio.wait_for(reading, svc.settings.read_timeout)
    except TimeoutError:
        svc.metrics.rejections.labels(reason="read_timeout").inc()
        raise APIError(
            408,
            f"request body not received within {svc.settings.read_timeout:g} s",
            code="request_timeout",
            headers={"Connection": "close"},
        ) from None
    except asyncio.CancelledError:
        if task is None or task not in svc.body_reads_ended:
            raise  # not the drain's: the client left, or the server is going down
        task.uncancel()
        svc.metrics.rejections.labels(reason="draining").inc()
        raise APIError(
            503,
            "the server is shutting down and the request body had not all arrived",
            code="shutting_down",
            headers={"Connection": "close"},
        ) from None
    finally:
        if task is not None:
            svc.body_reads.discard(task)
            svc.body_reads_ended.discard(task)


@contextlib.contextmanager
def in_shape(shape: Shape) -> Iterator[None]:
    """Errors raised before a request context exists leave in the route's surface's shape."""
    try:
        yield
    except APIError as exc:
        exc.shape = shape
        raise


PRIORITY_HEADER = "x-priority"


def header_priority(request: Request) -> int:
    """The `x-priority` header's priority (0 without one), for clients that cannot add a body field."""
    text = request.headers.get(PRIORITY_HEADER)
    if text is None:
        return 0
    try:
        return checked_priority(int(text), PRIORITY_HEADER)
    except ValueError:
        raise bad_request(f"{PRIORITY_HEADER} must be an integer, not {text[:40]!r}", PRIORITY_HEADER) from None


def checked_priority(value: Any, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or abs(value) >= PRIORITY_LIMIT:
        raise bad_request(f"'{where}' must be an integer of magnitude below {PRIORITY_LIMIT}", where)
    return value


def at_priority(
    prepare: Prepare, raw: bytes, ctx: RequestContext, cache: ResultCache | None = None
) -> Prepared[Any, Any]:
    """prepare, with the request's priority known before it takes its permits: the body's
    `priority` (parsed again only where the body names one) over the header's; its inputs carry it and its adapter;
    with the result cache on, their keys and the LRU's answers looked up here, on the executor."""
    if b'"priority"' in raw:
        try:
            data = orjson.loads(raw)
        except orjson.JSONDecodeError:
            data = None  # prepare says what is wrong with the body
        if isinstance(data, dict) and data.get("priority") is not None:
            was_bulk = ctx.priority > 0
            ctx.ask_priority(checked_priority(data["priority"], "priority"))
            # its first permit was taken as interactive work: bulk now, it must fit the bulk share
            if ctx.priority > 0 and not was_bulk and ctx.admission is not None and not ctx.admission.bulk_fits():
                raise overloaded()
    prepared = prepare(raw, ctx)
    if ctx.priority or ctx.adapter:  # a LoRA adapter's inputs name it: the engine adds its updates to their rows
        prepared.tokens = [t._replace(priority=ctx.priority, adapter=ctx.adapter) for t in prepared.tokens]
    if cache is not None and prepared.tokens:
        prepared.cached = cache.lookup(ctx.model, prepared.tokens)
    return prepared


def refuse_when_full(svc: Services, served: ServedModel) -> None:
    """429 before the body is read when no permit is left: a flood's refusals cost no body read,
    parse or task. Only where the server's permits are the ones any model the body may name would
    take (with several models each has its own: the body decides which, so it is read first)."""
    if served.admission is None and svc.admission.full():
        svc.metrics.rejections.labels(reason="overloaded").inc()
        raise overloaded()


@contextlib.contextmanager
def admitted(
    svc: Services, shape: Shape = "openai", priority: int = 0, tenant: TenantPass | None = None
) -> Iterator[RequestContext]:
    """A request context holding the request's first admission permit (taken on the loop, so a full
    server refuses at once with 429); prepare takes the rest. Every permit is released on exit (or,
    for a request abandoned while prepare ran, when prepare ends). Errors leave in the shape of the
    surface the request speaks (`shape`, or the one prepare found in the body). A `tenant` pressing
    past its quota has its request run as bulk work (TenantPass.demoted)."""
    ctx = request_context(svc)
    ctx.shape = shape
    ctx.demoted = tenant is not None and tenant.demoted(svc.metrics)
    ctx.tenant = tenant.name if tenant is not None else ""
    ctx.ask_priority(priority)
    try:
        ctx.admit(1)
        yield ctx
    except APIError as exc:
        if exc.status == 429:
            svc.metrics.rejections.labels(reason="overloaded").inc()
        exc.shape = ctx.shape
        raise
    finally:
        if not ctx.abandoned:
            ctx.release()


async def answer(request: Request, prepare: Prepare, render: Render, shape: Shape = "openai") -> Response:
    """The whole pipeline for one request; every failure leaves as an APIError. The request timeout
    and the client's disconnect cover every step after the body has arrived, preparation included."""
    svc = services(request)
    timings = Timings()
    traced: dict[str, Any] = {"timings": timings}  # a failed request's trace has its stages too
    request.state.traced = traced
    with in_shape(shape):
        served = await svc.serving_model()  # 503 before reading the body of a request that cannot be served
        priority = header_priority(request)
        refuse_when_full(svc, served)
        raw = await read_body(request, svc)
    timings.arrived = time.perf_counter()  # tokenization time counts from here, not from the upload
    gone = asyncio.ensure_future(_client_gone(request))
    try:
        tenant = getattr(request.state, "tenant", None)
        prepared, outcome, ctx = await respond(svc, prepare, render, raw, shape, priority, traced, gone, tenant)
    finally:
        gone.cancel()
    timings.answered = time.perf_counter()
    request.state.access = {
        "inputs": len(prepared.tokens),
        "tokens": prepared.n_tokens,
        "timings": timings,
        "model": ctx.model_name,
    }
    return rendered_response(outcome.rendered, timings)


async def respond(
    svc: Services,
    prepare: Prepare,
    render: Render,
    raw: bytes,
    shape: Shape,
    priority: int,
    traced: dict[str, Any],
    gone: asyncio.Future[Any],
    tenant: TenantPass | None = None,
    on_loop: bool = False,
) -> tuple[Prepared[Any, Any], Outcome, RequestContext]:
    """A body that has arrived, admitted, prepared, run and rendered (`outcome.rendered`): what an
    HTTP request and a batch job's line (server/core/internal.py) share. `gone` done: given up (499).
    `traced` holds the request's Timings and gets its model. A `tenant` (server/tenants/) limits the
    models it may name, and its tokens per minute are charged once the tokens are counted. `on_loop`: a
    short text's, prepared and rendered on the loop (less CPU than the two executor hops around them;
    with the result cache on, rendered on the executor still, where the cache stores its rows)."""
    timings: Timings = traced["timings"]
    loop = asyncio.get_running_loop()
    deadline = loop.time() + svc.settings.request_timeout
    with admitted(svc, shape, priority, tenant) as ctx:
        traced["model"] = ctx.model_name
        ctx.allowed = tenant.models if tenant is not None else None
        staged = functools.partial(at_priority, prepare, cache=svc.cache)
        try:
            prepared = staged(raw, ctx) if on_loop else await prepare_in_time(svc, staged, raw, ctx, gone, deadline)
        except ModelStarting as starting:
            if not await _woken(svc, ctx, starting):  # a model on demand: its load awaited
                if not svc.holding():
                    raise
                await svc.until_booted()  # its permit held meanwhile: held requests count as admitted
            prepared = await prepare_in_time(svc, staged, raw, ctx, gone, deadline)
        if tenant is not None:
            ctx.check_allowed(ctx.model_name)  # the model it was given without naming one
            tenant.charge(prepared.n_tokens, svc.metrics)
        timings.submitted = time.perf_counter()
        timings.tokenization_ms = (timings.submitted - (timings.arrived or timings.started)) * 1000
        if prepared.tokens:
            with await adapter_in_use(svc, ctx, deadline):
                outcome = await run_cached(svc, ctx, prepared, render, timings, gone, deadline, on_loop)
        else:  # answered without the engine (an inference-free sparse model's queries)
            outcome = Outcome(np.empty((0, 0), dtype=np.float32), 0.0, 0.0)
            outcome.rendered = await svc.off_loop(render, prepared, outcome, ctx)
    return prepared, outcome, ctx


async def run_cached(
    svc: Services,
    ctx: RequestContext,
    prepared: Prepared[Any, Any],
    render: Render,
    timings: Timings,
    gone: asyncio.Future[Any],
    deadline: float,
    on_loop: bool = False,
) -> Outcome:
    """The prepared inputs run (run_on_engine) and rendered; with the result cache on, only those it
    cannot answer (server/core/cached_run.py), `timings.cache` saying how it answered."""

    def then(out: Outcome) -> Any:
        return render(prepared, out, ctx)

    def submit(tokens: list[Tokens], then: Callable[[Outcome], Any] | None) -> Awaitable[Outcome]:
        return run_on_engine(svc, ctx.model, tokens, timings, gone, then, deadline, ctx.tenant, ctx.demoted)

    if svc.cache is None or prepared.cached is None:
        outcome = await submit(prepared.tokens, None if on_loop else then)
        if on_loop:
            outcome.rendered = render(prepared, outcome, ctx)
        return outcome
    try:
        outcome, timings.cache = await svc.cache.run(prepared.cached, prepared.tokens, submit, then, deadline)
    except FlightTimeout:
        raise svc.unavailable("timed out waiting for the engine") from None
    svc.last_used[ctx.model.name] = time.time()  # a hit is a use of the model too
    return outcome


async def prepare_in_time(
    svc: Services, prepare: Prepare, raw: bytes, ctx: RequestContext, gone: asyncio.Future[Any], deadline: float
) -> Prepared[Any, Any]:
    """prepare on the executor, then the image URLs it met fetched on the loop and decoded on the
    executor (server/vision/url_images.py: no executor thread waits on an image host); given up (503, or 499
    for a client that left) past the deadline; the thread itself runs on, refused any further
    permits, and gives its permits back when done."""
    loop = asyncio.get_running_loop()
    ctx.url_images = urls = UrlImages(loop, svc.executor, ctx.settings)
    running = svc.executor.submit(prepare, raw, ctx)
    work = asyncio.ensure_future(urls.after(asyncio.wrap_future(running, loop=loop)))
    try:
        done, _ = await asyncio.wait(
            (work, gone), timeout=max(deadline - loop.time(), 0.0), return_when=asyncio.FIRST_COMPLETED
        )
    except asyncio.CancelledError:  # the server is exiting: the permits still follow the thread
        ctx.abandon(running)
        urls.close()
        raise
    if work in done:
        return work.result()
    ctx.abandon(running)
    urls.close()
    work.cancel()
    work.add_done_callback(lambda f: f.cancelled() or f.exception())  # retrieved: nobody awaits it now
    if gone in done:
        svc.metrics.disconnects.inc()
        raise ClientDisconnected()
    raise svc.unavailable("timed out preparing the request")


async def answer_without_engine(
    request: Request, respond: Callable[[bytes, RequestContext], bytes], shape: Shape = "openai"
) -> Response:
    """Routes the tokenizer alone answers (/tokenize, /detokenize): admitted like any other work,
    so they cannot queue unbounded jobs on the executor that pooling requests share."""
    svc = services(request)
    timings = Timings()
    with in_shape(shape):
        await svc.serving_model()
        raw = await read_body(request, svc)
    tenant = getattr(request.state, "tenant", None)
    return json_response(await respond_without_engine(svc, respond, raw, shape, tenant=tenant), timings)


async def respond_without_engine(
    svc: Services,
    respond: Callable[[bytes, RequestContext], bytes],
    raw: bytes,
    shape: Shape,
    priority: int = 0,
    tenant: TenantPass | None = None,
) -> bytes:
    """A body that has arrived, admitted and answered by `respond` on the executor (HTTP's and gRPC's)."""
    with admitted(svc, shape, priority) as ctx:
        ctx.allowed = tenant.models if tenant is not None else None
        try:
            return await svc.off_loop(respond, raw, ctx)
        except ModelStarting as starting:
            if not await _woken(svc, ctx, starting):
                raise
            return await svc.off_loop(respond, raw, ctx)


async def _woken(svc: Services, ctx: RequestContext, starting: ModelStarting) -> bool:
    """A request naming a model on demand not loaded: its load awaited (APIError if it cannot
    serve in time); False for a model that is not loaded on demand."""
    if svc.loader is None or not svc.loader.wakes(starting.model):
        return False
    # The permits are the default model's: an unload making room for this load waits for that
    # model's requests to finish, this one among them, were they kept.
    ctx.release()
    await svc.loader.until_loaded(starting.model)
    return True


async def _client_gone(request: Request) -> None:
    while (await request.receive())["type"] != "http.disconnect":
        pass


def json_response(body: bytes, timings: Timings | None = None) -> Response:
    headers = timings.headers() if timings else None
    return Response(content=body, media_type="application/json", headers=headers)


def rendered_response(rendered: bytes | RawBody, timings: Timings) -> Response:
    """A render's JSON, or its raw body (vLLM's `bytes` encodings) with its own media type and headers."""
    if isinstance(rendered, RawBody):
        headers = {**timings.headers(), **rendered.headers}
        return Response(content=rendered.content, media_type=rendered.media_type, headers=headers)
    return json_response(rendered, timings)
