"""Two server configurations side by side: 32-client throughput in alternating rounds, paired ratios.

The machine drifts by tens of percent within a minute, more than most changes are worth; two
servers kept up at once and loaded in turn (ABBA...) see the same drift, so the per-round
ratio B/A is far steadier than two separate runs; the p99 of all of a server's rounds' requests, and
the p99 ratio per round, are steadier than one round's p99 (~1,500 requests at 32 clients). Never asserts.
To compare code, run B from another source tree, e.g. a worktree of the base commit:
    git worktree add /tmp/base HEAD~1 && .venv/bin/python -m bench.paired --b-source /tmp/base
Usage: .venv/bin/python -m bench.paired [--b engines=1] [--b-source DIR] [--b-env K=V,...] [--a ""] [--rounds 5]
       [--seconds 5]
       [--clients 32] [--busy 0] [--model-dir DIR] [--inputs 1,1,1,16]
Tracing's cost: --b otlp_endpoint={collector} (an OTLP/HTTP receiver is started for it).
A neighbour: --busy N runs N busy processes (a Python loop each, niceness 0) through every round, as
a sidecar or the HTTP process's own work would take cores. --model-dir serves another folder.
Mixed request sizes: --inputs 1,1,1,16 gives each request a size drawn from the list (inputs/s
counts the list's mean a request).
Images: --images serves bench.images' ViT-B/32-shaped CLIP its JPEGs, one a request (use --seconds 10:
a 32-client round trip takes over a second).
"""

from __future__ import annotations

import argparse
import random
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench.common import MODEL, ROOT, run, sentences
from bench.images import data_urls, image_requests, photos
from bench.load import Window, load, pct
from tests.otlp_receiver import HttpReceiver
from tests.server_process import ServerProcess
from tests.tiny_vision import VIT_B_32, build_clip


def settings(text: str) -> dict[str, str]:
    """'engines=1,executor_threads=2' -> WARMPOOL_* settings for ServerProcess."""
    return dict(pair.split("=", 1) for pair in text.split(",") if pair)


def mixed_requests(texts: list[str], sizes: list[int]) -> Callable[[random.Random], Any]:
    """Bodies of a size drawn from `sizes`, of sentences drawn from `texts`."""
    return lambda rng: {"input": rng.sample(texts, rng.choice(sizes))}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--a", default="", help="settings of A (default: the server's defaults)")
    parser.add_argument("--b", default="", help="settings of B, e.g. engines=1")
    parser.add_argument("--b-source", type=Path, default=ROOT, help="source tree B runs from (default: this one)")
    parser.add_argument(
        "--b-env", default="", help="environment variables of B's processes, e.g. OMP_WAIT_POLICY=PASSIVE"
    )
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--seconds", type=float, default=5)
    parser.add_argument("--clients", type=int, default=32)
    parser.add_argument("--images", action="store_true", help="bench.images' model and images instead of texts")
    parser.add_argument("--busy", type=int, default=0, help="busy processes beside the servers in every round")
    parser.add_argument("--model-dir", type=Path, default=MODEL, help=f"the model folder (default {MODEL})")
    parser.add_argument("--inputs", default="1", help="inputs a request, drawn from this list (e.g. 1,1,1,16)")
    args = parser.parse_args()
    texts = data_urls(photos(8)) if args.images else sentences(2000)
    sizes = [int(n) for n in args.inputs.split(",")]
    body = image_requests(texts) if args.images else None if sizes == [1] else mixed_requests(texts, sizes)
    collector = None
    if "{collector}" in args.a + args.b:  # an OTLP receiver for tracing's cost: otlp_endpoint={collector}
        collector = HttpReceiver(decode=False)
        args.a, args.b = (text.replace("{collector}", collector.endpoint) for text in (args.a, args.b))
    configs = {"A": settings(args.a), "B": settings(args.b)}
    sources = {"A": ROOT, "B": args.b_source.resolve()}
    environs = {"A": {}, "B": settings(args.b_env)}
    if configs["A"] == configs["B"] and sources["A"] == sources["B"] and not environs["B"]:
        parser.error("A and B are the same: give --b settings, --b-env or a --b-source tree")
    with tempfile.TemporaryDirectory() as tmp:
        model = build_clip(Path(tmp) / "clip-vit-b-32", shape=VIT_B_32) if args.images else args.model_dir
        servers = {
            name: ServerProcess(
                model,
                Path(tmp) / f"{name}.log",
                source=sources[name],
                environ=environs[name],
                log_level="warning",
                **cfg,
            ).wait_ready(600)
            for name, cfg in configs.items()
        }
        results: dict[str, list[Window]] = {"A": [], "B": []}
        busy = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(args.busy)]
        try:
            for server in servers.values():
                server.wait_engines()
            for round_ in range(args.rounds):
                for name in "AB" if round_ % 2 == 0 else "BA":
                    port = servers[name].port
                    window = load(
                        port, args.clients, args.seconds, texts, body=body, per_request=statistics.mean(sizes)
                    )
                    results[name].append(run(window))
        finally:
            for process in busy:
                process.kill()
                process.wait()
            for server in servers.values():
                server.stop()
    for name, cfg in configs.items():
        rate = statistics.mean(r.inputs_s for r in results[name])
        probe = statistics.median(r.probe_p99 for r in results[name])
        p50 = statistics.median(pct(r.latencies, 0.5) for r in results[name])
        p99 = statistics.median(pct(r.latencies, 0.99) for r in results[name])
        pooled = pct([ms for r in results[name] for ms in r.latencies], 0.99)  # steadier than a round's
        where = ("" if sources[name] == ROOT else f" from {sources[name]}") + "".join(
            f" {k}={v}" for k, v in environs[name].items()
        )
        print(
            f"{name} {cfg or 'defaults'}{where}: {rate:.1f} inputs/s (mean), p50/p99 {p50:.1f}/{p99:.1f} ms, "
            f"probe p99 {probe:.1f} ms (medians); "
            f"p99 of every round's requests {pooled:.1f} ms"
        )
    ratios = [b.inputs_s / a.inputs_s for a, b in zip(results["A"], results["B"], strict=True)]
    print(f"B/A per round: {' '.join(f'{r:.2f}' for r in ratios)}; mean {statistics.mean(ratios):.2f}")
    tails = [pct(b.latencies, 0.99) / pct(a.latencies, 0.99) for a, b in zip(results["A"], results["B"], strict=True)]
    print(f"p99 B/A per round: {' '.join(f'{r:.2f}' for r in tails)}; median {statistics.median(tails):.2f}")
    if collector is not None:
        print(f"collector received {collector.exports} exports")
        collector.close()


if __name__ == "__main__":
    main()
