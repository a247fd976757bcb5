"""/tokenize and /detokenize are admitted like every other route: a full server says 429."""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from common.modelfolder import read_model_folder
from common.settings import Settings
from common.startup import PHASES, StartupState
from server.core.services import ServedModel, Services
from server.http.app import create_app, with_middleware
from server.tokenizing.tokenizer import TokenizerPool


@pytest.fixture
def svc(model_dir: Path) -> Iterator[Services]:
    """Services serving the embedded model's tokenizer, every phase done, with 4 admission permits."""
    startup = StartupState()
    for phase in PHASES:
        startup.start(phase)
        startup.done(phase)
    startup.engine_up = True
    with ThreadPoolExecutor(2) as executor:
        services = Services(settings=Settings(max_concurrent_inputs=4), startup=startup, executor=executor)
        folder = read_model_folder(model_dir)
        services.models["minilm"] = ServedModel("minilm", folder, TokenizerPool(model_dir), engine=None)  # type: ignore[arg-type]
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
