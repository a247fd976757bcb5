"""Batch invariance: does a text's vector depend on what it is batched with, or on which engine serves it?

Against real servers on the embedded model, per configuration (precision, compile off or compiled
from a warm cache, WARMPOOL_ENGINES=1 or 2): one probe text alone (its reference), then the probe
inside `--compositions` random requests (1..50 other texts of 1..`--words` words, the probe at a random
place) sent by 16 concurrent clients; the probe's vectors are compared as raw float32 bytes
(`encoding_format: base64`). Each distinct bit pattern is then replayed alone on the idle server:
does the request alone reproduce it, which engine computed it (its CPU time, /proc/PID/stat), in how
many groups of how many rows and tokens (warmpool_batch_size / warmpool_batch_tokens deltas); and
the first `--sequential` compositions are sent again from one client (nothing to batch them with):
their distinct patterns, and how many probes differ from the 16-client pass. Then the configuration
is started again and the probe sent alone: the same bits after a restart?

"Right after ready": a fresh server with default settings (compile auto, an empty cache) is sent
`--texts` texts in requests of 50 the moment it is ready; another fresh one the same texts one at a
time; how many differ bitwise, and where each request fell against the engines' switches to the
compiled forward (/health/startup's compile detail, polled). The first server is then kept until it
has compiled, is sent the same requests again, and its cache serves the compiled cells.
Prints what was run and a table; never asserts.
Usage: .venv/bin/python -m bench.invariance [--compositions 300] [--clients 16] [--texts 1000]
       [--sequential 100] [--words 150] [--probe TEXT] [--cells f32-eager-e1,...] [--compile-wait 600]
"""

from __future__ import annotations

import argparse
import random
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.common import MODEL, cpu_ticks, run, sentences
from bench.invariance_client import (
    CompileWatch,
    batch_metrics,
    body,
    compile_summary,
    composition,
    max_diff,
    send_all,
    start,
    vectors,
)
from tests.server_process import ServerProcess, wait_for

# ~20 tokens; a probe of 11 tokens or fewer (--probe) tests float32's products of few rows, whose 2-thread
# path gave other bits than the same rows inside a larger product (now padded to 4 rows: engine/precision/rows.py)
PROBE = "the model server answers quickly while batching many small requests into one pass over weights"
CELLS: dict[str, dict[str, Any]] = {  # name -> settings (compiled cells get the warm cache)
    "f32-eager-e1": {"dtype": "float32", "compile": "off", "engines": 1},
    "f32-eager-e1-t1": {"dtype": "float32", "compile": "off", "engines": 1, "engine_threads": 1},
    "f32-eager-e2": {"dtype": "float32", "compile": "off", "engines": 2},
    "f32-compiled-e1": {"dtype": "float32", "compile": "auto", "engines": 1},
    "f32-compiled-e2": {"dtype": "float32", "compile": "auto", "engines": 2},
    "bf16-eager-e1": {"dtype": "bfloat16", "compile": "off", "engines": 1},
    "bf16-eager-e2": {"dtype": "bfloat16", "compile": "off", "engines": 2},
    "int8-eager-e1": {"dtype": "int8", "compile": "off", "engines": 1},
    "int8-eager-e2": {"dtype": "int8", "compile": "off", "engines": 2},
    "bf16-compiled-e1": {"dtype": "bfloat16", "compile": "auto", "engines": 1},
    "int8-compiled-e1": {"dtype": "int8", "compile": "auto", "engines": 1},
}
REPLAYS = 8  # distinct patterns replayed alone per cell (the most frequent ones)


@dataclass
class Cell:
    name: str
    ran: int = 0
    served: str = ""  # why not, where it was not
    patterns: Counter[bytes] = field(default_factory=Counter)
    reference: bytes = b""
    worst: float = 0.0
    engines: dict[str, Any] = field(default_factory=dict)
    replays: list[str] = field(default_factory=list)
    reproduced: int = 0
    mechanism: str = ""
    alone_ran: int = 0  # the first compositions again, from one client: no other request to batch with
    alone_patterns: int = 0
    alone_vs_busy: int = 0  # of those, probes whose bits differ from the 16-client pass's
    restarted: str = ""  # the probe alone on the same configuration started again: same bits?


