"""warmpool against the servers its users would pick instead, in one window: the same load for each.

Each server in turn, alone on the machine: start it and time it to ready, then for each client count
the same batch-1 `/v1/embeddings` load with a health probe alongside (bench.load.load), with
sentence-transformers `encode` (batch 32) measured right before as the baseline, and the PSS of the
server's processes after the load. Prints one line per server and level, ratios against the raw
model and against the first server; never asserts.

A peer is `NAME=COMMAND`: COMMAND starts its server in the foreground on the model folder, with
`{model}`, `{name}` and `{port}` filled in, ready when `GET {health}` answers 200 (`--peer-health`,
default /health); the bench installs nothing.
`--warmpool float32+compiled` is warmpool with compiled engines, its artifact built before the
timed start (so `ready` is a start with the cache warm).
Usage: .venv/bin/python -m bench.peers [--warmpool float32,float32+compiled,int8]
         [--peer 'vllm=start-vllm.sh {model} {name} {port}'] [--clients 1,32] [--seconds 15]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shlex
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx

from bench.common import MODEL, pct, run, sentences
from bench.load import RawModel, Window, load
from common.procmem import process_memory
from tests.server_process import ServerProcess, free_port, wait_for


@dataclass
class Served:
    port: int
    pid: int
    ready_s: float
    probe: str


def tree(pid: int) -> list[int]:
    """pid and every process below it."""
    parents: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        with contextlib.suppress(OSError, ValueError, IndexError):
            parents[int(entry.name)] = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
    found, todo = [], [pid]
    while todo:
        found.append(current := todo.pop())
        todo += [child for child, parent in parents.items() if parent == current]
    return found


def pss_mb(pid: int) -> float:
    return sum((process_memory(p) or {}).get("pss_mb", 0.0) for p in tree(pid))


@contextlib.contextmanager
def warmpool(variant: str, log: Path) -> Iterator[Served]:
    """`float32` (eager), or `float32+compiled`: its artifact built first, then timed from a warm cache."""
    dtype, _, compiled = variant.partition("+")
    settings: dict[str, object] = {"dtype": dtype}
    if compiled:
        settings.update(compile="required", compile_cache=log.parent / "compile-cache")
        ServerProcess(MODEL, log, log_level="warning", **settings).wait_ready(timeout=1200).stop()
    started = time.monotonic()
    server = ServerProcess(MODEL, log, log_level="warning", **settings).wait_ready()
    ready = time.monotonic() - started
    server.wait_engines()
    try:
        yield Served(server.port, server.proc.pid, ready, "/health/live")
    finally:
        server.stop()


@contextlib.contextmanager
def peer(command: str, name: str, health: str, log: Path) -> Iterator[Served]:
    port = free_port()
    line = command.format(model=shlex.quote(str(MODEL)), name=MODEL.name, port=port)
    started = time.monotonic()
    with log.open("wb") as out:
        proc = subprocess.Popen(line, shell=True, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    try:

        def up() -> bool:
            if proc.poll() is not None:
                raise AssertionError(f"{name} exited with {proc.returncode}: {log.read_text()[-2000:]}")
            with contextlib.suppress(httpx.HTTPError):
                return httpx.get(f"http://127.0.0.1:{port}{health}", timeout=2).status_code == 200
            return False

        wait_for(up, 300, f"{name} ready", interval=0.05)
        yield Served(port, proc.pid, time.monotonic() - started, health)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument(
        "--warmpool", default="float32", help="warmpool's dtypes, comma-separated; DTYPE+compiled: compiled engines"
    )
    parser.add_argument("--peer", action="append", default=[], help="NAME=COMMAND (repeatable)")
    parser.add_argument("--peer-health", default="/health")
    parser.add_argument("--clients", default="1,32")
    parser.add_argument("--seconds", type=float, default=15)
    args = parser.parse_args()
    texts = sentences(2000)
    levels = [int(n) for n in args.clients.split(",")]
    raw = RawModel(texts[:320], threads=os.cpu_count() or 1)
    servers = [(f"warmpool {dtype}", dtype, "") for dtype in args.warmpool.split(",") if dtype]
    servers += [(spec.split("=", 1)[0], "", spec.split("=", 1)[1]) for spec in args.peer]
    first: dict[int, float] = {}
    print("server, clients: inputs/s (x raw, x first server), p50/p99 ms, probe p99 ms, errors; ready s; PSS MB")
    with tempfile.TemporaryDirectory() as tmp:
        for label, dtype, command in servers:
            log = Path(tmp) / f"{label.replace(' ', '-')}.log"
            context = warmpool(dtype, log) if not command else peer(command, label, args.peer_health, log)
            with context as served:
                for clients in levels:
                    baseline = raw.throughput()
                    window: Window = run(load(served.port, clients, args.seconds, texts, probe=served.probe))
                    rate = window.inputs_s
                    first.setdefault(clients, rate)
                    print(
                        f"{label}, {clients}: {rate:.1f}/s ({rate / baseline:.2f} x raw {baseline:.0f}/s, "
                        f"{rate / first[clients]:.2f} x first), {pct(window.latencies, 0.5):.1f}/"
                        f"{pct(window.latencies, 0.99):.1f} ms, probe p99 {window.probe_p99:.1f} ms, "
                        f"errors {window.errors}; ready {served.ready_s:.1f} s; PSS {pss_mb(served.pid):.0f} MB",
                        flush=True,
                    )


if __name__ == "__main__":
    main()
