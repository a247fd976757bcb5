"""Start → request → SIGTERM, over and over, against a real server: the hunt for one-off hangs.

Each cycle starts a server on the embedded model, waits for readiness, posts one embedding and
checks its vector, and on every `--kill-every`-th cycle first SIGKILLs an engine and waits for its
replacement to serve; then SIGTERM, and a deadline for the exit. Every stage has a deadline; an
overrun dumps the server's thread stacks (SIGUSR1 → faulthandler, into its log) and keeps that
log under `--keep`. Prints cycles run, overruns by stage, exit codes and stage timings; never asserts.
Usage: .venv/bin/python -m bench.startstop [--cycles 500] [--kill-every 5] [--keep DIR]
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import statistics
import tempfile
import time
from collections import Counter
from pathlib import Path

import numpy as np

from bench.common import MODEL
from tests.server_process import ServerProcess, wait_for

READY_S, REQUEST_S, REPLACED_S, EXIT_S = 60.0, 30.0, 60.0, 20.0


class Overrun(Exception):
    def __init__(self, stage: str) -> None:
        super().__init__(stage)
        self.stage = stage


def cycle(
    log: Path, kill: bool, expected: list[float] | None, times: dict[str, list[float]]
) -> tuple[int, list[float]]:
    """One start → (kill → replaced) → request → SIGTERM; (exit code, the vector served)."""
    started = time.monotonic()
    server = ServerProcess(MODEL, log)
    try:
        try:
            server.wait_ready(READY_S)
        except AssertionError:
            raise Overrun("ready") from None
        times["ready"].append(time.monotonic() - started)
        if kill:
            victim = server.wait_engines()["pids"][0]
            os.kill(victim, signal.SIGKILL)
            mark = time.monotonic()
            try:
                wait_for(
                    lambda: victim not in (d := server.phase("engine")["detail"])["pids"] and d["up"], REPLACED_S, ""
                )
            except AssertionError:
                raise Overrun("replace") from None
            times["replace"].append(time.monotonic() - mark)
        mark = time.monotonic()
        try:
            r = wait_for(
                lambda: (r := server.post("/v1/embeddings", json={"input": "cycle"})).status_code == 200 and r,
                REQUEST_S,
                "",
            )
        except AssertionError:
            raise Overrun("request") from None
        times["request"].append(time.monotonic() - mark)
        vector = r.json()["data"][0]["embedding"]
        if expected is not None and not np.allclose(vector, expected, atol=1e-5, rtol=0):
            raise Overrun("wrong_vector")
    finally:
        mark = time.monotonic()
        code = server.stop(timeout=EXIT_S)  # past it: stacks dumped into the log, then killed
        times["exit"].append(time.monotonic() - mark)
    if time.monotonic() - mark > EXIT_S:
        raise Overrun("exit")
    return code, vector


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--cycles", type=int, default=500)
    parser.add_argument("--kill-every", type=int, default=5, help="SIGKILL an engine on every Nth cycle (0: never)")
    parser.add_argument("--keep", type=Path, default=Path(tempfile.gettempdir()) / "warmpool-startstop")
    args = parser.parse_args()
    args.keep.mkdir(parents=True, exist_ok=True)
    times: dict[str, list[float]] = {"ready": [], "replace": [], "request": [], "exit": []}
    overruns: Counter[str] = Counter()
    codes: Counter[int] = Counter()
    expected: list[float] | None = None
    began = time.monotonic()
    with tempfile.TemporaryDirectory() as tmp:
        for n in range(args.cycles):
            log = Path(tmp) / f"cycle-{n}.log"
            try:
                code, vector = cycle(
                    log, bool(args.kill_every) and n % args.kill_every == args.kill_every - 1, expected, times
                )
                expected = expected or vector
                codes[code] += 1
            except Overrun as exc:
                overruns[exc.stage] += 1
                kept = args.keep / f"cycle-{n}-{exc.stage}.log"
                shutil.copy(log, kept)
                print(f"cycle {n}: overrun at {exc.stage}; log (with thread stacks) kept at {kept}", flush=True)
            log.unlink(missing_ok=True)
            if (n + 1) % 50 == 0:
                print(f"{n + 1} cycles, {time.monotonic() - began:.0f} s, overruns {dict(overruns)}", flush=True)
    print(
        f"cycles {args.cycles} in {time.monotonic() - began:.0f} s; exit codes {dict(codes)}; "
        f"overruns {dict(overruns) or 'none'}"
    )
    for stage, values in times.items():
        if values:
            values.sort()
            print(
                f"  {stage:8s} n={len(values):4d}  p50 {statistics.median(values):6.2f} s  "
                f"p99 {values[int(0.99 * (len(values) - 1))]:6.2f} s  max {values[-1]:6.2f} s"
            )


if __name__ == "__main__":
    main()
