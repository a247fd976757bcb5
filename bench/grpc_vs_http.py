"""TEI's gRPC Embed (unary, and one EmbedStream per client) against HTTP POST /embed, one input a call.

One server with WARMPOOL_GRPC_PORT; at each client count the three ways take turns, round by round,
so the machine's drift hits them alike; each client sends its next input when its last is answered.
Prints inputs/s and p50 per way and client count, each gRPC way's ratio to HTTP measured in the
same rounds (the target: streaming at least 1.0x HTTP at 32 clients), and the CPU each call cost the
server's HTTP process and this load generator (robust to other load on the machine, which inputs/s
is not); never asserts.
Usage: .venv/bin/python -m bench.grpc_vs_http [--seconds 5] [--rounds 3] [--clients 1,32]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from bench.common import MODEL, Connection, cpu_ticks, pct, run, sentences
from tests.server_process import ServerProcess, free_port

WAYS = ("http", "grpc", "grpc-stream")


async def _clients(clients: int, seconds: float, call: Callable[[int, str], Awaitable[None]]) -> list[float]:
    """`clients` loops calling `call(client, text)` back to back for `seconds`: each call's latency in ms."""
    texts = sentences(512, seed=1)
    latencies: list[float] = []
    deadline = time.perf_counter() + seconds

    async def loop(client: int) -> None:
        i = client
        while time.perf_counter() < deadline:
            started = time.perf_counter()
            await call(client, texts[i % len(texts)])
            latencies.append((time.perf_counter() - started) * 1000)
            i += clients

    await asyncio.gather(*(loop(c) for c in range(clients)))
    return latencies


async def http_way(port: int, clients: int, seconds: float) -> list[float]:
    connections = [Connection(port) for _ in range(clients)]

    async def call(client: int, text: str) -> None:
        status, _, _ = await connections[client].post("/embed", {"inputs": text})
        assert status == 200, status

    try:
        return await _clients(clients, seconds, call)
    finally:
        for connection in connections:
            connection.close()


async def grpc_way(port: int, clients: int, seconds: float, streaming: bool) -> list[float]:
    from grpc import aio

    from server.grpc.messages import message

    request, response = message("EmbedRequest"), message("EmbedResponse")
    async with aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        if not streaming:
            embed = channel.unary_unary(
                "/tei.v1.Embed/Embed",
                request_serializer=request.SerializeToString,
                response_deserializer=response.FromString,
            )

            async def unary(client: int, text: str) -> None:
                await embed(request(inputs=text))

            return await _clients(clients, seconds, unary)
        open_stream = channel.stream_stream(
            "/tei.v1.Embed/EmbedStream",
            request_serializer=request.SerializeToString,
            response_deserializer=response.FromString,
        )
        streams = [open_stream() for _ in range(clients)]

        async def streamed(client: int, text: str) -> None:
            await streams[client].write(request(inputs=text))
            await streams[client].read()

        try:
            return await _clients(clients, seconds, streamed)
        finally:
            for stream in streams:
                await stream.done_writing()


async def measure(
    server_pid: int, http_port: int, grpc_port: int, clients: int, seconds: float, rounds: int
) -> dict[str, Any]:
    """Per way: inputs/s per round, every latency, and the CPU ticks the server's HTTP process
    (`server_pid`) and this process spent; the ways in turn within each round."""
    ways: dict[str, Callable[[], Awaitable[list[float]]]] = {
        "http": lambda: http_way(http_port, clients, seconds),
        "grpc": lambda: grpc_way(grpc_port, clients, seconds, streaming=False),
        "grpc-stream": lambda: grpc_way(grpc_port, clients, seconds, streaming=True),
    }
    found: dict[str, Any] = {way: {"rates": [], "latencies": [], "server": 0, "client": 0} for way in WAYS}
    for _ in range(rounds):
        for way in WAYS:
            server, client = cpu_ticks(server_pid), cpu_ticks(os.getpid())
            latencies = await ways[way]()
            found[way]["server"] += cpu_ticks(server_pid) - server
            found[way]["client"] += cpu_ticks(os.getpid()) - client
            found[way]["rates"].append(len(latencies) / seconds)
            found[way]["latencies"] += latencies
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--clients", default="1,32")
    parser.add_argument("--model", type=Path, default=MODEL)
    args = parser.parse_args()
    grpc_port = free_port()
    with tempfile.TemporaryDirectory() as tmp:
        server = ServerProcess(args.model, Path(tmp) / "server.log", grpc_port=grpc_port, log_level="warning")
        try:
            server.wait_ready()
            print(
                f"{'clients':>7} {'way':>12} {'inputs/s':>9} {'p50 ms':>7} {'x http':>7}"
                f" {'server cpu ms/call':>18} {'client cpu ms/call':>18}"
            )
            tick_ms = 1000 / os.sysconf("SC_CLK_TCK")
            for clients in (int(c) for c in args.clients.split(",")):
                found = run(measure(server.proc.pid, server.port, grpc_port, clients, args.seconds, args.rounds))
                http_rate = statistics.median(found["http"]["rates"])
                for way in WAYS:
                    rate = statistics.median(found[way]["rates"])
                    p50 = pct(found[way]["latencies"], 0.5)
                    calls = max(len(found[way]["latencies"]), 1)
                    server_ms, client_ms = (found[way][k] * tick_ms / calls for k in ("server", "client"))
                    print(
                        f"{clients:>7} {way:>12} {rate:>9.1f} {p50:>7.2f} {rate / http_rate:>7.2f}"
                        f" {server_ms:>18.3f} {client_ms:>18.3f}"
                    )
        finally:
            server.stop()


if __name__ == "__main__":
    main()
