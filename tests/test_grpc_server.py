"""TEI's gRPC API in the real server process: grpc.aio on uvicorn's own loop, started with the
server and stopped by its drain (health NOT_SERVING, then the port closed, within the drain)."""

from __future__ import annotations

import signal
import socket
from pathlib import Path

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from tests.server_process import ServerProcess, free_port
from tests.tei_grpc import tei_stubs

TIMEOUT_S = 60.0
SERVING, NOT_SERVING = health_pb2.HealthCheckResponse.SERVING, health_pb2.HealthCheckResponse.NOT_SERVING


def test_grpc_serves_on_the_servers_loop_then_drains(model_dir: Path, tmp_path: Path) -> None:
    port = free_port()
    server = ServerProcess(model_dir, tmp_path / "server.log", grpc_port=port)
    try:
        server.wait_ready()
        with tei_stubs(tmp_path) as tei, grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            watched = health_pb2_grpc.HealthStub(channel).Watch(health_pb2.HealthCheckRequest(), timeout=TIMEOUT_S)
            assert next(s.status for s in watched if s.status == SERVING) == SERVING
            got = tei.rpc.EmbedStub(channel).Embed(tei.pb.EmbedRequest(inputs="hello"), timeout=TIMEOUT_S)
            assert len(got.embeddings) == len(server.post("/embed", json={"inputs": "hello"}).json()[0])
            server.proc.send_signal(signal.SIGTERM)
            assert next(s.status for s in watched if s.status == NOT_SERVING) == NOT_SERVING
        assert server.proc.wait(TIMEOUT_S) == 0
    finally:
        server.stop()


def test_a_taken_grpc_port_fails_the_start(model_dir: Path, tmp_path: Path) -> None:
    """The bind phase fails with the reason, then the process exits 1: never a server without the API asked for."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        server = ServerProcess(model_dir, tmp_path / "server.log", grpc_port=port, fail_linger=0.5)
        try:
            (failed,) = server.wait_failed()
            assert failed["name"] == "bind" and f"gRPC on port {port}" in failed["detail"]["error"]
            assert server.proc.wait(TIMEOUT_S) == 1
        finally:
            server.stop()
