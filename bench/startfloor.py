"""The start against its floor: seconds to /health/ready (warm page cache, compile off) beside
`python -c "import torch"` on the same machine, for this tree and a base tree, alternating.

The forkserver's torch import is the floor a start cannot beat; what a start spends above it is its
own. Each round runs the floor, this tree's start and the base tree's (order alternating: the
machine drifts), and prints medians of ready, of ready minus the floor (the overhead), and of the
phases' start times from /health/startup (where the remainder goes). Never asserts.
Usage: .venv/bin/python -m bench.startfloor --base DIR [--rounds 5]
    (a base tree: git worktree add /tmp/base HEAD~1)
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from bench.common import MODEL, ROOT
from tests.server_process import ServerProcess

PHASES = ("bind", "forkserver", "engine", "warmup", "ready")


def floor() -> float:
    """Seconds for a fresh interpreter to import torch and exit."""
    started = time.monotonic()
    subprocess.run([sys.executable, "-c", "import torch"], check=True)
    return time.monotonic() - started


def start(source: Path, log: Path) -> dict[str, float]:
    """Seconds to ready from exec, and each phase's start and end (seconds from exec)."""
    server = ServerProcess(MODEL, log, source=source, log_level="warning")
    try:
        server.wait_ready(120)
        ready = time.monotonic() - server.started
        with urllib.request.urlopen(server.url + "/health/startup", timeout=10) as answer:
            phases = {p["name"]: p for p in json.load(answer)["phases"]}
    finally:
        server.stop()
    times = {"ready": ready}
    for name in PHASES:
        phase = phases[name]
        if phase["started_s"] is not None:
            times[f"{name}.start"] = phase["started_s"]
            times[f"{name}.end"] = phase["started_s"] + (phase["duration_s"] or 0.0)
    return times


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--base", type=Path, required=True, help="the tree to compare with")
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    trees = {"this": ROOT, "base": args.base.resolve()}
    floors: list[float] = []
    runs: dict[str, list[dict[str, float]]] = {name: [] for name in trees}
    with tempfile.TemporaryDirectory() as tmp:
        start(ROOT, Path(tmp) / "warm.log")  # the page cache and the model's files warm for both
        for round_ in range(args.rounds):
            floors.append(floor())
            for name in ("this", "base") if round_ % 2 == 0 else ("base", "this"):
                runs[name].append(start(trees[name], Path(tmp) / f"{name}.log"))
    base_floor = statistics.median(floors)
    print(f"import torch: median {base_floor:.2f} s over {len(floors)} (min {min(floors):.2f}, max {max(floors):.2f})")
    for name, results in runs.items():
        ready = [r["ready"] for r in results]
        over = [r["ready"] - f for r, f in zip(results, floors, strict=True)]
        print(
            f"{name}: ready median {statistics.median(ready):.2f} s (min {min(ready):.2f}, max {max(ready):.2f}), "
            f"over import torch {statistics.median(over):+.2f} s (paired, same round), "
            f"ready/floor {statistics.median(ready) / base_floor:.2f}"
        )
        keys = [k for k in results[0] if k != "ready" and all(k in r for r in results)]
        print("   " + "  ".join(f"{k} {statistics.median(r[k] for r in results):.2f}" for k in keys))
    ratio = [t["ready"] / b["ready"] for t, b in zip(runs["this"], runs["base"], strict=True)]
    spread = f"min {min(ratio):.2f}, max {max(ratio):.2f}"
    print(f"this/base ready, paired by round: median {statistics.median(ratio):.2f} ({spread})")


if __name__ == "__main__":
    main()
