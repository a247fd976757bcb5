"""How big models start: warmpool serving random-weight checkpoints of ~0.1 GB (the embedded default
model), ~1.3 GB (BERT-large-shaped, float32, one file) and ~4 GB (a wider, deeper BERT in bfloat16,
in ~1000 MB shards), from local disk and from a FUSE mount read-limited like a network volume
(bench/slowfs.py), cold and warm, prefetch on and off, with 2 engines: seconds from launch to live,
ready and the first embedding, and the bytes read through the volume. Once per model and place, the
naive sequential server's first embedding (cold); once per model, on a warm start, the memory of all
the server's processes against the weight bytes and the seconds to replace an engine killed with -9.

Cold: the model's files are evicted from the page cache before launch, on the FUSE mount and on the
folder behind it both (the Python environment's files are not); warm: they are read once first.
The checkpoints are built in a temporary folder (never committed), removed at the end. Prints
medians of --runs; never asserts. The FUSE part needs Debian's fuse3 and PyPI's mfusepy.
Usage: .venv/bin/python -m bench.bigmodel [--sizes 0.1 1.3 4] [--where fuse local] [--runs 1]
         [--volume-mb-s 200] [--skip-naive] [--dtype auto]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import statistics
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.coldstart import evict, kill_recovery, median, run_naive, slow_volume, timeline
from bench.common import MODEL, sentences
from bench.pagecache import resident
from bench.sharedweights import LARGE, build, read_all
from common.procmem import process_memory
from tests.server_process import ServerProcess

SIZES = ("0.1", "1.3", "4")
WHERE = ("fuse", "local")
ENGINES = 2
# 1.98e9 parameters: 3.96 GB in bfloat16
HUGE = {
    "hidden_size": 2048,
    "num_hidden_layers": 38,
    "num_attention_heads": 16,
    "intermediate_size": 8192,
    "max_position_embeddings": 512,
    "vocab_size": 30522,
}


@dataclass
class Run:
    marks: dict[str, float]  # seconds from launch: live, ready, embedding
    through: int  # bytes read through the FUSE mount from launch to the first embedding
    cached: float  # fraction of the served folder in the page cache at launch
    prefetch_mb_s: float | None  # the prefetch's own read rate, as its start-up phase reports it


def make_model(size: str, volume: Path) -> Path:
    """The checkpoint of `size` GB, built into `volume` (the embedded model copied there for 0.1)."""
    if size == "0.1":
        return Path(shutil.copytree(MODEL, volume / MODEL.name))
    if size == "1.3":
        return build(volume / "bert-large-float32", "float32", 0, LARGE)
    return build(volume / "bert-2b-bfloat16-sharded", "bfloat16", 1000, HUGE)


def weight_bytes(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.glob("*.safetensors"))


def volume_pid(mountpoint: Path) -> int | None:
    """The FUSE server behind `mountpoint`: a child of this process (coldstart.slow_volume starts it)."""
    for task in Path(f"/proc/{os.getpid()}/task").iterdir():
        with contextlib.suppress(OSError):
            for pid in (task / "children").read_text().split():
                with contextlib.suppress(OSError):
                    argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
                    if b"bench.slowfs" in argv and str(mountpoint).encode() in argv:
                        return int(pid)
    return None


def bytes_through(pid: int | None) -> int:
    """What the FUSE server has read from the folder behind the mount so far (its rchar)."""
    if pid is None:
        return 0
    text = Path(f"/proc/{pid}/io").read_text()
    return next(int(line.split()[1]) for line in text.splitlines() if line.startswith("rchar:"))


def prepare(cold: bool, served: Path, behind: list[Path]) -> float:
    """Cold: evict the served folder and the folders behind it; warm: read it once. Returns the
    fraction of the served folder then in the page cache."""
    if cold:
        for folder in (served, *behind):
            evict(folder)
    else:
        read_all(served)
    have, total = resident([served])
    return have / total if total else 0.0


def start(folder: Path, log: Path, **settings: Any) -> tuple[dict[str, float], ServerProcess]:
    """coldstart.run_warmpool without its eviction (prepare() does it), stopping a server that fails
    to start (run_warmpool leaves it running)."""
    server = ServerProcess(folder, log, log_level="warning", **settings)
    try:
        return timeline(server.url, server.started, "/health/live", "/health/ready", server.proc), server
    except BaseException:
        server.stop()
        print(server.logs(), file=sys.stderr)
        raise


def memory(server: ServerProcess) -> tuple[float, float, int]:
    """RSS and PSS (MB) of all the server's processes together once every engine has served requests
    (and so touched its weights), and how many processes."""
    engines = server.wait_engines(600)["engines"]
    texts = sentences(8, seed=1)
    with ThreadPoolExecutor(2 * engines) as pool:
        for _ in range(3):
            codes = set(
                pool.map(lambda _: server.post("/v1/embeddings", json={"input": texts}).status_code, range(2 * engines))
            )
            if codes != {200}:
                print(f"    (requests before the memory reading answered {sorted(codes)})")
    found = [m for m in map(process_memory, [server.proc.pid, *server.children()]) if m]
    return sum(m["rss_mb"] for m in found), sum(m["pss_mb"] for m in found), len(found)


def row(label: str, runs: list[Run], fuse: bool, volume_mb_s: float) -> str:
    live, ready, first = (median([r.marks for r in runs], key) for key in ("live", "ready", "embedding"))
    cached = statistics.median(r.cached for r in runs)
    text = f"{label}: live {live:6.2f} s, ready {ready:6.2f} s, first embedding {first:6.2f} s"
    text += f" ({cached:4.0%} cached at launch)"
    if fuse:
        through = statistics.median(r.through for r in runs) / 1e6
        text += f"; {through:6.0f} MB through the volume, {through / ready:5.0f} MB/s until ready"
        text += f" (cap {volume_mb_s:.0f})"
    rates = [r.prefetch_mb_s for r in runs if r.prefetch_mb_s is not None]
    if rates:
        text += f"; prefetch read {statistics.median(rates):.0f} MB/s"
    return text


def bench_model(size: str, source: Path, mount: Path, pid: int | None, tmp: Path, args: argparse.Namespace) -> None:
    weights, files = weight_bytes(source), len(list(source.glob("*.safetensors")))
    floor = weights / (args.volume_mb_s * 1e6)
    print(
        f"{size} GB: {source.name}, {weights / 1e9:.2f} GB of weights in {files} file(s); at "
        f"{args.volume_mb_s:.0f} MB/s they take {floor:.2f} s (bytes/bandwidth)",
        flush=True,
    )
    memory_where = "local" if "local" in args.where else args.where[0]
    held: tuple[float, float, int, float] | None = None  # RSS, PSS, processes, recovery seconds
    for where in args.where:
        fuse = where == "fuse"
        served, behind = (mount / source.name, [source]) if fuse else (source, [])
        cold_first: float | None = None
        for cold in (True, False):
            cache = "cold" if cold else "warm"
            first: dict[str, float] = {}
            ready: dict[str, float] = {}
            runs: dict[str, list[Run]] = {"on": [], "off": []}
            for i in range(args.runs):  # on and off alternate, so the machine's drift falls on both
                for prefetch in ("on", "off") if i % 2 == 0 else ("off", "on"):
                    cached = prepare(cold, served, behind)
                    before = bytes_through(pid) if fuse else 0
                    settings = {"prefetch": prefetch, "engines": ENGINES, "dtype": args.dtype}
                    marks, server = start(served, tmp / "server.log", **settings)
                    try:
                        rate = server.phase("prefetch")["detail"].get("mb_per_s")
                        runs[prefetch].append(Run(marks, bytes_through(pid) - before if fuse else 0, cached, rate))
                        if where == memory_where and not cold and prefetch == "on" and i == 0:
                            held = (*memory(server), kill_recovery(server))
                    finally:
                        server.stop()
            for prefetch, done in runs.items():
                label = f"  {size:>3} GB {where:5} {cache} prefetch {prefetch:3}"
                line = row(label, done, fuse, args.volume_mb_s)
                if fuse and cold:
                    line += f"; ready / (bytes/bandwidth) {median([r.marks for r in done], 'ready') / floor:.2f}"
                print(line, flush=True)
                first[prefetch] = median([r.marks for r in done], "embedding")
                ready[prefetch] = median([r.marks for r in done], "ready")
            print(
                f"  {size:>3} GB {where:5} {cache} prefetch on/off: ready {ready['on'] / ready['off']:.2f}, "
                f"first embedding {first['on'] / first['off']:.2f}",
                flush=True,
            )
            if cold:
                cold_first = first["on"]
        if not args.skip_naive and cold_first is not None:
            for folder in behind:
                evict(folder)
            naive = run_naive(served, tmp / "naive.log")["embedding"]  # evicts `served` itself
            print(
                f"  {size:>3} GB {where:5} cold naive server: first embedding {naive:6.2f} s; "
                f"warmpool (prefetch on)/naive {cold_first / naive:.2f}",
                flush=True,
            )
        if where == memory_where and held is not None:
            rss, pss, count, recovery = held
            print(
                f"  {size:>3} GB {where:5} warm memory of all {count} processes ({ENGINES} engines): "
                f"RSS {rss:.0f} MB, PSS {pss:.0f} MB; weights {weights / 1e6:.0f} MB; "
                f"PSS/weights {pss * 1e6 / weights:.2f}",
            )
            print(f"  {size:>3} GB {where:5} warm engine kill -9 -> replaced and ready in {recovery:.2f} s", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", nargs="+", choices=SIZES, default=list(SIZES), help="models, in GB")
    parser.add_argument("--where", nargs="+", choices=WHERE, default=list(WHERE), help="served from")
    parser.add_argument("--runs", type=int, default=1, help="runs per case (medians)")
    parser.add_argument("--volume-mb-s", type=float, default=200.0, help="the FUSE volume's read limit")
    parser.add_argument("--skip-naive", action="store_true", help="skip the naive server")
    parser.add_argument("--dtype", default="auto", help="WARMPOOL_DTYPE for every model (auto: float32 on the CPU)")
    args = parser.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="warmpool-bigmodel-"))
    try:
        volume = tmp / "volume"
        volume.mkdir()
        models = {}
        for size in args.sizes:
            started = time.monotonic()
            models[size] = make_model(size, volume)
            print(f"built {size} GB ({models[size].name}) in {time.monotonic() - started:.0f} s", flush=True)
        mount = tmp / "slow"
        fuse = "fuse" in args.where
        with slow_volume(volume, mount, args.volume_mb_s) if fuse else contextlib.nullcontext():
            pid = volume_pid(mount) if fuse else None
            print(
                f"{ENGINES} engines; seconds from launch; medians of {args.runs} run(s); "
                f"FUSE volume read-limited to {args.volume_mb_s:.0f} MB/s"
            )
            for size, source in models.items():
                bench_model(size, source, mount, pid, tmp, args)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
