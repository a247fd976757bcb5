"""TEI's services' handlers on grpc.aio: each RPC checked for the API key (the HTTP middleware's own
check), run through pipeline.respond (or respond_without_engine for the tokenizer's RPCs) at the
`x-priority` metadata's priority, counted in flight (the drain waits for it), measured, logged and
traced as an HTTP request is; errors leave as TEI's gRPC status codes."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import time
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass
from typing import Any

import grpc
import structlog
from grpc import aio

from server.core.pipeline import PRIORITY_HEADER, checked_priority, respond, respond_without_engine
from server.core.services import Services
from server.core.timings import Timings
from server.grpc import calls
from server.grpc.messages import PACKAGE, SERVICES, message
from server.http.errors import APIError, api_error, bad_request
from server.http.middleware import access_log
from server.routes import tei
from server.tenants.guard import TenantPass, admit, bearer

log = structlog.get_logger("warmpool.grpc")

Code = grpc.StatusCode
# TEI's ErrorType -> gRPC code (its grpc/server.rs): validation and empty inputs are INVALID_ARGUMENT,
# overloaded RESOURCE_EXHAUSTED, unhealthy UNAVAILABLE, backend FAILED_PRECONDITION.
CODES = {
    400: Code.INVALID_ARGUMENT,
    401: Code.UNAUTHENTICATED,
    403: Code.PERMISSION_DENIED,
    404: Code.NOT_FOUND,
    408: Code.DEADLINE_EXCEEDED,
    413: Code.INVALID_ARGUMENT,
    429: Code.RESOURCE_EXHAUSTED,
    499: Code.CANCELLED,
    500: Code.FAILED_PRECONDITION,
    503: Code.UNAVAILABLE,
}


@dataclass(frozen=True)
class Caller:
    """Who made a call (its tenant, None without keys) and at which priority."""

    priority: int = 0
    tenant: TenantPass | None = None


Answer = Callable[[Any, Caller], Awaitable[bytes]]  # a request (or a client stream) and its caller -> the response
LOOP_COPY_BYTES = 1 << 20  # ~0.1 ms of copying: a larger answer is joined to its metadata on the executor
MODEL_TYPES = {"embedding": 0, "classifier": 1, "reranker": 2}  # TEI's ModelType enum


class Failed(Exception):
    """An RPC's failure as its gRPC status and TEI's message, with the HTTP status it stands for."""

    def __init__(self, code: grpc.StatusCode, message: str, status: int) -> None:
        super().__init__(message)
        self.code, self.message, self.status = code, message, status


def failure(exc: Exception) -> Failed:
    if isinstance(exc, Failed):
        return exc
    if isinstance(exc, calls.InvalidRequest):
        return Failed(Code.INVALID_ARGUMENT, str(exc), 400)
    error = api_error(exc)
    code = Code.FAILED_PRECONDITION if error.code == "unsupported_route" else CODES.get(error.status, Code.INTERNAL)
    return Failed(code, error.message, error.status)


def _metadata(context: aio.ServicerContext) -> dict[str, str]:
    return {key: value for key, value in context.invocation_metadata() or () if isinstance(value, str)}


class TeiServices:
    """The handlers of TEI's Info, Embed, Predict, Rerank and Tokenize services."""

    def __init__(self, svc: Services) -> None:
        self.svc = svc
        self.window = svc.settings.grpc_stream_window

    def handlers(self) -> list[grpc.GenericRpcHandler]:
        engine, tokenizer = self._engine, self._tokenizer
        unary: list[tuple[str, str, str, Answer]] = [  # service, method, request message, answer
            ("Info", "Info", "InfoRequest", self._info),
            ("Embed", "Embed", "EmbedRequest", engine(calls.embed)),
            ("Embed", "EmbedSparse", "EmbedSparseRequest", engine(calls.embed_sparse)),
            ("Embed", "EmbedAll", "EmbedAllRequest", engine(calls.embed_all)),
            ("Predict", "Predict", "PredictRequest", engine(calls.predict)),
            ("Predict", "PredictPair", "PredictPairRequest", engine(calls.predict_pair)),
            ("Rerank", "Rerank", "RerankRequest", engine(self._rerank)),
            ("Tokenize", "Tokenize", "EncodeRequest", tokenizer(calls.tokenize_respond)),
            ("Tokenize", "Decode", "DecodeRequest", tokenizer(calls.decode_respond)),
        ]
        table: dict[str, dict[str, grpc.RpcMethodHandler]] = {}
        for service, method, request_name, answer in unary:
            route, deserialize = f"/{PACKAGE}.{service}/{method}", message(request_name).FromString
            handler = functools.partial(self._tracked, route, answer)
            table.setdefault(service, {})[method] = grpc.unary_unary_rpc_method_handler(handler, deserialize)
            if service != "Info" and method != "Rerank":  # each streams as itself, message by message
                streamed = functools.partial(self._streamed, route + "Stream", answer)
                table[service][method + "Stream"] = grpc.stream_stream_rpc_method_handler(streamed, deserialize)
        table["Rerank"]["RerankStream"] = grpc.stream_unary_rpc_method_handler(
            functools.partial(self._tracked, f"/{PACKAGE}.Rerank/RerankStream", self._rerank_stream),
            message("RerankStreamRequest").FromString,
        )
        for name, methods in table.items():  # every RPC of the vendored proto is answered
            assert set(methods) == set(SERVICES[name].methods_by_name), name
        return [grpc.method_handlers_generic_handler(SERVICES[name].full_name, m) for name, m in table.items()]

    # One request message -> its response's bytes

    def _engine(self, make: Callable[[Any], calls.Call]) -> Answer:
        async def answer(request: Any, caller: Caller) -> bytes:
            call = make(request)
            await self.svc.serving_model()
            timings = Timings(arrived=time.perf_counter())
            gone = asyncio.get_running_loop().create_future()  # the task's cancellation covers a client gone
            traced: dict[str, Any] = {"timings": timings}
            try:
                small = call.on_loop
                prepared, outcome, _ = await respond(
                    self.svc, call.prepare, call.render, b"", "tei", caller.priority, traced, gone, caller.tenant, small
                )
            finally:
                gone.cancel()
            total = time.perf_counter() - timings.started
            meta = calls.metadata(call, prepared, timings, total)
            if len(outcome.rendered) > LOOP_COPY_BYTES:  # an /embed_all-sized answer: copied off the loop
                return await self.svc.off_loop(bytes.__add__, bytes(outcome.rendered), meta)
            return bytes(outcome.rendered) + meta

        return answer

    def _tokenizer(self, make: Callable[[Any], Callable[[bytes, Any], bytes]]) -> Answer:
        async def answer(request: Any, caller: Caller) -> bytes:
            respond_with = make(request)
            await self.svc.serving_model()
            return await respond_without_engine(self.svc, respond_with, b"", "tei", caller.priority, caller.tenant)

        return answer

    def _rerank(self, request: Any) -> calls.Call:
        return calls.rerank(request, self.svc.settings.max_inputs_per_request)

    async def _info(self, request: Any, caller: Caller) -> bytes:
        await self.svc.serving_model()
        fields = tei.info(self.svc)
        kind = next(iter(fields["model_type"]))
        kept = {k: v for k, v in fields.items() if k in INFO_FIELDS and v is not None}
        return bytes(message("InfoResponse")(**kept, model_type=MODEL_TYPES.get(kind, 1)).SerializeToString())

    async def _rerank_stream(self, requests: AsyncIterator[Any], caller: Caller) -> bytes:
        """Every message's (query, text) pair, then one ranking; at most max_inputs_per_request
        messages are kept: the next one fails the call before any is tokenized."""
        limit = self.svc.settings.max_inputs_per_request
        pairs: list[Any] = []
        async for request in requests:
            pairs.append(request)
            calls.check_rerank_size(len(pairs), limit)
        calls.check_rerank_size(len(pairs), limit)
        return await self._engine(lambda _: calls.rerank_pairs(pairs))(None, caller)

    # The handlers gRPC calls

    async def _tracked(self, route: str, answer: Answer, request: Any, context: aio.ServicerContext) -> bytes:
        """One answer (a unary call's, or a client stream's): the key checked, counted, recorded."""
        started = time.perf_counter()
        span = self._span(context)
        with self._counted():
            try:
                with self._admitted(context) as caller:
                    answered: bytes | Failed = await answer(request, caller)
            except Exception as exc:
                answered = failure(exc)
            self._record(route, answered, started, span)
        if isinstance(answered, Failed):
            await context.abort(answered.code, answered.message)
        assert isinstance(answered, bytes)
        return answered

    async def _streamed(
        self, route: str, answer: Answer, requests: AsyncIterator[Any], context: aio.ServicerContext
    ) -> AsyncIterator[bytes]:
        """A stream's messages each answered as a call of its own, the answers in order; the first
        failure ends the stream with its status, as TEI's streams end."""
        with contextlib.ExitStack() as stack:
            try:
                caller = stack.enter_context(self._admitted(context))
            except Exception as exc:
                refused = failure(exc)
                self._record(route, refused, time.perf_counter(), None)
                await context.abort(refused.code, refused.message)
            with self._counted():
                async with contextlib.aclosing(self._in_order(requests, route, answer, caller, context)) as answers:
                    async for answered in answers:
                        if isinstance(answered, Failed):
                            await context.abort(answered.code, answered.message)
                        else:
                            yield answered

    async def _in_order(
        self, requests: AsyncIterator[Any], route: str, answer: Answer, caller: Caller, context: aio.ServicerContext
    ) -> AsyncGenerator[bytes | Failed, None]:
        """Each message answered as soon as it arrives, at most `window` at once, the answers in the
        messages' order: the stream is not read further while the window is full."""
        room = asyncio.Semaphore(self.window)
        queue: asyncio.Queue[asyncio.Future[bytes | Failed] | None] = asyncio.Queue()

        async def one(request: Any) -> bytes | Failed:
            started, span = time.perf_counter(), self._span(context)
            try:
                answered: bytes | Failed = await answer(request, caller)
            except Exception as exc:
                answered = failure(exc)
            self._record(route, answered, started, span)
            return answered

        async def read() -> None:
            try:
                async for request in requests:
                    await room.acquire()
                    queue.put_nowait(asyncio.ensure_future(one(request)))
            finally:
                queue.put_nowait(None)

        reader = asyncio.ensure_future(read())
        try:
            while (task := await queue.get()) is not None:
                answered = await task
                room.release()
                yield answered
            await reader  # a broken request stream raises here
        finally:
            reader.cancel()
            while not queue.empty():
                left = queue.get_nowait()
                if left is not None:
                    left.cancel()

    @contextlib.contextmanager
    def _admitted(self, context: aio.ServicerContext) -> Iterator[Caller]:
        """The call's caller: its tenant, by the `authorization` metadata as HTTP's guard checks a key
        (UNAUTHENTICATED with TEI's message, PERMISSION_DENIED, RESOURCE_EXHAUSTED over its quota;
        its in-flight count held until the call ends), and its priority (`x-priority`, 0 without)."""
        metadata = _metadata(context)
        text = metadata.get(PRIORITY_HEADER)
        try:
            priority = 0 if text is None else checked_priority(int(text), PRIORITY_HEADER)
        except ValueError:
            said = (text or "")[:40]
            raise failure(bad_request(f"{PRIORITY_HEADER} must be an integer, not {said!r}")) from None
        keys = self.svc.key_source
        if keys is None:
            yield Caller(priority)
            return
        token = bearer(metadata.get("authorization", "").encode("latin-1", "replace"))
        try:
            tenant = admit(keys, token, "inference", self.svc.metrics, {})
        except APIError as refused:
            if refused.status == 401:
                raise Failed(Code.UNAUTHENTICATED, "No valid auth token", 401) from None
            raise failure(refused) from None
        try:
            yield Caller(priority, tenant)
        finally:
            tenant.limits.release()

    def _span(self, context: aio.ServicerContext) -> Any:
        if self.svc.tracing is None:
            return None
        metadata = _metadata(context)
        return self.svc.tracing.start_request("POST", {k: metadata[k] for k in TRACE_KEYS if k in metadata})

    @contextlib.contextmanager
    def _counted(self) -> Iterator[None]:
        self.svc.in_flight += 1  # the drain waits for gRPC calls as for HTTP requests
        try:
            yield
        finally:
            self.svc.in_flight -= 1

    def _record(self, route: str, answered: bytes | Failed, started: float, span: Any) -> None:
        seconds = time.perf_counter() - started
        status = answered.code.name if isinstance(answered, Failed) else "OK"
        self.svc.metrics.requests.labels(route=route, status=status).observe(seconds)
        access_log.info("request", method="gRPC", route=route, status=status, total_ms=round(seconds * 1000, 2))
        if span is not None and self.svc.tracing is not None:
            http_status = answered.status if isinstance(answered, Failed) else 200
            self.svc.tracing.end_request(span, "POST", route, route, http_status, {})


TRACE_KEYS = ("traceparent", "tracestate")
INFO_FIELDS = set(message("InfoResponse").DESCRIPTOR.fields_by_name) - {"model_type"}
