"""The Batch API under WARMPOOL_API_KEYS_FILE: each tenant sees its own files and jobs only, a job's
lines keep to its tenant's models and tokens per minute."""

from __future__ import annotations

import io
import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from openai import BadRequestError, NotFoundError, OpenAI

from tests.app.inprocess import InProcessServer, serving
from tests.app.test_batches import embedding_line, finished, jsonl, lines_of, submitted

TENANTS = {
    "tenants": {
        "search": {"keys": ["search-key"], "scopes": ["inference"]},
        "rag": {"keys": ["rag-key"], "scopes": ["inference"]},
        "narrow": {"keys": ["narrow-key"], "scopes": ["inference"], "models": ["another-model"]},
        "small": {"keys": ["small-key"], "scopes": ["inference"], "quota": {"tokens_per_minute": 20}},
    }
}


@pytest.fixture(scope="module")
def keyed_batches(model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[InProcessServer]:
    keys = tmp_path_factory.mktemp("secrets") / "keys.json"
    keys.write_text(json.dumps(TENANTS))
    with serving(model_dir, api_keys_file=keys, batch_dir=tmp_path_factory.mktemp("batches")) as app:
        yield app


def client_of(server: InProcessServer, key: str) -> OpenAI:
    return OpenAI(http_client=server.client, base_url=f"{server.url}/v1", api_key=key, max_retries=0)


def test_another_tenants_files_and_jobs_are_not_found(keyed_batches: InProcessServer) -> None:
    search, rag = client_of(keyed_batches, "search-key"), client_of(keyed_batches, "rag-key")
    batch = submitted(search, jsonl([embedding_line("a", "hello")]))
    with pytest.raises(NotFoundError):
        rag.files.retrieve(batch.input_file_id)
    with pytest.raises(NotFoundError):
        rag.files.content(batch.input_file_id)
    with pytest.raises(NotFoundError):
        rag.batches.retrieve(batch.id)
    with pytest.raises(NotFoundError):
        rag.batches.cancel(batch.id)
    assert batch.id not in [b.id for b in rag.batches.list()]
    assert batch.input_file_id not in [f.id for f in rag.files.list()]
    with pytest.raises(BadRequestError):  # nor run a job on it
        rag.batches.create(input_file_id=batch.input_file_id, endpoint="/v1/embeddings", completion_window="24h")
    done = finished(search, batch.id)  # its owner sees the job and its output
    assert done.status == "completed" and lines_of(search, done.output_file_id)[0]["custom_id"] == "a"
    with pytest.raises(NotFoundError):
        rag.files.content(done.output_file_id or "")


def test_a_job_may_name_only_the_tenants_models(keyed_batches: InProcessServer) -> None:
    narrow = client_of(keyed_batches, "narrow-key")
    upload = narrow.files.create(file=("in.jsonl", io.BytesIO(jsonl([embedding_line("a", "x")]))), purpose="batch")
    with pytest.raises(BadRequestError) as refused:  # the default model is not among its models
        narrow.batches.create(input_file_id=upload.id, endpoint="/v1/embeddings", completion_window="24h")
    assert refused.value.body["param"] == "input_file_id"  # type: ignore[index]


def test_a_line_over_the_tenants_minute_of_tokens_is_an_error_line_not_a_stuck_job(
    keyed_batches: InProcessServer,
) -> None:
    small = client_of(keyed_batches, "small-key")
    too_long = " ".join(["word"] * 40)  # more tokens than the tenant's whole minute (20)
    batch = finished(small, submitted(small, jsonl([embedding_line("long", too_long), embedding_line("ok", "hi")])).id)
    assert batch.status == "completed"
    assert [line["custom_id"] for line in lines_of(small, batch.output_file_id)] == ["ok"]
    (error,) = lines_of(small, batch.error_file_id)
    assert error["custom_id"] == "long" and error["response"]["status_code"] == 429
    assert error["response"]["body"]["error"]["code"] == "tokens_exceed_limit"
