"""A cold compile beside serving: how long the compile worker takes, and what serving pays meanwhile.

1. The worker alone (`python -m engine.compiling.worker`, as an engine starts it): seconds on an
   empty cache, then for a second artifact once the vector-instruction probes are kept in the cache.
2. One client at a time (distinct texts: no cache hits) against 2 engines while the cold compile
   runs, until it is done: requests/s, p50, and the compile's seconds; then the same client with
   `compile=off` for as long, the baseline.
3. An engine killed with -9 during the compile: seconds until its replacement serves, against the
   same with `compile=off`.

Default model: all-MiniLM-L6-v2; `--big` adds a ~1.3 GB random-weight BERT-large built in a
temporary folder (removed at the end). Prints; never asserts.
Usage: .venv/bin/python -m bench.compile_beside [--big] [--limit 240]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.coldstart import big_model, kill_recovery
from bench.common import MODEL
from common.wire import COMPILE_NICE
from tests.server_process import ServerProcess


def worker_seconds(folder: Path, cache: Path, name: str) -> float:
    """One compile by the real worker into `cache` (this process stands in for its engine)."""
    started = time.monotonic()
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "engine.compiling.worker",
            str(folder),
            "float32",
            str(cache / name),
            str(os.getpid()),
            str(COMPILE_NICE),
        ],
        capture_output=True,
        text=True,
    )
    if done.returncode != 0:
        raise SystemExit(f"the worker failed: {done.stderr[-500:]}")
    return time.monotonic() - started


def one_client(server: ServerProcess, until: float, compiling: bool) -> list[float]:
    """Milliseconds of sequential 1-input requests until `until` (or the compile is done, asked every
    half second: a startup read per request would be load the baseline has not)."""
    latencies: list[float] = []
    asked = time.monotonic()
    while time.monotonic() < until:
        if compiling and time.monotonic() >= asked:
            if server.phase("compile")["state"] != "running":
                break
            asked = time.monotonic() + 0.5
        started = time.perf_counter()
        response = server.post("/v1/embeddings", json={"input": f"a short sentence to embed, number {len(latencies)}"})
        assert response.status_code == 200, response.text
        latencies.append((time.perf_counter() - started) * 1000)
    return latencies


def bench_model(folder: Path, tmp: Path, limit: float) -> None:
    print(f"{folder.name}:", flush=True)
    cache = tmp / "worker-cache"
    cold, kept = worker_seconds(folder, cache, "a"), worker_seconds(folder, cache, "b")
    print(f"  the worker alone: {cold:.1f} s on an empty cache, {kept:.1f} s with the probes kept", flush=True)
    server = ServerProcess(folder, tmp / "auto.log", engines=2, compile="auto", compile_cache=tmp / "auto-cache")
    try:
        server.wait_ready().wait_engines()
        started = time.monotonic()
        during = one_client(server, started + limit, compiling=True)
        seconds, state = time.monotonic() - started, server.phase("compile")["state"]
    finally:
        server.stop()
    server = ServerProcess(folder, tmp / "off.log", engines=2, compile="off")
    try:
        server.wait_ready().wait_engines()
        alone = one_client(server, time.monotonic() + seconds, compiling=False)
    finally:
        server.stop()
    print(
        f"  one client beside the cold compile ({state} after {seconds:.1f} s): "
        f"{len(during) / seconds:.1f} requests/s, p50 {statistics.median(during):.0f} ms; "
        f"with compile=off {len(alone) / seconds:.1f}/s, "
        f"p50 {statistics.median(alone):.0f} ms ({len(during) / max(len(alone), 1):.2f}x)",
        flush=True,
    )
    recovery = {}
    for mode in ("auto", "off"):
        server = ServerProcess(
            folder, tmp / f"kill-{mode}.log", engines=2, compile=mode, compile_cache=tmp / f"kill-{mode}"
        )
        try:
            server.wait_ready().wait_engines()
            recovery[mode] = kill_recovery(server)
        finally:
            server.stop()
    print(
        f"  an engine killed during the compile: serving again in {recovery['auto']:.2f} s "
        f"(compile=off: {recovery['off']:.2f} s)",
        flush=True,
    )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--big", action="store_true", help="also a ~1.3 GB BERT-large (built here, removed after)")
    parser.add_argument("--limit", type=float, default=240.0, help="seconds of serving beside a compile at most")
    args = parser.parse_args()
    tmp = Path(tempfile.mkdtemp())
    try:
        bench_model(MODEL, tmp / "default", args.limit)
        if args.big:
            bench_model(big_model(tmp / "bert-large"), tmp / "big", args.limit)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
