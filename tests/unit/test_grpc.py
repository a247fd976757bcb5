"""The gRPC surface's pieces in-process: the committed descriptor against the vendored proto, TEI's
status codes for warmpool's errors, the packed float fields, and a stream's window."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from concurrent.futures import ThreadPoolExecutor

import grpc
import numpy as np
import pytest
from google.protobuf import descriptor_pb2
from pydantic import BaseModel, ValidationError

from common.settings import Settings
from common.startup import StartupState
from server.core.services import Services
from server.grpc import calls
from server.grpc.messages import DESCRIPTOR, message
from server.grpc.service import TeiServices, failure
from server.http.errors import APIError, ClientDisconnected
from tools.grpc_descriptor import compiled_descriptor


def test_the_committed_descriptor_is_the_vendored_protos() -> None:
    """tei.binpb is what protoc makes of tei.proto: `make grpc-descriptor` after changing either."""
    committed = descriptor_pb2.FileDescriptorProto.FromString(DESCRIPTOR.read_bytes())
    assert committed == descriptor_pb2.FileDescriptorProto.FromString(compiled_descriptor())


class _Body(BaseModel):
    n: int


def _validation_error() -> ValidationError:
    try:
        _Body(n="x")  # type: ignore[arg-type]
    except ValidationError as exc:
        return exc
    raise AssertionError("no error")


@pytest.mark.parametrize(
    ("error", "code"),
    [
        (APIError(400, "bad"), grpc.StatusCode.INVALID_ARGUMENT),
        (_validation_error(), grpc.StatusCode.INVALID_ARGUMENT),
        (APIError(400, "not this kind", code="unsupported_route"), grpc.StatusCode.FAILED_PRECONDITION),
        (APIError(429, "full"), grpc.StatusCode.RESOURCE_EXHAUSTED),
        (APIError(503, "starting"), grpc.StatusCode.UNAVAILABLE),
        (APIError(500, "the engine failed"), grpc.StatusCode.FAILED_PRECONDITION),
        (ClientDisconnected(), grpc.StatusCode.CANCELLED),
        (calls.InvalidRequest("`inputs` cannot be empty"), grpc.StatusCode.INVALID_ARGUMENT),
    ],
)
def test_errors_leave_as_teis_status_codes(error: Exception, code: grpc.StatusCode) -> None:
    """TEI's mapping (validation, overloaded, unhealthy, backend), the route's message kept."""
    assert failure(error).code == code


def test_the_grpc_port_must_not_be_the_http_port() -> None:
    with pytest.raises(ValidationError, match="gRPC needs a port of its own"):
        Settings(_cli_parse_args=[], port=8000, grpc_port=8000)  # type: ignore[call-arg]


def test_packed_floats_are_the_repeated_float_field() -> None:
    vector = np.array([0.5, -1.25, 3.0e-8, 7.0], dtype=np.float32)
    decoded = message("EmbedResponse").FromString(calls.packed_floats(vector)).embeddings
    np.testing.assert_array_equal(np.array(decoded, np.float32), vector)


def test_a_stream_has_at_most_its_window_in_flight_and_answers_in_order() -> None:
    settings = Settings(_cli_parse_args=[], grpc_stream_window=2)  # type: ignore[call-arg]
    with ThreadPoolExecutor(1) as executor:
        tei = TeiServices(Services(settings=settings, startup=StartupState(), executor=executor))
    running, most = 0, 0

    async def answer(request: int, priority: int) -> bytes:
        nonlocal running, most
        running += 1
        most = max(most, running)
        await asyncio.sleep(0.01 * (5 - request))  # later messages finish first
        running -= 1
        return bytes([request])

    async def requests() -> AsyncIterator[int]:
        for i in range(6):
            yield i

    async def run() -> list[bytes | object]:
        return [a async for a in tei._in_order(requests(), "/t", answer, 0, None)]  # type: ignore[arg-type]

    assert asyncio.run(run()) == [bytes([i]) for i in range(6)]
    assert most == 2