def replay(server: ServerProcess, texts: list[str], at: int, pids: list[int]) -> tuple[bytes, str]:
    """The request alone on the idle server: the probe's bytes and what computed it."""
    before_ticks = [cpu_ticks(pid) for pid in pids]
    groups0, rows0, tokens0 = batch_metrics(server)
    answer = server.post("/v1/embeddings", json=body(texts))
    groups1, rows1, tokens1 = batch_metrics(server)
    ticks = [cpu_ticks(pid) - t for pid, t in zip(pids, before_ticks, strict=True)]
    slot = max(range(len(ticks)), key=ticks.__getitem__) if any(ticks) else -1
    shape = f"{groups1 - groups0:.0f} groups, {rows1 - rows0:.0f} rows, {tokens1 - tokens0:.0f} tokens"
    return vectors(answer.content)[at], f"engine {slot} (cpu ticks {ticks}), {shape}"


def run_cell(
    name: str,
    settings: dict[str, Any],
    tmp: Path,
    count: int,
    clients: int,
    seed: int,
    compile_wait: float,
    sequential: int,
    words: int,
    probe: str,
) -> Cell:
    cell = Cell(name)
    server = start(tmp / f"{name}.log", **settings)
    if isinstance(server, str):
        cell.served = server
        return cell
    try:
        server.wait_engines(120)
        if settings.get("compile") == "auto":
            # a cold cache (a precision the after-ready case did not build) compiles here first
            wait_for(
                lambda: server.phase("compile")["state"] in ("done", "skipped"), compile_wait, "compiled", interval=0.5
            )
        cell.engines = {"pids": server.phase("engine")["detail"]["pids"]}
        compile_phase = server.phase("compile")
        cell.engines["compile"] = compile_summary(compile_phase)
        cell.reference = vectors(server.post("/v1/embeddings", json=body([probe])).content)[0]
        rng = random.Random(seed)
        made = [composition(rng, words, probe) for _ in range(count)]
        sent = run(send_all(server.port, [texts for texts, _ in made], clients))
        probes = [answer.vectors[at] for answer, (_, at) in zip(sent, made, strict=True)]
        cell.ran = len(probes)
        cell.patterns = Counter(probes)
        cell.worst = max(max_diff(p, cell.reference) for p in cell.patterns)
        one = made[:sequential]
        quiet = run(send_all(server.port, [texts for texts, _ in one], 1))
        quiet_probes = [answer.vectors[at] for answer, (_, at) in zip(quiet, one, strict=True)]
        cell.alone_ran, cell.alone_patterns = len(quiet_probes), len(set(quiet_probes))
        cell.alone_vs_busy = sum(a != b for a, b in zip(quiet_probes, probes, strict=False))
        first = {p: made[probes.index(p)] for p in cell.patterns}
        pids = [int(p) for p in cell.engines["pids"] if p]
        for pattern, _ in cell.patterns.most_common(REPLAYS):
            texts, at = first[pattern]
            again, what = replay(server, texts, at, pids)
            same = again == pattern
            cell.reproduced += same
            label = "ref" if pattern == cell.reference else f"{max_diff(pattern, cell.reference):.2e}"
            cell.replays.append(
                f"pattern {label} x{cell.patterns[pattern]} (request of {len(texts)}, probe at {at}): alone "
                f"{'reproduces it' if same else 'gives ' + ('ref' if again == cell.reference else 'another')}; {what}"
            )
    finally:
        server.stop()
    cell.restarted = after_restart(name, settings, tmp, probe, cell.reference)
    cell.mechanism = suspect(cell)
    return cell


def after_restart(name: str, settings: dict[str, Any], tmp: Path, probe: str, reference: bytes) -> str:
    """The probe alone on a fresh server of the same configuration (compiled cells: the artifact the
    first one used, from its cache): the same bits as before the restart?"""
    server = start(tmp / f"{name}-restarted.log", **settings)
    if isinstance(server, str):
        return server
    try:
        server.wait_engines(120)
        again = vectors(server.post("/v1/embeddings", json=body([probe])).content)[0]
    finally:
        server.stop()
    return "same bits" if again == reference else f"{max_diff(again, reference):.2e}"


