"""An engine's torch threads: where a second thread pays for one input, with the machine to itself and
beside one busy process, under each OpenMP wait policy.

For each policy (libgomp's default, which spins at barriers, and OMP_WAIT_POLICY=PASSIVE) a fresh
process loads the model as an eager engine does (its GEMM backends chosen), runs at the engines'
niceness, and times one input of each length on 1 thread and on every usable CPU: best of --calls,
quiet, then again while a busy process (a Python loop at niceness 0, as the HTTP process tokenizing
is) holds one core. Prints milliseconds and each length's solo/one-thread ratio: above 1, the second
thread pays: why engine/runtime/threads.py takes every core only while its forwards get them. Never asserts.
Usage: .venv/bin/python -m bench.threads [--model-dir DIR] [--tokens 8,32,64,128,256,384] [--calls 7]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from bench.common import MODEL, ROOT

POLICIES = {"default": {}, "PASSIVE": {"OMP_WAIT_POLICY": "PASSIVE"}}
BUSY = "while True: pass"


def measure(model: Path, lengths: list[int], calls: int, busy: bool) -> dict[str, list[float]]:
    """In this process (a child): {"1": ms per length, "N": ms per length}."""
    import torch

    from common.cpus import usable_cpus
    from common.wire import Tokens
    from engine.precision import gemm
    from engine.runtime.model import answer
    from warmpool.inprocess import InProcessEmbedder

    os.nice(5)  # the engines' default niceness
    solo = usable_cpus()
    embedder = InProcessEmbedder(model, compile="off", threads=solo)
    gemm.select(embedder.model.model, "float32", Path.home() / ".cache" / "warmpool" / "compile")
    burner = subprocess.Popen([sys.executable, "-c", BUSY]) if busy else None
    try:
        found: dict[str, list[float]] = {"1": [], str(solo): []}
        for n in lengths:
            items = [Tokens([5 + i % 50 for i in range(n)])]
            for threads in (1, solo):
                torch.set_num_threads(threads)
                answer(embedder.model, items)
                times = []
                for _ in range(calls):
                    started = time.perf_counter()
                    answer(embedder.model, items)
                    times.append((time.perf_counter() - started) * 1000)
                found[str(threads)].append(min(times))
        return found
    finally:
        if burner is not None:
            burner.kill()
            burner.wait()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model-dir", type=Path, default=MODEL)
    parser.add_argument("--tokens", default="8,32,64,128,256,384")
    parser.add_argument("--calls", type=int, default=7)
    parser.add_argument("--child", default="", help=argparse.SUPPRESS)
    args = parser.parse_args()
    lengths = [int(n) for n in args.tokens.split(",")]
    from common.cpus import usable_cpus

    if usable_cpus() < 2:
        parser.exit(message="one usable CPU: an engine has one thread whatever the rule\n")
    if args.child:
        print(json.dumps(measure(args.model_dir, lengths, args.calls, args.child == "busy")))
        return
    print(f"{args.model_dir.name}: ms for one input of each length; ratio = 1 thread / every CPU (>1: it pays)")
    for policy, env in POLICIES.items():
        for state in ("quiet", "busy"):
            command = [sys.executable, "-m", "bench.threads", "--child", state, "--model-dir", str(args.model_dir)]
            command += ["--tokens", args.tokens, "--calls", str(args.calls)]
            environ = {**os.environ, **env, "HF_HUB_OFFLINE": "1"}
            out = subprocess.run(command, cwd=ROOT, env=environ, check=True, capture_output=True, text=True)
            found = json.loads(out.stdout.strip().splitlines()[-1])
            one, many = found.pop("1"), next(iter(found.values()))
            cells = ", ".join(f"{n}: {a:.1f}/{b:.1f} ({a / b:.2f})" for n, a, b in zip(lengths, one, many, strict=True))
            print(f"{policy:8} {state:5} tokens: 1t/{next(iter(found))}t ms (ratio) {cells}", flush=True)


if __name__ == "__main__":
    main()
