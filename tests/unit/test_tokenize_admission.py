"""/tokenize and /detokenize are admitted like every other route: a full server says 429."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from server.core.services import Services
from server.http.app import create_app, with_middleware
from tests.unit.served import served


@pytest.fixture
def svc(model_dir: Path) -> Iterator[Services]:
    """Services serving the embedded model's tokenizer, every phase done, with 4 admission permits."""
    with served(model_dir, permits=4, threads=2) as services:
        yield services


@pytest.mark.parametrize(("route", "body"), [("/tokenize", {"prompt": "hello"}), ("/detokenize", {"tokens": [7592]})])
def test_tokenizer_routes_take_a_permit(svc: Services, route: str, body: dict[str, object]) -> None:
    """With every permit held, the tokenizer routes answer 429 with Retry-After; once they are free, 200."""
    with TestClient(with_middleware(create_app(svc))) as http:
        held = svc.admission.try_acquire(4)
        refused = http.post(route, json=body)
        assert refused.status_code == 429 and refused.headers["retry-after"] == "1"
        assert refused.json()["error"]["code"] == "overloaded"
        svc.admission.release(held or 0)
        assert http.post(route, json=body).status_code == 200
        assert svc.admission.used == 0


def test_a_tei_tokenize_text_longer_than_the_model_takes_is_refused(svc: Services) -> None:
    """TEI's /tokenize refuses, naming it, a text of more tokens than the model's maximum (256 here)
    before answering any token: 240 such texts in one body no longer become ~500,000 answered tokens."""
    long, short = "hello " * 300, "hello world"
    with TestClient(with_middleware(create_app(svc))) as http:
        refused = http.post("/tokenize", json={"inputs": [short, long]})
        served = http.post("/tokenize", json={"inputs": [short, "hello " * 250]})
    assert refused.status_code == 400
    assert refused.json() == {
        "error": "inputs[1] has 302 tokens, more than the model's maximum of 256",
        "error_type": "validation",
    }
    assert served.status_code == 200 and len(served.json()[1]) == 252


def test_a_tei_tokenize_answer_past_the_response_budget_is_refused(svc: Services) -> None:
    """TEI's /tokenize whose spans would take more than WARMPOOL_MAX_RESPONSE_BYTES is a 400 naming
    the setting, before any span is built; one within it is served."""
    svc.settings = svc.settings.model_copy(update={"max_response_bytes": 20_000})
    with TestClient(with_middleware(create_app(svc))) as http:
        refused = http.post("/tokenize", json={"inputs": ["hello " * 250] * 4})  # 4 x 252 spans
        served = http.post("/tokenize", json={"inputs": ["hello world"] * 4})
    assert refused.status_code == 400
    assert "WARMPOOL_MAX_RESPONSE_BYTES" in refused.json()["error"], refused.json()
    assert served.status_code == 200 and len(served.json()) == 4