def suspect(cell: Cell) -> str:
    """A first reading from the counts; the replays printed below the table are the evidence."""
    replayed = f"replays alone reproduce {cell.reproduced}/{min(len(cell.patterns), REPLAYS)}"
    if len(cell.patterns) == 1:
        return "invariant" if cell.reference in cell.patterns else "one pattern, not the alone one"
    if cell.alone_patterns > 1:
        return f"the request's own shape (varies from one client too); {replayed}"
    return f"concurrency only (co-batched requests, threads per busy engine); {replayed}"


def after_ready(tmp: Path, total: int, wait_s: float) -> tuple[list[str], Path | None]:
    """The issue's case; returns its report lines and the compile cache, warm if the compile finished."""
    texts = sentences(total, seed=7)
    lines: list[str] = []
    batched_requests = [texts[i : i + 50] for i in range(0, total, 50)]
    cache = tmp / "cache-batched"
    server = ServerProcess(MODEL, tmp / "batched.log", log_level="warning", compile="auto", compile_cache=cache)
    try:
        server.wait_ready(300)
        ready = time.monotonic()
        watch = CompileWatch(server)
        batched = run(send_all(server.port, batched_requests, 1))
        pids = server.phase("engine")["detail"]["pids"]
        warm = None
        try:
            wait_for(lambda: server.phase("compile")["state"] in ("done", "skipped"), wait_s, "the compile", 0.5)
            again = run(send_all(server.port, batched_requests, 1))
            warm = cache if server.phase("compile")["state"] == "done" else None
        except AssertionError:
            again = []
            lines.append(f"the first server had not compiled {wait_s:g} s after ready: no compiled pass")
        watch.stop()
        detail = server.phase("compile")
    finally:
        server.stop()
    switched = watch.switched_at()
    singles_server = ServerProcess(
        MODEL, tmp / "singles.log", log_level="warning", compile="auto", compile_cache=tmp / "cache-singles"
    )
    try:
        singles_server.wait_ready(300)
        singles_ready = time.monotonic()
        singles_watch = CompileWatch(singles_server)
        singles = run(send_all(singles_server.port, [[t] for t in texts], 1))
        singles_watch.stop()
    finally:
        singles_server.stop()

    alone = [s.vectors[0] for s in singles]
    eager_batched = [v for s in batched for v in s.vectors]
    differ = [i for i in range(total) if eager_batched[i] != alone[i]]
    worst = max((max_diff(eager_batched[i], alone[i]) for i in differ), default=0.0)
    lines.append(
        f"server A (defaults: compile auto, cold cache, engines {len(pids)} pids {pids}): {total} texts in "
        f"{len(batched)} requests of 50, one client, from ready+{batched[0].start - ready:.2f} s "
        f"to +{batched[-1].end - ready:.2f} s"
    )
    lines.append(
        "  A's engines first seen compiled at "
        f"{', '.join(f'slot {s}: +{t - ready:.1f} s' for s, t in switched.items())}"
        f" after ready; compile detail {compile_summary(detail)}"
    )
    lines.append(
        f"server B (same defaults, its own cold cache): the same texts one a request, "
        f"+{singles[0].start - singles_ready:.2f} s to +{singles[-1].end - singles_ready:.2f} s after ready; "
        f"B's modes then {singles_watch.modes}"
    )
    first_switch = min(switched.values(), default=float("inf"))
    request_of = [s for s in batched for _ in s.vectors]
    when = Counter("before any switch" if request_of[i].end < first_switch else "after a switch" for i in differ)
    lines.append(
        f"A batched right after ready vs B one at a time: {len(differ)}/{total} differ bitwise, max |diff| "
        f"{worst:.2e}; differing by A's request time: {dict(when) or 'none'}"
    )
    # B's singles by B's engines' mode when answered: between the two engines' switches either may have
    b_switches = singles_watch.switched_at().values()
    b_first, b_last = min(b_switches, default=float("inf")), max(b_switches, default=float("inf"))
    b_mode = ["eager" if s.end < b_first else "compiled" if s.start >= b_last else "between" for s in singles]
    passes = {"A eager, batched (first pass)": eager_batched}
    if again:
        passes["A compiled, batched (after the switch)"] = [v for s in again for v in s.vectors]
    for name, got in passes.items():
        cells = []
        for mode in ("eager", "between", "compiled"):
            ids = [i for i in range(total) if b_mode[i] == mode]
            if ids:
                n = sum(got[i] != alone[i] for i in ids)
                top = max(max_diff(got[i], alone[i]) for i in ids)
                cells.append(f"B {mode} singles: {n}/{len(ids)} differ (max {top:.2e})")
        lines.append(f"  {name} vs " + "; ".join(cells))
    if again:
        vs_eager = sum(
            a != b for a, b in zip(passes["A compiled, batched (after the switch)"], eager_batched, strict=True)
        )
        lines.append(f"  A compiled vs A eager, same requests: {vs_eager}/{total} differ")
    return lines, warm


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--compositions", type=int, default=300)
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument("--texts", type=int, default=1000, help="texts of the right-after-ready case (0: skip it)")
    parser.add_argument("--cells", default=",".join(CELLS), help=f"of {', '.join(CELLS)}")
    parser.add_argument("--compile-wait", type=float, default=600, help="seconds the first server may take to compile")
    parser.add_argument("--sequential", type=int, default=100, help="compositions sent again from one client")
    parser.add_argument("--words", type=int, default=150, help="most words of a composition's other texts")
    parser.add_argument("--probe", default=PROBE, help="the text whose vector is compared")
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    names = [n for n in args.cells.split(",") if n]
    cpu = next(
        (
            line.split(":", 1)[1].strip()
            for line in Path("/proc/cpuinfo").read_text().splitlines()
            if line.startswith("model name")
        ),
        "?",
    )
    print(
        f"CPU: {cpu}; {args.compositions} compositions per cell (other texts of 1..{args.words} words), "
        f"{args.clients} clients, {args.sequential} again from one client; {args.texts} after-ready texts; "
        f"cells {names}; probe {args.probe!r}",
        flush=True,
    )
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        lines, warm = after_ready(tmp, args.texts, args.compile_wait) if args.texts else ([], None)
        for line in lines:
            print(line, flush=True)
        # the compile caches by precision: float32's warmed by the after-ready case, others cold (the
        # first compiled cell of a precision builds its artifact, the next one finds it)
        caches = {"float32": warm or tmp / "cache-float32"}
        cells = []
        for name in names:
            settings = dict(CELLS[name])
            if settings["compile"] == "auto":
                settings["compile_cache"] = caches.setdefault(settings["dtype"], tmp / f"cache-{settings['dtype']}")
            began = time.monotonic()
            cells.append(
                run_cell(
                    name,
                    settings,
                    tmp,
                    args.compositions,
                    args.clients,
                    args.seed,
                    args.compile_wait,
                    args.sequential,
                    args.words,
                    args.probe,
                )
            )
            print(f"{name}: {time.monotonic() - began:.0f} s", flush=True)
    base = next((c.reference for c in cells if c.reference and c.name.startswith("f32-eager-e1")), b"")
    print(
        f"\n{'configuration':<18} {'ran':>4} {'patterns':>8} {'max|diff| ref':>13} {'ref vs f32-e1':>13} "
        f"{'1-client: ran/patterns/differ':>29} {'restarted':>10}  mechanism"
    )
    for c in cells:
        if c.served:
            print(f"{c.name:<18} {'-':>4} {'-':>8} {'-':>13} {'-':>13} {'-':>29} {'-':>10}  {c.served}")
            continue
        cross = "same bits" if c.reference == base else (f"{max_diff(c.reference, base):.2e}" if base else "-")
        quiet = f"{c.alone_ran}/{c.alone_patterns}/{c.alone_vs_busy}"
        print(
            f"{c.name:<18} {c.ran:>4} {len(c.patterns):>8} {c.worst:>13.2e} {cross:>13} {quiet:>29} "
            f"{c.restarted:>10}  {c.mechanism}"
        )
    for c in cells:
        if c.replays:
            print(f"\n{c.name} (engines {c.engines}):")
            for line in c.replays:
                print(f"  {line}")


if __name__ == "__main__":
    main()
