"""Cold start: warmpool against a naive sequential server, engine-kill recovery, prefetch, and the
cold import of the Python environment with its prefetch on and off (bench/coldimport.py).

Before each run the model's files are evicted from the page cache (posix_fadvise DONTNEED, no
root needed). Prints medians and ratios measured in this run; never asserts.
The prefetch part serves from a FUSE mount read-limited like a network volume (bench/slowfs.py;
needs Debian's fuse3 and PyPI's mfusepy).
Usage: .venv/bin/python -m bench.coldstart [--runs 3] [--skip-prefetch] [--volume-mb-s 200]
         [--skip-environment | --environment-only] [--image warmpool:latest] [--disk-mb-s 125 --disk-iops 3000]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx

from bench import coldimport
from bench.common import MODEL, ROOT
from tests.server_process import ServerProcess, free_port, wait_for


def evict(folder: Path) -> None:
    for path in folder.rglob("*"):
        if path.is_file():
            fd = os.open(path, os.O_RDONLY)
            try:
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)


def timeline(url: str, started: float, live_path: str, ready_path: str, proc: subprocess.Popen) -> dict:  # type: ignore[type-arg]
    """Seconds from launch to the first live answer, readiness, and the first embedding."""
    marks: dict[str, float] = {}
    with httpx.Client(base_url=url, timeout=30) as http:
        for name, attempt in (
            ("live", lambda: http.get(live_path).status_code == 200),
            ("ready", lambda: http.get(ready_path).status_code == 200),
            ("embedding", lambda: http.post("/v1/embeddings", json={"input": "first"}).status_code == 200),
        ):

            def check(attempt=attempt) -> bool:  # type: ignore[no-untyped-def]
                if proc.poll() is not None:
                    raise RuntimeError(f"server exited with {proc.returncode}")
                return bool(attempt())

            wait_for(check, 300, name, interval=0.005)
            marks[name] = time.monotonic() - started
    return marks


def run_warmpool(model: Path, log: Path, cold: bool = True, **settings: Any) -> tuple[dict, ServerProcess]:  # type: ignore[type-arg]
    if cold:
        evict(model)
    server = ServerProcess(model, log, log_level="warning", **settings)
    return timeline(server.url, server.started, "/health/live", "/health/ready", server.proc), server


def run_naive(model: Path, log: Path, device: str = "cpu") -> dict:  # type: ignore[type-arg]
    evict(model)
    port = free_port()
    with open(log, "wb") as out:
        started = time.monotonic()
        proc = subprocess.Popen(
            [sys.executable, "-m", "bench.naive_server", str(model), str(port), device],
            cwd=ROOT,
            stdout=out,
            stderr=subprocess.STDOUT,
            env={**os.environ, "HF_HUB_OFFLINE": "1"},
        )
        try:
            return timeline(f"http://127.0.0.1:{port}", started, "/health", "/health", proc)
        finally:
            proc.terminate()
            proc.wait()


def median(runs: list[dict], key: str) -> float:  # type: ignore[type-arg]
    return statistics.median(r[key] for r in runs)


def kill_recovery(server: ServerProcess) -> float:
    """Seconds from kill -9 of one engine until its replacement serves (the others serve meanwhile)."""
    detail = server.wait_engines()
    old, engines = detail["pids"][0], detail["engines"]
    started = time.monotonic()
    os.kill(old, signal.SIGKILL)

    def replaced() -> bool:
        detail = server.phase("engine")["detail"]
        return old not in detail["pids"] and detail["up"] == engines and server.get("/health/ready").status_code == 200

    wait_for(
        replaced,
        60,
        "recovery",
        interval=0.005,
    )
    return time.monotonic() - started


def big_model(folder: Path) -> Path:
    """A ~1.3 GB random-weight BERT-large-shaped encoder with the embedded model's tokenizer."""
    from transformers import BertConfig, BertModel

    from tests.tiny_models import save_with_tokenizer

    config = BertConfig(
        hidden_size=1024,
        num_hidden_layers=24,
        num_attention_heads=16,
        intermediate_size=4096,
        max_position_embeddings=512,
    )
    return save_with_tokenizer(BertModel(config), folder, MODEL)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--skip-prefetch", action="store_true", help="skip the FUSE slow-volume part")
    parser.add_argument("--volume-mb-s", type=float, default=200.0)
    parser.add_argument("--skip-environment", action="store_true", help="skip the cold-import part")
    parser.add_argument("--environment-only", action="store_true", help="only the cold-import part")
    coldimport.add_arguments(parser)
    args = parser.parse_args()
    if args.environment_only:
        coldimport.main(args)
        return
    tmp = Path(tempfile.mkdtemp())
    warm, naive, recoveries = [], [], []
    for i in range(args.runs):
        naive.append(run_naive(MODEL, tmp / f"naive{i}.log"))
        marks, server = run_warmpool(MODEL, tmp / f"warmpool{i}.log")
        warm.append(marks)
        recoveries.append(kill_recovery(server))
        server.stop()
    print(f"cold start, all-MiniLM-L6-v2, page cache evicted, median of {args.runs} runs (seconds from launch):")
    print("              live    ready   first embedding")
    for name, runs in (("warmpool", warm), ("naive", naive)):
        print(
            f"  {name:10s} {median(runs, 'live'):6.2f}  {median(runs, 'ready'):6.2f}  {median(runs, 'embedding'):8.2f}"
        )
    print(f"  first embedding warmpool/naive = {median(warm, 'embedding') / median(naive, 'embedding'):.2f}")
    recovery = statistics.median(recoveries)
    print(
        f"engine kill -9 -> ready again: median {recovery:.2f}s "
        f"({recovery / median(warm, 'ready'):.2f} x warmpool's cold ready)"
    )
    if not args.skip_prefetch:
        prefetch_on_a_slow_volume(tmp, args.volume_mb_s)
    if not args.skip_environment:
        coldimport.main(args)


