"""Throughput and latency at 1, 8 and 32 clients against the raw model, with a liveness prober.

Prints ratios against sentence-transformers `encode` (batch 32, same thread count) measured in
the same run; never asserts. This machine's speed drifts by tens of percent within a minute, so
each level's time is split into windows that alternate with short raw-model runs (the server idle
meanwhile): every window is compared with the raw runs just before and after it, and a level's
ratio is the median of its windows'. Engines are eager unless --compiled (WARMPOOL_COMPILE=required, the
artifact built into the run's own cache before the server is ready).
Usage: .venv/bin/python -m bench.load [--seconds 15] [--windows 3] [--clients 1,8,32] [--engines N] [--dtype int8]
         [--compiled] [--model DIR] [--raw-texts 320]
"""

from __future__ import annotations

import argparse
import asyncio
import http.client
import os
import random
import statistics
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from bench.common import MODEL, Connection, Prober, chosen, compiled, pct, run, sentences
from bench.flops import achieved_gflops, peak_gflops
from tests.server_process import ServerProcess


class Baseline(Protocol):
    """What a level's windows alternate with: the raw model's inputs/s, measured then and there."""

    def throughput(self) -> float: ...


class RawModel:
    """sentence-transformers `encode` on the same sentences (SparseEncoder's for a SPLADE folder,
    MultiVectorEncoder's encode_document for a ColBERT): the baseline every ratio divides by."""

    def __init__(self, texts: list[str], threads: int, model: Path = MODEL) -> None:
        import torch
        from sentence_transformers import MultiVectorEncoder, SentenceTransformer, SparseEncoder

        from common.modelfolder import read_model_folder

        torch.set_num_threads(threads)
        self.texts = texts
        kind = read_model_folder(model).kind
        references = {"sparse": SparseEncoder, "multi-vector": MultiVectorEncoder}
        self.model = references.get(kind, SentenceTransformer)(str(model), device="cpu")
        self.encode = self.model.encode_document if kind == "multi-vector" else self.model.encode
        self.encode(texts[:64], batch_size=32)

    def throughput(self) -> float:
        """Sentences/s at batch 32."""
        started = time.perf_counter()
        self.encode(self.texts, batch_size=32)
        return len(self.texts) / (time.perf_counter() - started)

    def single_latency(self) -> float:
        """Median ms to encode one sentence alone."""
        singles = []
        for text in self.texts[:100]:
            started = time.perf_counter()
            self.encode([text], batch_size=1)
            singles.append((time.perf_counter() - started) * 1000)
        return statistics.median(singles)


@dataclass
class Window:
    """One stretch of load: what the clients and the prober saw."""

    seconds: float = 0.0
    latencies: list[float] = field(default_factory=list)
    probes: list[float] = field(default_factory=list)
    errors: int = 0
    per_request: float = 1  # inputs each request carries

    @property
    def inputs_s(self) -> float:
        return len(self.latencies) * self.per_request / self.seconds if self.seconds else 0.0

    @property
    def probe_p99(self) -> float:
        return pct(self.probes, 0.99)

    def __add__(self, other: Window) -> Window:
        return Window(
            self.seconds + other.seconds,
            self.latencies + other.latencies,
            self.probes + other.probes,
            self.errors + other.errors,
            self.per_request,
        )


async def load(
    port: int,
    clients: int,
    seconds: float,
    texts: list[str],
    route: str = "/v1/embeddings",
    probe: str = "/health/live",
    body: Callable[[random.Random], Any] | None = None,
    per_request: float = 1,
    pause: float = 0.0,
) -> Window:
    """`clients` keep-alive clients, one request at a time each to `route`, for `seconds`, while
    `probe` is polled. A request is one of `texts`, or what `body` makes (`per_request` inputs). Each
    client waits `pause` seconds after each answer (a light user: the server idles between requests)."""
    window = Window(per_request=per_request)
    prober = Prober(port, probe)
    deadline = time.perf_counter() + seconds
    make = body or (lambda rng: {"input": rng.choice(texts)})

    async def client(seed: int) -> None:
        rng = random.Random(seed)
        conn = Connection(port)
        while time.perf_counter() < deadline:
            t0 = time.perf_counter()
            status, _, _ = await conn.post(route, make(rng))
            if status == 200:
                window.latencies.append((time.perf_counter() - t0) * 1000)
            else:
                window.errors += 1
            if pause:
                await asyncio.sleep(pause)
        conn.close()

    started = time.perf_counter()
    await asyncio.gather(*(client(i) for i in range(clients)))
    window.seconds = time.perf_counter() - started
    window.probes = prober.stop()
    return window


