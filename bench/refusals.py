"""The CPU a refused request (429) costs the HTTP process, stage by stage, and /health/live under a
flood of them: in-process, raw ASGI calls into the real app (create_app + with_middleware) with
every admission permit held, no server, no engine. Prints microseconds per call and ratios against
a baseline measured in the same run (a bare ASGI app answering 204); never asserts.

Stages by difference: the whole stack (request tracking, the body limit, the direct routes, the
pipeline), the same without RequestTracking, a 64 KiB body instead of a small one, the key check
(an API key configured), the error's rendering alone.
Each round runs in a fresh interpreter; with --base, the same bench against another tree's server
code, rounds alternating (the machine drifts), and the paired ratios this / base.
Usage: .venv/bin/python -m bench.refusals [--calls 2000] [--rounds 5] [--base DIR]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import orjson

from bench.common import MODEL, ROOT
from common.modelfolder import read_model_folder
from common.settings import Settings
from common.startup import PHASES, StartupState
from orchestrator import logs
from server.core.inputs import overloaded
from server.core.services import ServedModel, Services
from server.http.app import create_app, with_middleware
from server.http.errors import error_response
from server.tokenizing.tokenizer import TokenizerPool

Call = Callable[[], Awaitable[int]]
KEY = "bench-key"


def services(executor: ThreadPoolExecutor, **settings: Any) -> Services:
    """Every phase done, the embedded model served, its 4 permits all held: every request is a 429."""
    startup = StartupState()
    for phase in PHASES:
        startup.start(phase)
        startup.done(phase)
    startup.engine_up = True
    svc = Services(
        settings=Settings(max_concurrent_inputs=4, log_level="warning", **settings), startup=startup, executor=executor
    )
    svc.models["minilm"] = ServedModel("minilm", read_model_folder(MODEL), TokenizerPool(MODEL), engine=None)  # type: ignore[arg-type]
    svc.admission.try_acquire(4)
    return svc


def asgi_call(app: Any, method: str, path: str, body: bytes = b"", key: str | None = None) -> Call:
    """One request through `app` as uvicorn calls it; returns the status."""
    headers = [(b"host", b"bench"), (b"content-type", b"application/json")]
    headers.append((b"content-length", str(len(body)).encode()))
    if key is not None:
        headers.append((b"authorization", f"Bearer {key}".encode()))

    async def call() -> int:
        scope = {
            "type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": method, "path": path,
            "raw_path": path.encode(), "root_path": "", "scheme": "http", "query_string": b"", "headers": headers,
            "client": ("127.0.0.1", 1), "server": ("127.0.0.1", 8000),
        }  # fmt: skip
        sent = False
        status = 0

        async def receive() -> dict[str, Any]:
            nonlocal sent
            if sent:
                await asyncio.Event().wait()  # http.disconnect would come only when the client leaves
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}

        async def send(message: dict[str, Any]) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]

        await app(scope, receive, send)
        return status

    return call


async def bare(scope: Any, receive: Any, send: Any) -> None:
    await send({"type": "http.response.start", "status": 204, "headers": []})
    await send({"type": "http.response.body", "body": b""})


async def per_call_us(call: Call, calls: int) -> float:
    """CPU microseconds per call, `calls` of them one after another on this loop."""
    assert await call() in (204, 200, 429), "the bench's request was not refused as expected"
    started = time.process_time()
    for _ in range(calls):
        await call()
    return (time.process_time() - started) / calls * 1e6


async def probe_under_flood(app: Any, flood: int, probes: int) -> tuple[float, float]:
    """/health/live's p50 and max wall ms while `flood` refused requests run concurrently."""
    probe = asgi_call(app, "GET", "/health/live")
    refuse = asgi_call(app, "POST", "/v1/embeddings", orjson.dumps({"input": "a refused request"}))
    latencies = []

    async def prober() -> None:
        for _ in range(probes):
            started = time.perf_counter()
            await probe()
            latencies.append((time.perf_counter() - started) * 1000)
            await asyncio.sleep(0)

    flooding = [asyncio.ensure_future(refuse()) for _ in range(flood)]
    await prober()
    await asyncio.gather(*flooding)
    return statistics.median(latencies), max(latencies)


