"""OpenTelemetry traces over OTLP (WARMPOOL_OTLP_ENDPOINT): a server span per HTTP request, with an
event per stage, and one trace for the start with a span per phase.

Off by default, and then nothing here imports OpenTelemetry: `configure` returns None and the
middleware's one check is the whole cost. On, the SDK's batch processor exports from its own
thread, holds at most its queue's spans (the rest are dropped, never buffered without bound) and
gives up on a collector after the export timeout. A request's stages are written when it ends,
from the times the pipeline noted (Timings): they run on the executor and in the engine, and no
span object has to follow them there. Stages are events (at the stage's start, with its duration),
not child spans: the Python SDK's OTLP encoding costs ~0.14 ms of CPU per span, so five child spans
made a traced request cost ~1.2 ms of CPU where one span with five events costs ~0.3 ms.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Mapping
from importlib import metadata
from typing import TYPE_CHECKING, Any

from common.settings import Settings
from common.startup import StartupState, uptime

if TYPE_CHECKING:
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.trace import Span, Tracer

    from server.core.timings import Timings

EXPORT_TIMEOUT_S = 5.0  # a collector that does not answer costs one batch's wait, not the shutdown
SHUTDOWN_TIMEOUT_S = 3.0  # what SIGTERM waits for queued spans to leave
_TERMINAL = ("done", "skipped", "failed")
# HTTP semantic conventions: other methods are `_OTHER` (span names stay a bounded set)
_METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "DELETE", "PATCH", "OPTIONS", "CONNECT", "TRACE"})


def configure(settings: Settings) -> Tracing | None:
    """The tracer for the settings' collector, or None (and no import) when tracing is off."""
    if not settings.otlp_endpoint:
        return None
    from opentelemetry.sdk.resources import SERVICE_NAME, Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    # The SDK's batch processor warns once per span it drops when its queue is full: on the event
    # loop, under load, while the collector is away. Its errors still reach the log.
    logging.getLogger("opentelemetry").setLevel(logging.ERROR)
    attributes = {"service.version": metadata.version("warmpool")}
    if settings.otlp_service_name:
        attributes[SERVICE_NAME] = settings.otlp_service_name
    resource = Resource.create(attributes)  # OTEL_SERVICE_NAME and OTEL_RESOURCE_ATTRIBUTES apply
    if str(resource.attributes.get(SERVICE_NAME, "unknown_service")).startswith("unknown_service"):
        resource = resource.merge(Resource({SERVICE_NAME: "warmpool"}))
    provider = TracerProvider(resource=resource)  # sampler: OTEL_TRACES_SAMPLER, parent-based by default
    processor = BatchSpanProcessor(exporter(settings.otlp_endpoint, settings.otlp_protocol))
    provider.add_span_processor(processor)
    return Tracing(provider, processor)


def exporter(endpoint: str, protocol: str) -> Any:
    """The SDK's OTLP span exporter: HTTP/protobuf at ENDPOINT/v1/traces, or gRPC at ENDPOINT."""
    if protocol == "grpc":
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter as GrpcExporter

        return GrpcExporter(endpoint=endpoint, insecure=endpoint.startswith("http://"), timeout=EXPORT_TIMEOUT_S)
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

    url = endpoint if endpoint.rstrip("/").endswith("/v1/traces") else endpoint.rstrip("/") + "/v1/traces"
    return OTLPSpanExporter(endpoint=url, timeout=EXPORT_TIMEOUT_S)


