"""A batch job survives SIGKILL: the server killed mid-job (its progress read from the job database)
and started again on the same WARMPOOL_BATCH_DIR finishes the job with every line's answer exactly
once, equal to the route's own."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
from pathlib import Path

import numpy as np

from tests.server_process import ServerProcess, wait_for

LINES = 120
TEXTS_PER_LINE = 2


def progress(batch_dir: Path) -> tuple[int, int]:
    """(lines committed, total) of the one job, read from its database as the server wrote it."""
    with sqlite3.connect(batch_dir / "batches.sqlite3") as db:
        rows = db.execute("SELECT next_line, record FROM batches").fetchall()
    return (rows[0][0], json.loads(rows[0][1])["request_counts"]["total"]) if rows else (0, 0)


def test_a_killed_server_resumes_its_job_without_loss_or_repeat(model_dir: Path, tmp_path: Path) -> None:
    batch_dir = tmp_path / "batches"
    texts = {f"id-{i}": [f"line {i} text {j} about pools" for j in range(TEXTS_PER_LINE)] for i in range(LINES)}
    data = "".join(
        json.dumps({"custom_id": cid, "method": "POST", "url": "/v1/embeddings", "body": {"input": t}}) + "\n"
        for cid, t in texts.items()
    )
    first = ServerProcess(model_dir, tmp_path / "first.log", batch_dir=batch_dir, batch_concurrency=2).wait_ready()
    try:
        upload = first.post("/v1/files", data={"purpose": "batch"}, files={"file": ("in.jsonl", data.encode())})
        assert upload.status_code == 200, upload.text
        body = {"input_file_id": upload.json()["id"], "endpoint": "/v1/embeddings", "completion_window": "24h"}
        batch_id = first.post("/v1/batches", json=body).json()["id"]
        wait_for(lambda: progress(batch_dir)[0] > 0, 60, "the job's first committed group")
    finally:
        for pid in [first.proc.pid, *first.children()]:
            os.kill(pid, signal.SIGKILL)
        first.stop()
    done, total = progress(batch_dir)
    assert 0 < done < total == LINES, "killed mid-job"

    second = ServerProcess(model_dir, tmp_path / "second.log", batch_dir=batch_dir).wait_ready()
    try:
        batch = wait_for(
            lambda: (b := second.get(f"/v1/batches/{batch_id}").json())["status"] == "completed" and b,
            60,
            "the resumed job to complete",
        )
        assert batch["request_counts"] == {"total": LINES, "completed": LINES, "failed": 0}
        output = [
            json.loads(line) for line in second.get(f"/v1/files/{batch['output_file_id']}/content").text.splitlines()
        ]
        assert [line["custom_id"] for line in output] == list(texts)  # each exactly once, in order
        everything = [t for line in texts.values() for t in line]
        direct = second.post("/v1/embeddings", json={"input": everything}).json()["data"]
        got = [item["embedding"] for line in output for item in line["response"]["body"]["data"]]
        np.testing.assert_allclose(got, [d["embedding"] for d in direct], atol=1e-6, rtol=0)
    finally:
        second.stop()
