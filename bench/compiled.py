"""The compiled engine against the eager one, through the server, and what compiling does to the start.

Start: to ready and to compiled with an empty cache (WARMPOOL_COMPILE=auto: ready eager, compiled
later), to ready with the cache warm (compiled before ready), and to ready eager (off), one server
at a time. Speed: an eager and a compiled server kept up at once and loaded in turn (ABBA...), at 1
and at 32 clients, as bench.paired does: per-round ratios compiled/eager. Never asserts.
Usage: .venv/bin/python -m bench.compiled [--model DIR] [--dtype float32] [--rounds 6] [--seconds 5]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.common import MODEL, run, sentences
from bench.load import Window, load, pct
from tests.server_process import ServerProcess, wait_for


def started(model: Path, log: Path, **settings: Any) -> tuple[ServerProcess, float]:
    proc = ServerProcess(model, log, log_level="warning", **settings)
    proc.wait_ready(timeout=600)
    return proc, time.monotonic() - proc.started


def compiled_after(proc: ServerProcess) -> float:
    wait_for(lambda: proc.phase("compile")["state"] in ("done", "skipped"), 1200, "the compile", interval=0.2)
    phase = proc.phase("compile")
    modes = {d["mode"] for d in phase["detail"]["engines"].values()}
    if modes != {"compiled"}:
        raise SystemExit(f"the engines did not compile: {phase}")
    return time.monotonic() - proc.started


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", type=Path, default=MODEL)
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--seconds", type=float, default=5)
    args = parser.parse_args()
    texts = sentences(2000)
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        common = {"dtype": args.dtype, "compile_cache": root / "cache"}
        proc, off_s = started(args.model, root / "off.log", compile="off", dtype=args.dtype)
        proc.stop()
        proc, cold_s = started(args.model, root / "cold.log", compile="auto", **common)
        cold_compiled_s = compiled_after(proc)
        proc.stop()
        eager, _ = started(args.model, root / "eager.log", compile="off", dtype=args.dtype)
        compiled, warm_s = started(args.model, root / "warm.log", compile="auto", **common)
        print(f"ready, eager (compile=off): {off_s:.2f} s")
        print(f"ready, empty cache (auto): {cold_s:.2f} s; every engine compiled at {cold_compiled_s:.1f} s")
        print(
            f"ready, warm cache: {warm_s:.2f} s, compiled from the first request: {compiled.phase('compile')['state']}"
        )
        try:
            for server in (eager, compiled):
                server.wait_engines()
            for clients in (1, 32):
                results: dict[str, list[Window]] = {"eager": [], "compiled": []}
                for round_ in range(args.rounds):
                    order = ("eager", "compiled") if round_ % 2 == 0 else ("compiled", "eager")
                    for name in order:
                        server = eager if name == "eager" else compiled
                        results[name].append(run(load(server.port, clients, args.seconds, texts)))
                for name, windows in results.items():
                    rate = statistics.mean(w.inputs_s for w in windows)
                    p50 = statistics.median(pct(w.latencies, 0.5) for w in windows)
                    p99 = statistics.median(pct(w.latencies, 0.99) for w in windows)
                    print(f"{clients} clients, {name}: {rate:.1f} inputs/s, p50 {p50:.1f} ms, p99 {p99:.1f} ms")
                ratios = [c.inputs_s / e.inputs_s for e, c in zip(results["eager"], results["compiled"], strict=True)]
                print(
                    f"{clients} clients, compiled/eager per round: {' '.join(f'{r:.2f}' for r in ratios)};"
                    f" mean {statistics.mean(ratios):.2f}"
                )
        finally:
            eager.stop()
            compiled.stop()


if __name__ == "__main__":
    main()
