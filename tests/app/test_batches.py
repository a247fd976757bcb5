"""OpenAI's Batch API through the `openai` client's own calls: files up, a job run through the routes'
own code, the answers as /v1/embeddings gives them; malformed lines as error lines; cancel; a folder
that cannot be written fails the job, not the server."""

from __future__ import annotations

import io
import json
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from openai import APIStatusError, BadRequestError, OpenAI
from openai.types import Batch, FileObject

from tests.app.inprocess import InProcessServer, serving
from tests.server_process import wait_for

DONE_TIMEOUT_S = 60.0
FILE_LIMIT = 4 * 1024 * 1024  # above WARMPOOL_MAX_BODY_BYTES' default (2 MiB)
FINISHED = ("completed", "failed", "cancelled", "expired")


@pytest.fixture(scope="module")
def batch_server(model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[InProcessServer]:
    folder = tmp_path_factory.mktemp("batches")
    with serving(model_dir, batch_dir=folder, batch_concurrency=2, batch_max_file_bytes=FILE_LIMIT) as app:
        yield app


@pytest.fixture
def client(batch_server: InProcessServer) -> OpenAI:
    return OpenAI(http_client=batch_server.client, base_url=f"{batch_server.url}/v1", api_key="unused", max_retries=0)


def jsonl(lines: list[Any]) -> bytes:
    return b"".join((line if isinstance(line, bytes) else json.dumps(line).encode()) + b"\n" for line in lines)


def embedding_line(custom_id: str, texts: list[str] | str) -> dict[str, Any]:
    return {"custom_id": custom_id, "method": "POST", "url": "/v1/embeddings", "body": {"input": texts}}


def submitted(client: OpenAI, data: bytes, endpoint: str = "/v1/embeddings") -> Batch:
    upload = client.files.create(file=("input.jsonl", io.BytesIO(data)), purpose="batch")
    return client.batches.create(input_file_id=upload.id, endpoint=endpoint, completion_window="24h")  # type: ignore[arg-type]


def finished(client: OpenAI, batch_id: str) -> Batch:
    def done() -> Batch | None:
        batch = client.batches.retrieve(batch_id)
        return batch if batch.status in FINISHED else None

    result: Batch = wait_for(done, DONE_TIMEOUT_S, f"batch {batch_id} to finish")
    return result


def lines_of(client: OpenAI, file_id: str | None) -> list[dict[str, Any]]:
    assert file_id is not None
    return [json.loads(line) for line in client.files.content(file_id).text.splitlines()]


def test_batch_answers_equal_the_embeddings_route(client: OpenAI) -> None:
    inputs = {f"line-{i}": [f"sentence {i} about warm pools", f"another {i}"] for i in range(7)}
    batch = submitted(client, jsonl([embedding_line(cid, texts) for cid, texts in inputs.items()]))
    assert batch.status == "validating"
    batch = finished(client, batch.id)
    assert batch.status == "completed"
    assert batch.request_counts is not None
    assert (batch.request_counts.total, batch.request_counts.completed, batch.request_counts.failed) == (7, 7, 0)
    assert batch.error_file_id is None and batch.in_progress_at and batch.completed_at
    raw = client.batches.with_raw_response.retrieve(batch.id).http_response.json()
    Batch.model_validate(raw, strict=True)  # every field as the client's type declares it
    assert batch.output_file_id is not None
    FileObject.model_validate(client.files.with_raw_response.retrieve(batch.output_file_id).http_response.json())
    output = lines_of(client, batch.output_file_id)
    assert [line["custom_id"] for line in output] == list(inputs)
    for line in output:
        assert line["error"] is None and line["response"]["status_code"] == 200
        direct = client.embeddings.create(input=inputs[line["custom_id"]], model="all-MiniLM-L6-v2")
        got = [item["embedding"] for item in line["response"]["body"]["data"]]
        np.testing.assert_allclose(got, [d.embedding for d in direct.data], atol=1e-6, rtol=0)


def test_usage_is_the_routes_usage_summed_over_answered_lines_and_model_is_named(client: OpenAI) -> None:
    inputs = {"one": "a short text", "two": ["two texts", "of a few more words than the first"], "three": "x " * 40}
    refused = {"custom_id": "refused", "method": "POST", "url": "/v1/embeddings", "body": {"input": []}}
    batch = finished(client, submitted(client, jsonl([*(embedding_line(k, v) for k, v in inputs.items()), refused])).id)
    direct = [client.embeddings.create(input=texts, model="all-MiniLM-L6-v2").usage for texts in inputs.values()]
    tokens = sum(u.prompt_tokens for u in direct)
    assert batch.status == "completed" and batch.usage is not None and batch.model == "all-MiniLM-L6-v2"
    assert (batch.usage.input_tokens, batch.usage.output_tokens, batch.usage.total_tokens) == (tokens, 0, tokens)


def test_malformed_lines_are_error_lines(client: OpenAI) -> None:
    lines = [
        embedding_line("good", "hello"),
        b"{not json",
        {"method": "POST", "url": "/v1/embeddings", "body": {"input": "no id"}},
        embedding_line("good", "a second 'good'"),
        {**embedding_line("wrong-url", "x"), "url": "/v1/chat/completions"},
        {**embedding_line("wrong-method", "x"), "method": "GET"},
        {
            "custom_id": "raw",
            "method": "POST",
            "url": "/v1/embeddings",
            "body": {"input": "x", "encoding_format": "bytes"},
        },
        {"custom_id": "refused", "method": "POST", "url": "/v1/embeddings", "body": {"input": []}},
    ]
    batch = finished(client, submitted(client, jsonl(lines)).id)
    assert batch.status == "completed"
    assert batch.request_counts is not None
    assert (batch.request_counts.completed, batch.request_counts.failed) == (1, 7)
    assert [line["custom_id"] for line in lines_of(client, batch.output_file_id)] == ["good"]
    errors = lines_of(client, batch.error_file_id)
    assert [(line["custom_id"], line["error"] and line["error"]["code"]) for line in errors] == [
        (None, "invalid_json"),
        (None, "missing_custom_id"),
        ("good", "duplicate_custom_id"),
        ("wrong-url", "invalid_url"),
        ("wrong-method", "invalid_method"),
        ("raw", None),  # a raw-bytes body cannot be a JSONL line
        ("refused", None),
    ]
    assert errors[-2]["response"]["body"]["error"]["param"] == "encoding_format"
    refused = errors[-1]["response"]
    assert refused["status_code"] == 400 and refused["body"]["error"]["type"] == "invalid_request_error"


@pytest.mark.parametrize(
    ("data", "endpoint", "param"),
    [
        (b"\x00\x01 not lines of JSON", "/v1/embeddings", "input_file_id"),
        (jsonl([embedding_line("a", "x")]), "/v1/chat/completions", "endpoint"),
        (
            jsonl([{**embedding_line("a", "x"), "body": {"input": "x", "model": "nope"}}]),
            "/v1/embeddings",
            "input_file_id",
        ),
        (jsonl([{**embedding_line("a", "x"), "url": "/classify"}]), "/classify", "endpoint"),
    ],
    ids=["not-jsonl", "unserved-endpoint", "unserved-model", "endpoint-not-of-this-model"],
)
def test_unservable_input_is_a_400_at_creation(client: OpenAI, data: bytes, endpoint: str, param: str) -> None:
    with pytest.raises(BadRequestError) as refused:
        submitted(client, data, endpoint)
    assert refused.value.body["param"] == param  # type: ignore[index]


def started(client: OpenAI, batch_id: str) -> bool:
    """Whether the job has answered its first group."""
    counts = client.batches.retrieve(batch_id).request_counts
    return counts is not None and counts.completed > 0


def test_cancel_stops_a_running_job(client: OpenAI) -> None:
    lines = [embedding_line(f"c{i}", [f"text {i} {j}" for j in range(16)]) for i in range(120)]
    batch = submitted(client, jsonl(lines))

    wait_for(lambda: started(client, batch.id), DONE_TIMEOUT_S, "the job's first group")
    assert client.batches.cancel(batch.id).status == "cancelling"
    batch = finished(client, batch.id)
    assert batch.status == "cancelled" and batch.cancelled_at
    assert batch.request_counts is not None
    done = lines_of(client, batch.output_file_id)
    assert 0 < len(done) == batch.request_counts.completed < 120
    assert [line["custom_id"] for line in done] == [f"c{i}" for i in range(len(done))]


def test_a_stopped_runner_resumes_its_job_at_the_next_start(client: OpenAI, batch_server: InProcessServer) -> None:
    """What the drain does (LifecycleServer.drain stops the runner, boot starts it): the group in
    flight is dropped and run again, no line lost or answered twice."""
    runner = batch_server.services.batches
    assert runner is not None and batch_server.client.portal is not None
    lines = [embedding_line(f"s{i}", [f"text {i} {j}" for j in range(4)]) for i in range(30)]
    batch = submitted(client, jsonl(lines))

    wait_for(lambda: started(client, batch.id), DONE_TIMEOUT_S, "the job's first group")
    batch_server.client.portal.call(runner.stop)
    stopped = client.batches.retrieve(batch.id)
    assert stopped.status == "in_progress" and stopped.request_counts is not None
    assert stopped.request_counts.completed < 30
    batch_server.client.portal.call(runner.start)
    batch = finished(client, batch.id)
    assert batch.status == "completed"
    assert [line["custom_id"] for line in lines_of(client, batch.output_file_id)] == [f"s{i}" for i in range(30)]


def test_unwritable_folder_fails_the_job_not_the_server(client: OpenAI, batch_server: InProcessServer) -> None:
    assert batch_server.services.batches is not None
    outputs = batch_server.services.batches.store.root / "outputs"
    shutil.rmtree(outputs, ignore_errors=True)
    outputs.write_bytes(b"")  # no folder can be made there: every output write fails
    try:
        batch = finished(client, submitted(client, jsonl([embedding_line("a", "x")])).id)
    finally:
        outputs.unlink()
    assert batch.status == "failed" and batch.failed_at
    assert batch.errors is not None and batch.errors.data
    assert "could not be written" in (batch.errors.data[0].message or "")
    assert client.embeddings.create(input="still serving", model="all-MiniLM-L6-v2").data


def test_lists_page_newest_first(client: OpenAI) -> None:
    ids = [submitted(client, jsonl([embedding_line("a", "x")])).id for _ in range(3)]
    first = client.batches.list(limit=2)
    assert [b.id for b in first.data] == ids[::-1][:2] and first.has_more
    rest = client.batches.list(limit=2, after=first.data[-1].id)
    assert rest.data[0].id == ids[0]
    for batch_id in ids:
        finished(client, batch_id)


def test_deleted_file_is_gone(client: OpenAI) -> None:
    upload = client.files.create(file=("in.jsonl", io.BytesIO(jsonl([embedding_line("a", "x")]))), purpose="batch")
    assert client.files.retrieve(upload.id).bytes == upload.bytes > 0
    assert upload.id in [f.id for f in client.files.list()]
    assert client.files.delete(upload.id).deleted
    assert upload.id not in [f.id for f in client.files.list()]


def test_an_upload_is_bounded_by_the_file_limit_not_the_body_limit(client: OpenAI) -> None:
    line = json.dumps(embedding_line("x", "y" * 1000)).encode() + b"\n"
    data = line * (3 * 1024 * 1024 // len(line))
    assert client.files.create(file=("big.jsonl", io.BytesIO(data)), purpose="batch").bytes == len(data)


def test_an_upload_over_the_file_limit_is_a_413(client: OpenAI) -> None:
    with pytest.raises(APIStatusError) as refused:
        client.files.create(file=("huge.jsonl", io.BytesIO(b"x" * (FILE_LIMIT + 1))), purpose="batch")
    assert refused.value.status_code == 413 and refused.value.code == "file_too_large"


def test_a_running_jobs_progress_is_on_status_startup_and_metrics(
    client: OpenAI, batch_server: InProcessServer
) -> None:
    lines = [embedding_line(f"p{i}", [f"text {i} {j}" for j in range(16)]) for i in range(120)]
    batch = submitted(client, jsonl(lines))

    wait_for(lambda: started(client, batch.id), DONE_TIMEOUT_S, "the job's first group")
    shown = batch_server.get("/status").json()["batch"]
    on_startup = batch_server.get("/health/startup").json()["batch"]
    metrics = batch_server.get("/metrics").text
    client.batches.cancel(batch.id)
    finished(client, batch.id)
    assert shown["id"] == on_startup["id"] == batch.id and shown["total"] == on_startup["total"] == 120
    assert 0 < shown["done"] < 120 and shown["lines_per_s"] > 0 and shown["eta_s"] > 0
    assert 'warmpool_batch_running_lines{count="total"} 120.0' in metrics


def test_no_progress_is_shown_once_the_job_ends(client: OpenAI, batch_server: InProcessServer) -> None:
    finished(client, submitted(client, jsonl([embedding_line("only", "one text")])).id)
    assert batch_server.get("/status").json()["batch"] is None
    assert batch_server.get("/health/startup").json()["batch"] is None
    assert 'warmpool_batch_running_lines{count="total"} 0.0' in batch_server.get("/metrics").text


def test_the_next_groups_lines_run_while_a_group_is_written(
    client: OpenAI, batch_server: InProcessServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No gap at a group's end (the engines kept fed): when a group's answers are written, lines of the
    next group have started."""
    runner = batch_server.services.batches
    assert runner is not None
    started: list[int] = []
    run_line = runner._line

    async def counted(*args: Any) -> Any:
        started.append(1)
        return await run_line(*args)

    monkeypatch.setattr(runner, "_line", counted)
    started_at_write: list[int] = []
    append = runner.store.append

    def recorded(*args: Any) -> Any:
        started_at_write.append(len(started))
        return append(*args)

    monkeypatch.setattr(runner.store, "append", recorded)
    group = runner.group_size
    lines = [embedding_line(f"line-{i}", f"text {i}") for i in range(3 * group)]
    batch = finished(client, submitted(client, jsonl(lines)).id)
    assert batch.status == "completed"
    assert len(started_at_write) == 3
    assert started_at_write[0] > group
