"""OTLP trace receivers for the tests: HTTP/protobuf (POST /v1/traces) and gRPC (TraceService/Export),
each decoding what it gets with opentelemetry-proto's own messages into plain span records."""

from __future__ import annotations

import http.server
import threading
from concurrent import futures
from dataclasses import dataclass, field
from typing import Any

from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc

from tests.server_process import wait_for


@dataclass
class Received:
    spans: list[dict[str, Any]] = field(default_factory=list)
    resources: list[dict[str, Any]] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def add(self, request: trace_service_pb2.ExportTraceServiceRequest) -> None:
        with self.lock:
            for resource_spans in request.resource_spans:
                self.resources.append(_attributes(resource_spans.resource.attributes))
                for scope in resource_spans.scope_spans:
                    self.spans += [_span(s) for s in scope.spans]

    def named(self, name: str) -> list[dict[str, Any]]:
        with self.lock:
            return [s for s in self.spans if s["name"] == name]

    def wait_named(self, name: str, timeout: float = 30) -> dict[str, Any]:
        return wait_for(lambda: next(iter(self.named(name)), None), timeout, f"a span named {name!r}")  # type: ignore[no-any-return]

    def of_trace(self, trace_id: str) -> list[dict[str, Any]]:
        with self.lock:
            return [s for s in self.spans if s["trace_id"] == trace_id]


def _value(value: Any) -> Any:
    kind = value.WhichOneof("value")
    return getattr(value, kind) if kind else None


def _attributes(pairs: Any) -> dict[str, Any]:
    return {pair.key: _value(pair.value) for pair in pairs}


def _span(span: Any) -> dict[str, Any]:
    return {
        "name": span.name,
        "trace_id": span.trace_id.hex(),
        "span_id": span.span_id.hex(),
        "parent_span_id": span.parent_span_id.hex(),
        "kind": span.kind,
        "start": span.start_time_unix_nano,
        "end": span.end_time_unix_nano,
        "attributes": _attributes(span.attributes),
        "status": span.status.code,
        "trace_state": span.trace_state,
        "events": [
            {"name": e.name, "time": e.time_unix_nano, "attributes": _attributes(e.attributes)} for e in span.events
        ],
    }


class HttpReceiver:
    """OTLP/HTTP on a free port; `endpoint` is the base URL an exporter is given. With `decode`
    off it only counts what it gets (a benchmark's collector must not take the server's CPU)."""

    def __init__(self, decode: bool = True) -> None:
        self.received = Received()
        self.exports = 0
        received, receiver = self.received, self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["content-length"]))
                ok = self.path == "/v1/traces" and self.headers["content-type"] == "application/x-protobuf"
                receiver.exports += ok
                if ok and decode:
                    received.add(trace_service_pb2.ExportTraceServiceRequest.FromString(body))
                reply = trace_service_pb2.ExportTraceServiceResponse().SerializeToString()
                self.send_response(200 if ok else 404)
                self.send_header("content-type", "application/x-protobuf")
                self.send_header("content-length", str(len(reply)))
                self.end_headers()
                self.wfile.write(reply)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.endpoint = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


class GrpcReceiver(trace_service_pb2_grpc.TraceServiceServicer):
    """OTLP/gRPC on a free port."""

    def __init__(self) -> None:
        import grpc

        self.received = Received()
        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
        trace_service_pb2_grpc.add_TraceServiceServicer_to_server(self, self.server)
        port = self.server.add_insecure_port("127.0.0.1:0")
        self.endpoint = f"http://127.0.0.1:{port}"
        self.server.start()

    def Export(self, request: Any, context: Any) -> Any:
        self.received.add(request)
        return trace_service_pb2.ExportTraceServiceResponse()

    def close(self) -> None:
        self.server.stop(grace=None)
