"""The Batch API's bounds on memory and disk: an upload streamed to the folder (never held whole), the
folder's bound (WARMPOOL_BATCH_MAX_BYTES) refusing an upload and failing a job whose output would pass
it, a disk that fills failing its job while the server and the other jobs go on."""

from __future__ import annotations

import asyncio
import errno
import io
import os
import tracemalloc
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from openai import APIStatusError, OpenAI

from server.batches.store import BatchStore
from tests.app.inprocess import InProcessServer, serving
from tests.app.test_batches import embedding_line, finished, jsonl, submitted

UPLOAD_BYTES = 8 * 1024 * 1024
CHUNK = 64 * 1024  # what a socket read hands the app
BOUNDARY = b"warmpoolTestBoundary"


@pytest.fixture(scope="module")
def bounded_server(model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[InProcessServer]:
    folder = tmp_path_factory.mktemp("bounded-batches")
    with serving(model_dir, batch_dir=folder, batch_concurrency=2, batch_max_file_bytes=2 * UPLOAD_BYTES) as app:
        yield app


@pytest.fixture
def client(bounded_server: InProcessServer) -> OpenAI:
    return OpenAI(
        http_client=bounded_server.client, base_url=f"{bounded_server.url}/v1", api_key="unused", max_retries=0
    )


@pytest.fixture
def store(bounded_server: InProcessServer) -> Iterator[BatchStore]:
    """The server's store; a test that lowers its folder's bound has it restored after."""
    assert bounded_server.services.batches is not None
    store = bounded_server.services.batches.store
    limit = store.space.limit
    yield store
    store.space.limit = limit


def form_body(data: bytes) -> bytes:
    """A multipart/form-data body of purpose=batch and `data` as the file."""
    head = (
        b"--"
        + BOUNDARY
        + b'\r\nContent-Disposition: form-data; name="purpose"\r\n\r\nbatch\r\n--'
        + BOUNDARY
        + b'\r\nContent-Disposition: form-data; name="file"; filename="in.jsonl"\r\n\r\n'
    )
    return b"".join((head, data, b"\r\n--", BOUNDARY, b"--\r\n"))


def chunked_upload(server: InProcessServer, form: bytes) -> int:
    """POST /v1/files straight to the app, its body in CHUNK-sized messages as a socket hands them; the status."""
    body = memoryview(form)
    headers = [(b"host", b"testserver"), (b"content-type", b"multipart/form-data; boundary=" + BOUNDARY)]
    scope = {
        "type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST", "scheme": "http",
        "path": "/v1/files", "raw_path": b"/v1/files", "query_string": b"", "root_path": "", "headers": headers,
        "client": ("127.0.0.1", 1), "server": ("testserver", 80), "state": {},
    }  # fmt: skip
    offsets = iter(range(0, len(body), CHUNK))
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        start = next(offsets, None)
        if start is None:
            await asyncio.Event().wait()  # the body has all been read: only a disconnect could come
        assert start is not None
        return {
            "type": "http.request",
            "body": bytes(body[start : start + CHUNK]),
            "more_body": start + CHUNK < len(body),
        }

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    async def post() -> None:
        await server.client.app(scope, receive, send)

    assert server.client.portal is not None
    server.client.portal.call(post)
    status: int = sent[0]["status"]
    return status


def test_an_upload_is_written_as_it_arrives_never_held_whole(bounded_server: InProcessServer) -> None:
    data = (b'{"custom_id": "m", "method": "POST", "url": "/v1/embeddings", "body": {"input": "x"}}\n' * 100_000)[
        :UPLOAD_BYTES
    ]
    form = form_body(data)
    chunked_upload(bounded_server, form_body(b"warm"))  # the route's first call: its imports are not the upload's
    tracemalloc.start()
    try:
        baseline = tracemalloc.get_traced_memory()[0]
        assert chunked_upload(bounded_server, form) == 200
        peak = tracemalloc.get_traced_memory()[1] - baseline
    finally:
        tracemalloc.stop()
    assert peak < UPLOAD_BYTES / 8, f"the upload took {peak} bytes of memory at its peak"


def test_an_upload_past_the_folders_bound_is_a_413_and_leaves_nothing(client: OpenAI, store: BatchStore) -> None:
    used = store.used_bytes()
    store.space.limit = used + 1000
    with pytest.raises(APIStatusError) as refused:
        client.files.create(file=("big.jsonl", io.BytesIO(b"x" * 2000)), purpose="batch")
    assert refused.value.status_code == 413 and refused.value.code == "batch_storage_full"
    assert store.used_bytes() == used and not list((store.root / "files").glob("*.partial"))


def test_a_job_whose_output_would_pass_the_folders_bound_fails_naming_it(client: OpenAI, store: BatchStore) -> None:
    upload = client.files.create(file=("in.jsonl", io.BytesIO(jsonl([embedding_line("a", "x")]))), purpose="batch")
    store.space.limit = store.used_bytes() + 100  # less than one embedding's output line
    batch = client.batches.create(input_file_id=upload.id, endpoint="/v1/embeddings", completion_window="24h")
    batch = finished(client, batch.id)
    assert batch.status == "failed" and batch.errors is not None and batch.errors.data
    assert batch.errors.data[0].code == "batch_storage_full"
    assert "WARMPOOL_BATCH_MAX_BYTES" in (batch.errors.data[0].message or "")


def test_a_full_disk_fails_its_job_and_the_next_job_runs(
    client: OpenAI, store: BatchStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    append = store.append

    def disk_full_for_full_lines(batch_id: str, *args: Any, **kwargs: Any) -> None:
        if b'"custom_id":"full-' in args[1]:  # the group's output lines
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        append(batch_id, *args, **kwargs)

    monkeypatch.setattr(store, "append", disk_full_for_full_lines)
    full = submitted(client, jsonl([embedding_line("full-1", "x")]))
    after = submitted(client, jsonl([embedding_line("next-1", "y")]))
    full, after = finished(client, full.id), finished(client, after.id)
    assert full.status == "failed" and full.errors is not None and full.errors.data
    assert "No space left on device" in (full.errors.data[0].message or "")
    assert after.status == "completed"
    assert client.embeddings.create(input="still serving", model="all-MiniLM-L6-v2").data