async def measure(calls: int) -> dict[str, float]:
    """One round: µs per call for each case, and /health/live's wall ms alone and under a flood."""
    small = orjson.dumps({"input": "a refused request", "model": "minilm"})
    large = orjson.dumps({"input": ["x" * 1000] * 64})
    with ThreadPoolExecutor(2) as executor:
        stack = with_middleware(create_app(services(executor)))
        keyed = with_middleware(create_app(services(executor, api_key=KEY)))
        inner = getattr(stack, "app")  # noqa: B009  RequestTracking's: the stack without it
        rendered = overloaded()

        async def nothing() -> dict[str, Any]:
            return {"type": "http.disconnect"}

        async def ignore(message: Any) -> None:
            return None

        async def render_only() -> int:
            await error_response(rendered)({"type": "http"}, nothing, ignore)
            return 429

        cases: dict[str, Call] = {
            "baseline (bare ASGI app)": asgi_call(bare, "POST", "/v1/embeddings", small),
            "429, whole stack": asgi_call(stack, "POST", "/v1/embeddings", small),
            "429, no RequestTracking": asgi_call(inner, "POST", "/v1/embeddings", small),
            "429, 64 KiB body": asgi_call(stack, "POST", "/v1/embeddings", large),
            "429, API key checked": asgi_call(keyed, "POST", "/v1/embeddings", small, KEY),
            "429 rendering alone": render_only,
            "/health/live, whole stack": asgi_call(stack, "GET", "/health/live"),
        }
        results = {name: await per_call_us(call, calls) for name, call in cases.items()}
        results["probe ms alone"] = (await probe_under_flood(stack, 0, 200))[0]
        flooded = await probe_under_flood(stack, 2000, 200)
        results["probe ms, 2000 429s beside"], results["probe max ms, flood"] = flooded
    return results


def one_round(source: Path, calls: int, log_level: str) -> dict[str, float]:
    """measure() in a fresh interpreter running `source`'s server code (this file's bench code)."""
    code = (  # this file loaded by its path: the other tree may have no bench/refusals.py
        f"import sys, json, importlib.util as u; sys.path[0:0] = [{str(source)!r}]; "
        f"s = u.spec_from_file_location('refusals', {__file__!r}); b = u.module_from_spec(s); s.loader.exec_module(b); "
        f"print(json.dumps(b.quiet_round({calls}, {log_level!r})))"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=source, check=True, capture_output=True, text=True)
    return dict(json.loads(out.stdout.strip().splitlines()[-1]))


def quiet_round(calls: int, log_level: str) -> dict[str, float]:
    """A round with the access log written as a server writes it (JSON lines), into /dev/null."""
    with open(os.devnull, "w") as devnull, contextlib.redirect_stdout(devnull):
        logs.configure(log_level, "json")
        return asyncio.run(measure(calls))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--log-level", default="info", help="the server's WARMPOOL_LOG_LEVEL (default: its default)")
    parser.add_argument("--base", type=Path, help="a tree to compare with, rounds alternating (its server code)")
    args = parser.parse_args()
    trees = {"this": ROOT, **({"base": args.base.resolve()} if args.base else {})}
    runs: dict[str, list[dict[str, float]]] = {name: [] for name in trees}
    for round_ in range(args.rounds):
        for name in list(trees) if round_ % 2 == 0 else list(trees)[::-1]:
            runs[name].append(one_round(trees[name], args.calls, args.log_level))
    medians = {name: {k: statistics.median(r[k] for r in rs) for k in rs[0]} for name, rs in runs.items()}
    for name, m in medians.items():
        base_us = m["baseline (bare ASGI app)"]
        print(f"{name} ({trees[name]}), medians of {args.rounds} rounds:")
        for case, value in m.items():
            unit = "ms wall" if "ms" in case else f"µs CPU per call, {value / base_us:6.1f} x baseline"
            print(f"  {case:32s} {value:8.3f} {unit}")
    if "base" in medians:
        print("this / base, paired by round (median):")
        for case in medians["this"]:
            ratio = [t[case] / b[case] for t, b in zip(runs["this"], runs["base"], strict=True) if b[case]]
            print(f"  {case:32s} {statistics.median(ratio):6.2f}")


if __name__ == "__main__":
    main()
