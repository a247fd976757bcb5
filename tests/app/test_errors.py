"""Bad input: a 4xx in the OpenAI error shape whose message names the problem; never 422 or 500."""

from __future__ import annotations

import pytest

from tests.server_process import Served

TOO_LONG = " ".join(["word"] * 400)


def assert_openai_error(r, status: int, *words: str) -> dict:  # type: ignore[no-untyped-def,type-arg]
    assert r.status_code == status, r.text
    error = r.json()["error"]
    assert set(error) >= {"message", "type", "param", "code"}
    for word in words:
        assert word in error["message"], error["message"]
    return error


@pytest.mark.parametrize(
    ("body", "words"),
    [
        ({"input": []}, ["empty"]),
        ({"input": [[]]}, ["empty token list"]),
        ({"input": 5}, ["must be a string"]),
        ({"input": [1, "a"]}, ["must be a string"]),
        ({"input": [True]}, ["must be a string"]),
        ({"input": {"text": "x"}}, ["must be a string"]),
        ({}, ["input"]),
        ({"input": "x", "encoding_format": "int4"}, ["encoding_format"]),
        ({"input": "x", "dimensions": 0}, ["dimensions"]),
        ({"input": "x", "dimensions": 385}, ["dimensions=385", "384"]),
        ({"input": [0, 30522]}, ["30522", "vocabulary"]),
        ({"input": [-1]}, ["-1", "vocabulary"]),
        ({"input": TOO_LONG}, ["402 tokens", "256"]),
        ({"input": ["ok", TOO_LONG]}, ["input[1]", "402 tokens", "256"]),
        ({"input": "x", "truncate_prompt_tokens": 1000}, ["truncate_prompt_tokens"]),
        ({"input": ["x"] * 2049}, ["2049", "2048"]),
    ],
)
def test_bad_input_is_400(server: Served, body: dict, words: list[str]) -> None:  # type: ignore[type-arg]
    assert_openai_error(server.post("/v1/embeddings", json=body), 400, *words)


def test_malformed_json(server: Served) -> None:
    r = server.post("/v1/embeddings", content=b'{"input": ', headers={"content-type": "application/json"})
    assert_openai_error(r, 400, "malformed JSON")


def test_unknown_model_is_404(server: Served) -> None:
    error = assert_openai_error(server.post("/v1/embeddings", json={"input": "x", "model": "gpt-4"}), 404, "gpt-4")
    assert error["param"] == "model"


def test_unknown_route_is_404_in_openai_shape(server: Served) -> None:
    assert_openai_error(server.get("/v1/nope"), 404)


def test_wrong_method_on_a_pooling_route_is_405_in_openai_shape(server: Served) -> None:
    """Pooling routes skip FastAPI's router (server/http/direct.py) only for their own method."""
    assert_openai_error(server.get("/v1/embeddings"), 405)
    assert set(server.get("/openapi.json").json()["paths"]) >= {"/v1/embeddings", "/pooling", "/health/live"}


def test_empty_string_is_valid(server: Served) -> None:
    r = server.post("/v1/embeddings", json={"input": ""})
    assert r.status_code == 200
    assert r.json()["usage"]["prompt_tokens"] == 2  # [CLS] [SEP], as vLLM embeds it


def test_truncation_on_request_accepts_long_input(server: Served) -> None:
    r = server.post("/v1/embeddings", json={"input": TOO_LONG, "truncate_prompt_tokens": 10})
    assert r.status_code == 200, r.text
    assert r.json()["usage"]["prompt_tokens"] == 10
