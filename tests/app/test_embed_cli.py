"""`warmpool embed` end to end against the real app in this process: each input format's rows
embedded as /v1/embeddings embeds them, in input order, whatever the output format."""

from __future__ import annotations

import asyncio
import base64
from pathlib import Path

import httpx
import numpy as np
import orjson
import pyarrow.parquet as pq
import pytest

from orchestrator.embed import cli
from tests.app.inprocess import InProcessServer
from tests.unit.test_embed_files import write_corpus

RECORDS = [{"id": i, "text": f"{word} sentence number {i} " * (1 + i % 3)} for i, word in enumerate("abcdefghijklm")]


class ThroughTestClient(httpx.AsyncBaseTransport):
    """The CLI's async requests sent through the app's TestClient (which runs the app on its own
    loop), each on a thread of its own, so several are in flight as over a socket."""

    def __init__(self, client: httpx.Client) -> None:
        self.client = client

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        headers = {k: v for k, v in request.headers.items() if k not in ("host", "content-length")}
        response = await asyncio.to_thread(
            self.client.request, request.method, request.url.path, content=request.content, headers=headers
        )
        return httpx.Response(response.status_code, headers=response.headers, content=response.content)


def reference(server: InProcessServer, texts: list[str]) -> np.ndarray:
    body = server.post("/v1/embeddings", json={"input": texts, "encoding_format": "base64"}).json()
    return np.stack([np.frombuffer(base64.b64decode(d["embedding"]), "<f4") for d in body["data"]])


def output_vectors(path: Path) -> tuple[list[int], np.ndarray]:
    if path.suffix == ".npy":
        vectors = np.load(path)
        return list(range(len(vectors))), vectors
    if path.suffix == ".parquet":
        table = pq.read_table(path)
        return table.column("row").to_pylist(), np.array(table.column("embedding").to_pylist())
    rows = [orjson.loads(line) for line in path.read_bytes().splitlines()]
    return [r["row"] for r in rows], np.array([r["embedding"] for r in rows])


@pytest.mark.parametrize(("source", "target"), [(".jsonl", ".parquet"), (".csv", ".jsonl"), (".parquet", ".npy")])
def test_the_output_is_what_v1_embeddings_answers(
    server: InProcessServer, tmp_path: Path, source: str, target: str
) -> None:
    out = tmp_path / f"out{target}"
    args = [str(write_corpus(tmp_path, source, RECORDS)), "-o", str(out), "--url", server.url]
    code = cli.main([*args, "--batch-size", "4", "--concurrency", "3"], transport=ThroughTestClient(server.client))
    assert code == cli.EXIT_DONE
    rows, vectors = output_vectors(out)
    assert rows == list(range(len(RECORDS)))
    np.testing.assert_allclose(vectors, reference(server, [r["text"] for r in RECORDS]), atol=1e-6)


def test_a_model_the_server_does_not_serve_is_exit_1(server: InProcessServer, tmp_path: Path) -> None:
    args = [str(write_corpus(tmp_path, ".jsonl", RECORDS)), "-o", str(tmp_path / "o.jsonl"), "--url", server.url]
    assert cli.main([*args, "--model", "no-such-model"], transport=ThroughTestClient(server.client)) == 1