@dataclass
class Level:
    clients: int
    total: Window
    ratios: list[float]  # each window's inputs/s over the raw runs around it
    raw: list[float]  # raw-model inputs/s before the first window and after each
    stages: dict[str, float] = field(default_factory=dict)  # the server's mean ms per stage (STAGES)


def run_level(
    port: int,
    raw: Baseline,
    clients: int,
    seconds: float,
    windows: int,
    texts: list[str],
    route: str,
    probe: str = "/health/live",
    body: Callable[[random.Random], Any] | None = None,
    per_request: int = 1,
) -> Level:
    """`windows` windows of load(), each after a raw run, and one raw run after the last."""
    rates = [raw.throughput()]
    total, ratios = Window(per_request=per_request), []
    before = server_times(port, route)
    for _ in range(windows):
        window = run(load(port, clients, seconds / windows, texts, route, probe, body, per_request))
        rates.append(raw.throughput())
        ratios.append(window.inputs_s / statistics.mean(rates[-2:]))
        total += window
    after = server_times(port, route)
    means = {
        name: (after[name][0] - before[name][0]) / max(after[name][1] - before[name][1], 1) * 1000 for name in after
    }
    return Level(clients, total, ratios, rates, means)


# which GEMM peaks a server dtype is measured against, beside float32's
PEAKS = {"int8": ("int8",), "bfloat16": ("bfloat16",)}

# The server's own histograms: where a request's time goes inside it (milliseconds, means per level):
# metric, and a label every counted line must carry
STAGES = {
    "handler": ("warmpool_request_duration_seconds", 'route="{route}",status="200"'),
    "tokenize": ("warmpool_tokenization_time_seconds", ""),
    "queue": ("warmpool_queue_time_seconds", ""),
    "forward": ("warmpool_inference_time_seconds", ""),
}


