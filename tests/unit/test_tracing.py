"""Tracing's exporters: spans reach a real OTLP/gRPC receiver through the SDK's exporter (what tracing
off and on import: tests/test_imports.py)."""

from __future__ import annotations

from common.settings import Settings
from server.core.pipeline import Timings
from server.http import tracing
from tests.otlp_receiver import GrpcReceiver


def test_http_endpoint_is_the_base_url() -> None:
    """As OTEL_EXPORTER_OTLP_ENDPOINT: /v1/traces is added to the base URL, not doubled."""
    assert tracing.exporter("http://c:4318", "http/protobuf")._endpoint == "http://c:4318/v1/traces"
    assert tracing.exporter("http://c:4318/v1/traces", "http/protobuf")._endpoint == "http://c:4318/v1/traces"


def test_spans_reach_a_grpc_collector() -> None:
    """otlp_protocol=grpc exports through the SDK's gRPC exporter: a request span with its stages
    as events arrives at a real TraceService."""
    receiver = GrpcReceiver()
    try:
        traced = tracing.configure(
            Settings(otlp_endpoint=receiver.endpoint, otlp_protocol="grpc", otlp_service_name="svc-under-test")
        )
        assert traced is not None
        span = traced.start_request("POST", {})
        timings = Timings()
        timings.arrived = timings.submitted = timings.answered = timings.started + 0.001
        access = {"model": "m", "inputs": 2, "tokens": 9, "timings": timings}
        traced.end_request(span, "POST", "/v1/embeddings", "/v1/embeddings", 200, access)
        traced.shutdown()
        server = receiver.received.wait_named("POST /v1/embeddings", 10)
        assert server["attributes"]["warmpool.tokens"] == 9
        assert receiver.received.resources[0]["service.name"] == "svc-under-test"
        assert [e["name"] for e in server["events"]] == ["read body", "tokenize", "queue", "inference", "render"]
        assert abs(server["events"][0]["attributes"]["warmpool.duration_ms"] - 1.0) < 0.01
    finally:
        receiver.close()


def quiet_tracing() -> tracing.Tracing:
    """The SDK's tracer with nothing to export to."""
    from opentelemetry.sdk.trace import TracerProvider

    return tracing.Tracing(TracerProvider())


def test_an_unsampled_request_is_ended_without_being_recorded() -> None:
    """A caller that did not sample its trace (flags 00) gets a span the SDK does not record:
    ending it records nothing and raises nothing (the sampler follows the parent)."""
    traced = quiet_tracing()
    span = traced.start_request("POST", {"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-00"})
    assert not span.is_recording()
    assert traced.trace_id(span) == "0af7651916cd43dd8448eb211c80319c"
    traced.end_request(span, "POST", "/v1/embeddings", "/v1/embeddings", 200, {"timings": Timings()})


def test_an_unknown_method_is_named_other() -> None:
    """Span names stay a bounded set: a method HTTP does not define is `_OTHER`, the span `HTTP`."""
    traced = quiet_tracing()
    span = traced.start_request("BREW", {})
    traced.end_request(span, "BREW", "/pot", "other", 405, {})
    assert span.name == "HTTP"  # type: ignore[attr-defined]
    assert span.attributes["http.request.method"] == "_OTHER"  # type: ignore[attr-defined]


def test_the_service_name_comes_from_otel_service_name_unless_set(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """OTEL_SERVICE_NAME names the service when WARMPOOL_OTLP_SERVICE_NAME does not; else warmpool."""

    def name(**kw: str) -> str:
        traced = tracing.configure(Settings(otlp_endpoint="http://127.0.0.1:9", **kw))
        assert traced is not None
        traced.processor.shutdown()  # nothing was traced: it has nothing to send
        return str(traced.provider.resource.attributes["service.name"])

    assert name() == "warmpool"
    monkeypatch.setenv("OTEL_SERVICE_NAME", "from-otel")
    assert name() == "from-otel"
    assert name(otlp_service_name="ours") == "ours"
