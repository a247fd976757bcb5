"""Cold import: when the forkserver has imported torch and when the server is ready, with the
Python environment evicted from the page cache, environment prefetch on against off
(WARMPOOL_PREFETCH_ENVIRONMENT; the model's files are evicted and prefetched alike in both).

On the host (this checkout's .venv) and, with --image, in the container (its /opt/venv). Runs
alternate on/off, off/on; prints medians and the on/off ratio measured in this run; never asserts.
This machine's disk answers cold reads fast; --disk-mb-s/--disk-iops cap reads like a cloud volume
(a blkio cgroup on the host, docker's --device-read-* in the container; both need root).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sysconfig
import tempfile
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from bench.common import MODEL, ROOT
from bench.pagecache import evict, resident
from orchestrator.envfiles import environment_files, packages_for
from orchestrator.forkserver import ENGINE
from tests.server_process import ServerProcess, wait_for

IMAGE_ENVIRONMENT = ["/opt/venv", "/opt/warmpool/models"]
Marks = dict[str, float]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("cold import (environment prefetch on/off)")
    group.add_argument("--image", help="also measure in this image (e.g. warmpool:latest)")
    group.add_argument("--source", type=Path, default=ROOT, help="the tree the host's servers run from")
    group.add_argument("--disk-mb-s", type=float, default=0, help="cap reads at this many MB/s (root)")
    group.add_argument("--disk-iops", type=int, default=0, help="cap reads at this many operations/s (root)")


def phase_end(startup: dict[str, Any], name: str) -> float:
    """Seconds from the server process's exec to the end of a phase (the phase table's clock)."""
    phase = next(p for p in startup["phases"] if p["name"] == name)
    return float(phase["started_s"]) + float(phase["duration_s"])


def _read(group: dict[str, Any]) -> int:
    """Bytes a prefetch group read (what it found in the page cache it did not)."""
    return int(group.get("bytes_done", 0)) - int(group.get("bytes_cached", 0))


def marks_of(startup: dict[str, Any], resident_share: float) -> Marks:
    prefetch = next(p for p in startup["phases"] if p["name"] == "prefetch")["detail"]
    return {
        "forkserver": phase_end(startup, "forkserver"),
        "ready": phase_end(startup, "ready"),
        "env_mb": _read(prefetch.get("environment", {})) / 1e6,
        "resident": resident_share,
    }


def host_run(source: Path, log: Path, environment: str) -> Marks:
    """Evict the venv and the model (every engine of the previous run gone: mapped pages stay),
    start a server, wait until ready, stop it."""
    site = Path(sysconfig.get_paths()["purelib"])
    evict([site, MODEL])
    have, total = resident(environment_files(packages_for([ENGINE])))
    server = ServerProcess(MODEL, log, source, log_level="warning", prefetch_environment=environment)
    try:
        server.wait_ready()
        startup = server.startup()
        children = server.children()
    finally:
        server.stop()
    wait_for(lambda: not [pid for pid in children if Path(f"/proc/{pid}").exists()], 30, "engines gone")
    return marks_of(startup, have / max(total, 1))


def container_run(image: str, environment: str, limits: list[str]) -> Marks:
    """The same in the image: evict /opt/venv and the embedded model from inside a container (the
    page cache is the host's; as root, whom mincore answers truly), then start one and read its
    phase table."""
    pagecache = f"{ROOT / 'bench' / 'pagecache.py'}:/tmp/pagecache.py:ro"
    evicting = ["run", "--rm", "-u", "0", "-v", pagecache, "--entrypoint", "python", image, "/tmp/pagecache.py"]
    evicting.append("evict")
    evicted = _docker(*evicting, *IMAGE_ENVIRONMENT)
    have, total = (int(x) for x in evicted.split())
    env = ["-e", f"WARMPOOL_PREFETCH_ENVIRONMENT={environment}", "-e", "WARMPOOL_LOG_LEVEL=warning"]
    cid = _docker("run", "-d", "-p", "127.0.0.1::8000", *env, *limits, image)
    try:
        port = _docker("port", cid, "8000").splitlines()[0].rsplit(":", 1)[1]
        url = f"http://127.0.0.1:{port}"
        wait_for(lambda: _status(url + "/health/ready") == 200, 300, "container readiness", interval=0.05)
        with urllib.request.urlopen(url + "/health/startup", timeout=10) as response:
            startup = json.load(response)
    finally:
        _docker("rm", "-f", cid)
    return marks_of(startup, have / max(total, 1))


def _docker(*args: str) -> str:
    return subprocess.run(["docker", *args], check=True, capture_output=True, text=True).stdout.strip()


def _status(url: str) -> int:
    try:
        with urllib.request.urlopen(url, timeout=2) as response:
            return int(response.status)
    except OSError:
        return 0


def alternate(runs: int, run: Callable[[str], Marks]) -> dict[str, list[Marks]]:
    """on/off, then off/on, ...: drift in the machine's load falls on both alike."""
    results: dict[str, list[Marks]] = {"on": [], "off": []}
    for i in range(runs):
        for environment in ("on", "off") if i % 2 == 0 else ("off", "on"):
            results[environment].append(run(environment))
    return results


def report(where: str, results: dict[str, list[Marks]]) -> None:
    def med(environment: str, key: str) -> float:
        return statistics.median(m[key] for m in results[environment])

    left = max(m["resident"] for runs in results.values() for m in runs)
    print(f"  {where} (after eviction at most {left:.1%} of the environment still cached):")

    def spread(environment: str, key: str) -> str:
        values = [m[key] for m in results[environment]]
        return f"{min(values):.2f}-{max(values):.2f}"

    for key, label in (("forkserver", "forkserver preloaded"), ("ready", "ready")):
        on, off = med("on", key), med("off", key)
        print(
            f"    {label:21s} on {on:5.2f} ({spread('on', key)})  off {off:5.2f} ({spread('off', key)})  "
            f"on/off {on / off:.2f}"
        )
    print(f"    environment read by prefetch (on): {med('on', 'env_mb'):.0f} MB")


def main(args: argparse.Namespace) -> None:
    print(
        f"cold import, environment evicted, environment prefetch on vs off, median of {args.runs} runs "
        "(seconds from the server's exec):"
    )
    with tempfile.TemporaryDirectory() as tmp, throttled(args.disk_mb_s, args.disk_iops):
        logs = iter(range(1_000_000))
        results = alternate(args.runs, lambda env: host_run(args.source, Path(tmp) / f"host-{next(logs)}.log", env))
    report(f"host{_cap(args)}", results)
    if args.image:
        limits = _docker_limits(args.disk_mb_s, args.disk_iops)
        report(
            f"container {args.image}{_cap(args)}",
            alternate(args.runs, lambda env: container_run(args.image, env, limits)),
        )


def _cap(args: argparse.Namespace) -> str:
    caps = [f"{args.disk_mb_s:.0f} MB/s" if args.disk_mb_s else "", f"{args.disk_iops} IOPS" if args.disk_iops else ""]
    return f", disk reads capped at {' '.join(c for c in caps if c)}" if any(caps) else ""


def disk_of(path: Path) -> tuple[str, str]:
    """("major:minor", "/dev/name") of the whole disk holding path (throttles apply to disks)."""
    dev = os.stat(path).st_dev
    sys_dev = Path(f"/sys/dev/block/{os.major(dev)}:{os.minor(dev)}").resolve()
    if (sys_dev / "partition").exists():
        sys_dev = sys_dev.parent
    uevent = dict(line.split("=", 1) for line in (sys_dev / "uevent").read_text().split())
    return (sys_dev / "dev").read_text().strip(), f"/dev/{uevent['DEVNAME']}"


def _docker_limits(mb_s: float, iops: int) -> list[str]:
    if not (mb_s or iops):
        return []
    _, device = disk_of(Path("/var/lib/docker"))
    limits = ["--device-read-bps", f"{device}:{int(mb_s * 1e6)}"] if mb_s else []
    return limits + (["--device-read-iops", f"{device}:{iops}"] if iops else [])


@contextlib.contextmanager
def throttled(mb_s: float, iops: int) -> Iterator[None]:
    """Run the block (and the servers it starts) in a cgroup v1 blkio group capping reads from the
    disk that holds the environment; nothing when neither cap is set."""
    if not (mb_s or iops):
        yield
        return
    root = Path("/sys/fs/cgroup/blkio")
    group = root / f"warmpool-bench-{os.getpid()}"
    disk, _ = disk_of(Path(sysconfig.get_paths()["purelib"]))
    group.mkdir()
    try:
        if mb_s:
            (group / "blkio.throttle.read_bps_device").write_text(f"{disk} {int(mb_s * 1e6)}")
        if iops:
            (group / "blkio.throttle.read_iops_device").write_text(f"{disk} {iops}")
        (group / "cgroup.procs").write_text(str(os.getpid()))
        try:
            yield
        finally:
            (root / "cgroup.procs").write_text(str(os.getpid()))
    finally:
        group.rmdir()