def server_times(port: int, route: str) -> dict[str, tuple[float, float]]:
    """Each stage's (sum of seconds, count) so far, from /metrics, over all its label sets."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    conn.request("GET", "/metrics")
    lines = [line.rsplit(" ", 1) for line in conn.getresponse().read().decode().splitlines() if line[:1] != "#"]
    conn.close()

    def total(metric: str, label: str, part: str) -> float:
        return sum(float(v) for k, v in lines if k.split("{")[0] == f"{metric}_{part}" and label in k)

    stages = {name: (m, label.format(route=route)) for name, (m, label) in STAGES.items()}
    return {name: (total(m, label, "sum"), total(m, label, "count")) for name, (m, label) in stages.items()}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seconds", type=float, default=15, help="load per level, all windows together")
    parser.add_argument("--windows", type=int, default=3, help="raw-model runs interleaved per level")
    parser.add_argument("--clients", default="1,8,32")
    parser.add_argument("--engines", type=int, help="WARMPOOL_ENGINES (default: the server's)")
    parser.add_argument("--model", type=Path, default=MODEL, help="a model folder (bench.shapes makes big ones)")
    parser.add_argument("--raw-texts", type=int, default=320, help="sentences per raw-model run")
    parser.add_argument("--dtype", help="WARMPOOL_DTYPE (default: the server's); the raw model stays float32")
    parser.add_argument("--compiled", action="store_true", help="compiled engines (built before ready); else eager")
    args = parser.parse_args()
    texts = sentences(2000)
    threads = os.cpu_count() or 1
    peaks = {name: peak_gflops(name) for name in ("float32", *PEAKS.get(args.dtype or "", ()))}
    raw = RawModel(texts[: args.raw_texts], threads, args.model)
    route = "/pooling" if raw.encode != raw.model.encode else "/v1/embeddings"  # a ColBERT's document vectors
    levels: list[Level] = []
    single: list[float] = []
    with tempfile.TemporaryDirectory() as tmp:
        settings = chosen(engines=args.engines, dtype=args.dtype) | (compiled(Path(tmp)) if args.compiled else {})
        server = ServerProcess(args.model, Path(tmp) / "server.log", log_level="warning", **settings).wait_ready(1200)
        server.wait_engines()
        try:
            mflop_per_token = float(server.phase("warmup")["detail"].get("mflop_per_token", "nan"))
            for clients in (int(c) for c in args.clients.split(",")):
                if clients == 1:
                    single.append(raw.single_latency())
                levels.append(run_level(server.port, raw, clients, args.seconds, args.windows, texts, route))
                if clients == 1:
                    single.append(raw.single_latency())
        finally:
            server.stop()
    print(
        f"server dtype: {args.dtype or 'default'}; raw model: sentence-transformers encode, float32, batch 32, "
        f"{threads} threads, sentences/s"
    )
    for level in levels:
        print(f"  around the {level.clients}-client windows: " + " / ".join(f"{r:.1f}" for r in level.raw))
    print("clients  inputs/s  x_raw (windows)     p50_ms  p99_ms  probe_p50  probe_p99  probe_max  errors")
    for level in levels:
        t = level.total
        spread = "-".join(f"{r:.2f}" for r in (min(level.ratios), max(level.ratios)))
        print(
            f"{level.clients:7d}  {t.inputs_s:8.1f}  {statistics.median(level.ratios):5.2f} ({spread})  "
            f"{pct(t.latencies, 0.5):6.1f}  {pct(t.latencies, 0.99):6.1f}  {pct(t.probes, 0.5):9.2f}  "
            f"{t.probe_p99:9.2f}  {max(t.probes, default=float('nan')):9.2f}  {t.errors:6d}"
        )
        if level.clients == 1 and single:
            raw_single = statistics.mean(single)
            p50 = pct(t.latencies, 0.5)
            print(
                f"         1-client p50 {p50:.1f} ms - raw single-sentence p50 {raw_single:.1f} ms "
                f"= {p50 - raw_single:+.1f} ms"
            )
            m = level.stages
            rest, client = m["handler"] - m["tokenize"] - m["queue"] - m["forward"], statistics.mean(t.latencies)
            print(
                f"         1-client means, ms: at the client {client:.2f} = in the handler {m['handler']:.2f} "
                f"(tokenize {m['tokenize']:.2f}, to the engine {m['queue']:.2f}, forward {m['forward']:.2f}, "
                f"the rest {rest:.2f}) + outside it {client - m['handler']:.2f}"
            )
    report_flops(levels, texts, args.model, mflop_per_token, peaks)


def report_flops(
    levels: list[Level], texts: list[str], model: Path, mflop_per_token: float, peaks: dict[str, float]
) -> None:
    """Each level's matrix work per second against the peak GEMM rates measured before the run."""
    from server.tokenizing.tokenizer import TokenizerPool

    pool = TokenizerPool(model)
    tokens = statistics.mean(len(pool.encode(text).input_ids) for text in texts)
    peak_text = ", ".join(f"{name} {rate:.0f}" for name, rate in peaks.items())
    print(
        f"matrix work ({mflop_per_token:.1f} MFLOP/token x {tokens:.1f} tokens/input) against the peak GEMM "
        f"measured here ({peak_text} G(FL)OP/s):"
    )
    for level in levels:
        served = achieved_gflops(level.total.inputs_s, tokens, mflop_per_token)
        raw = achieved_gflops(statistics.mean(level.raw), tokens, mflop_per_token)
        shares = " / ".join(f"{served / rate:.0%} of {name}" for name, rate in peaks.items())
        print(
            f"  {level.clients:3d} clients: served {served:6.1f} GFLOP/s ({shares}); raw float32 {raw:6.1f} "
            f"({raw / peaks['float32']:.0%} of float32)"
        )


if __name__ == "__main__":
    main()
