"""Models on demand: a request for an unloaded model against a full start, and what unloaded models hold.

Wake-up: a server with two copies of the model, the second `resident=auto` and unloaded over the
admin API before each round; the time from posting a request naming it to its answer, with the
model's files in the page cache (warm) and evicted from it (cold), against the time from launching
a server of that model alone to its first answer, with the same page cache (one start per round).
Memory: PSS of all the server's processes with N copies of the model configured, one resident and
the rest unloaded, against the same N all resident. Prints medians and ratios; never asserts.
Usage: .venv/bin/python -m bench.ondemand [--model DIR] [--rounds 3] [--copies 3]
The BERT-large shape: python -m bench.ondemand --model "$(python -c 'from pathlib import Path;
from bench.bigmodel import make_model; print(make_model("1.3", Path("/tmp/big")))')"
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import tempfile
import time
from pathlib import Path

from bench.coldstart import evict
from bench.common import MODEL
from common.procmem import process_memory
from tests.server_process import ServerProcess, wait_for

BODY = {"input": ["The Eiffel Tower is in Paris."]}


def first_answer(model: Path, log: Path, cold: bool) -> float:
    """Seconds from launching a server of `model` alone to its first embedding."""
    if cold:
        evict(model)
    server = ServerProcess(model, log, log_level="warning")
    try:
        wait_for(lambda: server.post("/v1/embeddings", json=BODY).status_code == 200, 600, "first answer", 0.01)
        return time.monotonic() - server.started
    finally:
        server.stop()


def wake_ups(model: Path, log: Path, rounds: int, cold: bool) -> list[float]:
    """Seconds from a request for the unloaded second model to its answer, one per round."""
    copy = Path(tempfile.mkdtemp(prefix="ondemand-")) / model.name
    shutil.copytree(model, copy)
    server = ServerProcess(model, log, log_level="warning", models=f"a={model},b={copy};resident=auto").wait_ready(600)
    times = []
    try:
        for _ in range(rounds):
            unloaded = server.post("/admin/models/b/unload")
            assert unloaded.status_code == 200 and unloaded.json()["state"] == "unloaded", unloaded.text
            if cold:
                evict(copy)
            started = time.monotonic()
            answer = server.post("/v1/embeddings", json={**BODY, "model": "b"}, timeout=600)
            times.append(time.monotonic() - started)
            assert answer.status_code == 200, answer.text
    finally:
        server.stop()
        shutil.rmtree(copy.parent, ignore_errors=True)
    return times


def held_mb(model: Path, log: Path, copies: int, resident: str) -> float:
    """PSS (MB) of all the server's processes with `copies` copies of the model configured, the first
    `always` and the others `resident` (auto: unloaded at start by a budget that fits one)."""
    root = Path(tempfile.mkdtemp(prefix="ondemand-"))
    folders = [model] + [Path(shutil.copytree(model, root / f"copy{i}")) for i in range(1, copies)]
    extra = ";resident=auto" if resident == "auto" else ""
    entries = ",".join(f"m{i}={folder}{extra if i else ''}" for i, folder in enumerate(folders))
    settings = {"models": entries, **({"memory_budget": "1"} if resident == "auto" else {})}
    server = ServerProcess(model, log, log_level="warning", **settings).wait_ready(600)
    try:
        for i in range(copies if resident == "always" else 1):  # every resident engine touches its weights
            assert server.post("/v1/embeddings", json={**BODY, "model": f"m{i}"}).status_code == 200
        found = [m for m in map(process_memory, [server.proc.pid, *server.children()]) if m]
        return sum(m["pss_mb"] for m in found)
    finally:
        server.stop()
        shutil.rmtree(root, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", type=Path, default=MODEL)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--copies", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        log = Path(tmp)
        print(f"{args.model.name}: seconds, median of {args.rounds}")
        for cold in (False, True):
            cache = "cold" if cold else "warm"
            start = statistics.median(
                first_answer(args.model, log / f"start-{i}.log", cold) for i in range(args.rounds)
            )
            wake = statistics.median(wake_ups(args.model, log / f"wake-{cache}.log", args.rounds, cold))
            print(
                f"page cache {cache}: request for an unloaded model to its answer {wake:.2f} s; "
                f"a full start to its first answer {start:.2f} s ({wake / start:.2f} x)"
            )
        always = held_mb(args.model, log / "always.log", args.copies, "always")
        auto = held_mb(args.model, log / "auto.log", args.copies, "auto")
        print(
            f"{args.copies} copies configured: all resident {always:.0f} MB PSS; one resident, "
            f"{args.copies - 1} unloaded {auto:.0f} MB; a copy unloaded saves "
            f"{(always - auto) / (args.copies - 1):.0f} MB"
        )


if __name__ == "__main__":
    main()