class Tracing:
    def __init__(self, provider: TracerProvider, processor: Any = None) -> None:
        from opentelemetry import trace
        from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

        self.provider = provider
        self.processor = processor
        self._phases_seen: set[str] = set()
        self.tracer: Tracer = provider.get_tracer("warmpool")
        self._trace = trace
        self._propagator = TraceContextTextMapPropagator()
        self._start: Span | None = None
        self._start_context: Any = None
        self._begun = 0  # the process's start, in ns since the epoch

    # Requests

    def start_request(self, method: str, headers: Mapping[str, str]) -> Span:
        """The server span, a child of the caller's `traceparent` (and `tracestate`) when it sent one."""
        from opentelemetry.trace import SpanKind

        parent = self._propagator.extract(headers) if "traceparent" in headers else None
        return self.tracer.start_span(method if method in _METHODS else "HTTP", context=parent, kind=SpanKind.SERVER)

    @staticmethod
    def trace_id(span: Span) -> str:
        return format(span.get_span_context().trace_id, "032x")

    def end_request(
        self, span: Span, method: str, path: str, route: str, status: int, access: Mapping[str, Any]
    ) -> None:
        """Name the span by its route, record what the request asked for, add its stages, end it
        (a span the sampler dropped records nothing: it is only ended)."""
        if not span.is_recording():
            span.end()
            return
        from opentelemetry.trace import Status, StatusCode

        known = method if method in _METHODS else "_OTHER"
        name = "HTTP" if known == "_OTHER" else known
        span.update_name(f"{name} {route}" if route != "other" else name)
        attributes: dict[str, Any] = {
            "http.request.method": known,
            "url.path": path,
            "url.scheme": "http",
            "http.response.status_code": status,
        }
        if route != "other":
            attributes["http.route"] = route
        for key in ("model", "inputs", "tokens", "tenant"):  # the tenant's name, never its key
            if access.get(key) is not None:
                attributes[f"warmpool.{key}"] = access[key]
        span.set_attributes(attributes)
        if status >= 500:
            span.set_status(Status(StatusCode.ERROR))
        timings: Timings | None = access.get("timings")
        if timings is not None:
            self._stages(span, timings)
        span.end()

    @staticmethod
    def _stages(span: Span, timings: Timings) -> None:
        for name, start, end in timings.stages():
            span.add_event(name, {"warmpool.duration_ms": round((end - start) / 1e6, 3)}, timestamp=start)

    # The start

    def watch_startup(self, startup: StartupState) -> None:
        """One trace for the start: a `startup` span from the process's start to `ready`, and a
        child span per phase as it ends (a phase ending after ready, such as compile, still joins it)."""
        begun = time.time_ns() - int(uptime() * 1e9)
        self._start = self.tracer.start_span("startup", start_time=begun)
        self._start_context = self._trace.set_span_in_context(self._start)
        self._begun = begun
        startup.watch(self._phase)

    def _phase(self, record: dict[str, Any]) -> None:
        """A span for a phase the first time it ends (compile is reported again by each engine)."""
        if record["state"] not in _TERMINAL or record["started_s"] is None or self._start is None:
            return
        if record["name"] in self._phases_seen:
            return
        self._phases_seen.add(record["name"])
        from opentelemetry.trace import Status, StatusCode

        start = self._begun + int(record["started_s"] * 1e9)
        end = start + int((record["duration_s"] or 0.0) * 1e9)
        attributes = {"warmpool.phase.state": record["state"]}
        if record.get("model"):
            attributes["warmpool.model"] = record["model"]
        for key, value in record["detail"].items():
            if isinstance(value, str | bool | int | float):
                attributes[f"warmpool.{key}"] = value
        span = self.tracer.start_span(
            record["name"], context=self._start_context, start_time=start, attributes=attributes
        )
        if record["state"] == "failed":
            span.set_status(Status(StatusCode.ERROR, str(record["detail"].get("error", ""))))
        span.end(end_time=end)
        if record["name"] == "ready":
            if record["state"] != "done":
                self._start.set_status(Status(StatusCode.ERROR, "the start did not reach ready"))
            self._start.end(end_time=end)

    def shutdown(self) -> None:
        """Export what is queued, for at most SHUTDOWN_TIMEOUT_S (the SDK's own flush ignores its
        timeout, and its shutdown waits up to 30 s): the exporter's thread is a daemon, so a
        collector that does not answer is left behind, not waited for."""
        if self._start is not None and self._start.is_recording():
            self._start.end()
        closing = threading.Thread(target=self.provider.shutdown, name="warmpool-trace-shutdown", daemon=True)
        closing.start()
        closing.join(SHUTDOWN_TIMEOUT_S)
