"""Traces from a real server to a real OTLP/HTTP receiver (decoded with opentelemetry-proto): a
server span per request, a child of the caller's traceparent, its stages as events, the trace
id in the response and the access log, and the start as one trace with a span per phase."""

from __future__ import annotations

import json
import secrets
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.otlp_receiver import HttpReceiver
from tests.server_process import ServerProcess, wait_for

SERVER_KIND = 2  # opentelemetry-proto's SPAN_KIND_SERVER
STAGES = ["read body", "tokenize", "queue", "inference", "render"]


@pytest.fixture(scope="module")
def traced(model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ServerProcess, HttpReceiver]]:
    receiver = HttpReceiver()
    log = tmp_path_factory.mktemp("logs") / "traced.log"
    # the SDK's batch delay, shortened so the test need not wait 5 s per export
    proc = ServerProcess(model_dir, log, environ={"OTEL_BSP_SCHEDULE_DELAY": "50"}, otlp_endpoint=receiver.endpoint)
    try:
        yield proc.wait_ready(), receiver
    finally:
        proc.stop()
        receiver.close()


def embed(proc: ServerProcess, headers: dict[str, str] | None = None) -> Any:
    r = proc.post("/v1/embeddings", json={"input": ["traced text", "and another"]}, headers=headers or {})
    assert r.status_code == 200, r.text
    return r


def server_span(receiver: HttpReceiver, trace_id: str) -> dict[str, Any]:
    def found() -> dict[str, Any] | None:
        return next((s for s in receiver.received.of_trace(trace_id) if s["kind"] == SERVER_KIND), None)

    return wait_for(found, 30, f"the server span of trace {trace_id}")  # type: ignore[no-any-return]


def test_a_request_span_continues_the_callers_trace(traced: tuple[ServerProcess, HttpReceiver]) -> None:
    """Given `traceparent` and `tracestate`, the server span joins that trace under the caller's
    span, says which route, model, inputs and tokens, and its trace id comes back in x-trace-id."""
    proc, receiver = traced
    trace_id, parent = secrets.token_hex(16), secrets.token_hex(8)
    r = embed(proc, {"traceparent": f"00-{trace_id}-{parent}-01", "tracestate": "vendor=abc"})
    assert r.headers["x-trace-id"] == trace_id
    span = server_span(receiver, trace_id)
    assert span["name"] == "POST /v1/embeddings"
    assert span["parent_span_id"] == parent
    assert span["trace_state"] == "vendor=abc"
    attributes = span["attributes"]
    assert attributes["http.route"] == "/v1/embeddings"
    assert attributes["http.response.status_code"] == 200
    assert attributes["warmpool.model"] == "all-MiniLM-L6-v2"
    assert attributes["warmpool.inputs"] == 2 and attributes["warmpool.tokens"] > 2


def test_the_stages_are_events_in_order_within_the_request(traced: tuple[ServerProcess, HttpReceiver]) -> None:
    """read body, tokenize, queue, inference and render are events of the server span, each at its
    stage's start with its duration, one after another inside the span."""
    proc, receiver = traced
    span = server_span(receiver, embed(proc).headers["x-trace-id"])
    events = span["events"]
    assert [e["name"] for e in events] == STAGES
    ends = [e["time"] + e["attributes"]["warmpool.duration_ms"] * 1e6 for e in events]
    assert span["start"] <= events[0]["time"] and ends[-1] <= span["end"] + 1e4  # ns rounding
    assert all(e["attributes"]["warmpool.duration_ms"] >= 0 for e in events)
    assert all(end <= e["time"] + 1e4 for end, e in zip(ends, events[1:], strict=False))


def test_a_request_without_traceparent_starts_a_trace_named_in_the_access_log(
    traced: tuple[ServerProcess, HttpReceiver],
) -> None:
    """No caller context: a new trace, a root server span, and the access event carries its id."""
    proc, receiver = traced
    trace_id = embed(proc).headers["x-trace-id"]
    assert server_span(receiver, trace_id)["parent_span_id"] == ""

    def logged() -> bool:
        events = [json.loads(line) for line in proc.logs().splitlines() if line.startswith("{")]
        return any(e.get("event") == "request" and e.get("trace_id") == trace_id for e in events)

    wait_for(logged, 10, "the access event with the trace id")


def test_probes_are_not_traced(traced: tuple[ServerProcess, HttpReceiver]) -> None:
    """Readiness probes and scrapes make no spans: a request sent after them is exported, they are not."""
    proc, receiver = traced
    for path in ("/health/ready", "/metrics", "/ping"):
        assert "x-trace-id" not in proc.get(path).headers
    server_span(receiver, embed(proc).headers["x-trace-id"])
    assert not [s for s in receiver.received.spans if s["name"].startswith("GET")]


def test_the_start_is_one_trace_with_a_span_per_phase(traced: tuple[ServerProcess, HttpReceiver]) -> None:
    """A `startup` span from the process's start to ready, with each phase a child span inside it
    saying how it ended (compile: skipped, as the test servers run eager)."""
    _, receiver = traced
    start = receiver.received.wait_named("startup")
    phases = wait_for(
        lambda: (
            (found := {s["name"]: s for s in receiver.received.of_trace(start["trace_id"]) if s is not start})
            and "ready" in found
            and found
        ),
        30,
        "the phase spans",
    )
    assert set(phases) >= {"bind", "prefetch", "forkserver", "engine", "warmup", "compile", "ready"}
    assert {s["parent_span_id"] for s in phases.values()} == {start["span_id"]}
    names = [s["name"] for s in receiver.received.of_trace(start["trace_id"])]
    assert len(names) == len(set(names)), names  # one span per phase, however often it is reported
    assert phases["compile"]["attributes"]["warmpool.phase.state"] == "skipped"
    assert phases["engine"]["attributes"]["warmpool.phase.state"] == "done"
    assert all(start["start"] <= s["start"] <= s["end"] for s in phases.values())
    # compile may end after ready (it runs on past it); every other phase ends inside the start
    assert all(s["end"] <= start["end"] for name, s in phases.items() if name != "compile")
    assert phases["ready"]["end"] == start["end"]


def test_a_request_the_caller_did_not_sample_is_served_and_not_exported(
    traced: tuple[ServerProcess, HttpReceiver],
) -> None:
    """traceparent flags 00: the request is answered as any other, its trace id echoed, and no
    span of that trace leaves (the sampler follows the caller)."""
    proc, receiver = traced
    trace_id = secrets.token_hex(16)
    r = embed(proc, {"traceparent": f"00-{trace_id}-{secrets.token_hex(8)}-00"})
    assert r.headers["x-trace-id"] == trace_id
    server_span(receiver, embed(proc).headers["x-trace-id"])  # a later, sampled request has arrived
    assert receiver.received.of_trace(trace_id) == []
    assert "Traceback" not in proc.logs()
