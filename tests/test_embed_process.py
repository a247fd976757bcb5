"""`warmpool embed` as a process with a server of its own (no --url): the server started, waited
for and stopped whatever ends the run; a run stopped by SIGTERM resumed to each row exactly once."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import orjson

from tests.server_process import ROOT, wait_for

RUN_TIMEOUT_S = 300.0


def embed(corpus: Path, out: Path, model: Path, tmp: Path, *more: str) -> subprocess.Popen[bytes]:
    """The CLI; its temporary folder (where its server's port file lies) under `tmp`, to find that server by."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("WARMPOOL_")}
    env.update({"TMPDIR": str(tmp), "WARMPOOL_COMPILE": "off", "WARMPOOL_ENGINES": "1"})
    env["WARMPOOL_COMPILE_CACHE"] = str(tmp / "compile-cache")  # its GEMM backend's record: not the user's
    command = [sys.executable, "-m", "orchestrator", "embed", str(corpus), "-o", str(out), "--model", str(model)]
    return subprocess.Popen([*command, *more], cwd=ROOT, env=env, stderr=subprocess.PIPE)


def servers_under(tmp: Path) -> list[int]:
    """Live processes whose command line names `tmp` (the started server's --port-file)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and entry.name != str(os.getpid()):
            try:
                line = (entry / "cmdline").read_bytes()
            except OSError:
                continue
            if str(tmp).encode() in line and b"--port-file" in line:
                found.append(int(entry.name))
    return found


def corpus(tmp: Path, rows: int) -> Path:
    path = tmp / "corpus.jsonl"
    lines = (orjson.dumps({"id": i, "text": f"document {i} about things"}) + b"\n" for i in range(rows))
    path.write_bytes(b"".join(lines))
    return path


def test_a_server_of_its_own_is_started_and_stopped(model_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "out.jsonl"
    run = embed(corpus(tmp_path, 20), out, model_dir, tmp_path)
    _, stderr = run.communicate(timeout=RUN_TIMEOUT_S)
    assert run.returncode == 0, stderr.decode()
    assert [orjson.loads(line)["id"] for line in out.read_bytes().splitlines()] == list(range(20))
    assert servers_under(tmp_path) == []


# Rows enough that the SIGTERM, sent at the first row written, comes mid-run: one row a request, ~300
# round trips, so a test process the machine starves for a while still sends it before the end (at 8
# rows a request the run once ended first); the resume embeds the rest in several batches (1,500 rows
# took ~30 s of CPU to resume for the same checks)
ROWS = 300


def test_sigterm_mid_run_then_resume_gives_each_row_once(model_dir: Path, tmp_path: Path) -> None:
    source, out = corpus(tmp_path, ROWS), tmp_path / "out.jsonl"
    run = embed(source, out, model_dir, tmp_path, "--batch-size", "1", "--concurrency", "1")
    wait_for(lambda: out.exists() and out.stat().st_size > 0, RUN_TIMEOUT_S, "the first rows written")
    run.send_signal(signal.SIGTERM)
    run.communicate(timeout=RUN_TIMEOUT_S)
    assert run.returncode == 130
    assert servers_under(tmp_path) == []
    written = len(out.read_bytes().splitlines())
    assert 0 < written < ROWS
    resumed = embed(source, out, model_dir, tmp_path, "--resume", "--batch-size", "64")
    _, stderr = resumed.communicate(timeout=RUN_TIMEOUT_S)
    assert resumed.returncode == 0, stderr.decode()
    assert [orjson.loads(line)["row"] for line in out.read_bytes().splitlines()] == list(range(ROWS))