def prefetch_on_a_slow_volume(tmp: Path, volume_mb_s: float) -> None:
    big = big_model(tmp / "volume" / "big-encoder")
    shutil.copytree(MODEL, tmp / "volume" / MODEL.name)
    print(f"prefetch on a volume read-limited to {volume_mb_s:.0f} MB/s (FUSE), ready in seconds from launch:")
    with slow_volume(tmp / "volume", tmp / "slow", volume_mb_s):
        for name in (MODEL.name, big.name):
            folder = tmp / "slow" / name
            size = sum(p.stat().st_size for p in folder.rglob("*") if p.is_file()) / 1e9
            ready = {}
            for prefetch in ("on", "off"):
                for cold in (True, False):
                    log = tmp / f"{name}-{prefetch}-{cold}.log"
                    marks, server = run_warmpool(folder, log, cold, prefetch=prefetch)
                    server.stop()
                    ready[(prefetch, cold)] = marks["ready"]
            print(
                f"  {name} ({size:.2f} GB): cold on {ready[('on', True)]:.2f} / off {ready[('off', True)]:.2f} "
                f"(on/off {ready[('on', True)] / ready[('off', True)]:.2f}); "
                f"warm on {ready[('on', False)]:.2f} / off {ready[('off', False)]:.2f}"
            )


@contextlib.contextmanager
def slow_volume(source: Path, mountpoint: Path, mb_per_s: float) -> Iterator[None]:
    mountpoint.mkdir()
    proc = subprocess.Popen(
        [sys.executable, "-m", "bench.slowfs", str(source), str(mountpoint), "--mb-per-s", str(mb_per_s)],
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        wait_for(lambda: os.path.ismount(mountpoint), 30, "the FUSE mount")
        yield
    finally:
        subprocess.run(["fusermount3", "-u", str(mountpoint)], check=False)
        proc.wait(timeout=30)


if __name__ == "__main__":
    main()
