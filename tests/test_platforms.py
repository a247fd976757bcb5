"""Managed platforms' contracts, driven as they call the container: Vertex AI (AIP_HTTP_PORT,
AIP_HEALTH_ROUTE, AIP_PREDICT_ROUTE; instances in, predictions out) and SageMaker (`serve`,
SAGEMAKER_BIND_TO_PORT, GET /ping, POST /invocations)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest

from tests.app.test_pooling_api import DOCS, QUERY, TEXTS
from tests.conftest import API_KEY, VERTEX_PREDICT
from tests.server_process import ServerProcess

HEALTH = "/v1/endpoints/7/deployedModels/8"
VERTEX = {"AIP_HEALTH_ROUTE": HEALTH, "AIP_PREDICT_ROUTE": VERTEX_PREDICT}


@pytest.fixture(scope="module")
def vertex(model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """Keyed, as a model behind Vertex's own authentication still may be; its port from AIP_HTTP_PORT."""
    log = tmp_path_factory.mktemp("logs") / "vertex.log"
    proc = ServerProcess(model_dir, log, environ=VERTEX, port_variable="AIP_HTTP_PORT", api_key=API_KEY)
    try:
        proc.client.headers["authorization"] = f"Bearer {API_KEY}"
        yield proc.wait_ready()
    finally:
        proc.stop()


def test_vertex_port_wins_and_its_health_route_answers_without_the_key(vertex: ServerProcess) -> None:
    """The server listens on AIP_HTTP_PORT (WARMPOOL_PORT names another) and the health route
    Vertex probes answers 200 when ready, with no API key, as its probes carry none."""
    r = httpx.get(vertex.url + HEALTH)
    assert r.status_code == 200 and r.json() == {"status": "ready"}
    assert httpx.get(vertex.url + "/ping").status_code == 200  # SageMaker's probe: open too
    assert httpx.post(vertex.url + VERTEX_PREDICT, json={"instances": ["x"]}).status_code == 401
    assert httpx.post(vertex.url + HEALTH, json={}).status_code == 401  # open to GET only


def test_vertex_predictions_are_the_models_vectors(vertex: ServerProcess, st_model) -> None:  # type: ignore[no-untyped-def]
    """Each instance (a text, {"text"} or {"content"}) gets its vector, in order; parameters are
    TEI's options."""
    texts = ["a photo of a cat", "the cat sat on the mat", "warm starts"]
    r = vertex.post(VERTEX_PREDICT, json={"instances": [texts[0], {"text": texts[1]}, {"content": texts[2]}]})
    assert r.status_code == 200, r.text
    assert list(r.json()) == ["predictions"]
    np.testing.assert_allclose(r.json()["predictions"], st_model.encode(texts), atol=1e-5, rtol=0)
    short = vertex.post(VERTEX_PREDICT, json={"instances": texts, "parameters": {"dimensions": 64}})
    assert [len(p) for p in short.json()["predictions"]] == [64, 64, 64]


@pytest.mark.parametrize(
    ("body", "words"),
    [
        ({"instances": []}, ["instances"]),
        ({"instances": ["ok", 5]}, ["instances[1]"]),
        ({"instances": ["ok", "word " * 600]}, ["instances[1]", "256"]),
        ({"instances": ["ok"], "parameters": {"dimensions": 10**30}}, ["parameters"]),
        ({"instances": ["ok"], "parameters": {"priority": "soon"}}, ["parameters.priority"]),
    ],
)
def test_vertex_errors_are_400s_naming_the_instance(vertex: ServerProcess, body: dict, words: list) -> None:  # type: ignore[type-arg]
    """Bad instances are refused in TEI's error shape, naming what the client sent (never `inputs`)."""
    r = vertex.post(VERTEX_PREDICT, json=body)
    assert r.status_code == 400, r.text
    assert set(r.json()) == {"error", "error_type"}
    assert all(word in r.json()["error"] for word in words), r.json()
    assert "inputs" not in r.json()["error"]


def test_vertex_parameters_cannot_carry_inputs(vertex: ServerProcess) -> None:
    """Inputs come only as instances: parameters naming `inputs` are a 400, not a second input list."""
    r = vertex.post(VERTEX_PREDICT, json={"instances": ["ok"], "parameters": {"inputs": ["smuggled"]}})
    assert r.status_code == 400 and "parameters" in r.json()["error"], r.text


def test_vertex_classifier_predictions_are_tei_predictions(classifier_server: ServerProcess) -> None:
    """A classifier's prediction per instance is TEI's /predict answer for that input, a text or a pair."""
    r = classifier_server.post(
        VERTEX_PREDICT, json={"instances": [TEXTS[0], {"text": TEXTS[1], "text_pair": TEXTS[2]}, [TEXTS[3]]]}
    )
    assert r.status_code == 200, r.text
    expected = classifier_server.post("/predict", json={"inputs": [[TEXTS[0]], TEXTS[1:3], [TEXTS[3]]]}).json()
    got = r.json()["predictions"]
    assert [[p["label"] for p in one] for one in got] == [[p["label"] for p in one] for one in expected]
    np.testing.assert_allclose(
        [[p["score"] for p in one] for one in got], [[p["score"] for p in one] for one in expected], atol=1e-6
    )


def test_vertex_cross_encoder_predictions_are_the_pairs_scores(cross_encoder_server: ServerProcess) -> None:
    """A cross-encoder's instances are pairs and each prediction is the pair's /score score."""
    r = cross_encoder_server.post(VERTEX_PREDICT, json={"instances": [[QUERY, d] for d in DOCS]})
    assert r.status_code == 200, r.text
    expected = [
        d["score"] for d in cross_encoder_server.post("/score", json={"text_1": QUERY, "text_2": DOCS}).json()["data"]
    ]
    np.testing.assert_allclose(r.json()["predictions"], expected, atol=1e-6, rtol=0)
    lone = cross_encoder_server.post(VERTEX_PREDICT, json={"instances": [QUERY]})
    assert lone.status_code == 400 and "instances[0]" in lone.json()["error"]


def test_sagemaker_serve_answers_ping_and_invocations(model_dir: Path, tmp_path: Path, st_model) -> None:  # type: ignore[no-untyped-def]
    """Started as SageMaker starts the image (`serve`, the port in SAGEMAKER_BIND_TO_PORT): /ping
    answers 200 once the model is ready, and /invocations embeds as TEI's POST / does."""
    proc = ServerProcess(model_dir, tmp_path / "sagemaker.log", args=("serve",), port_variable="SAGEMAKER_BIND_TO_PORT")
    try:
        proc.wait_ready()
        assert httpx.get(proc.url + "/ping").status_code == 200
        r = httpx.post(proc.url + "/invocations", json={"inputs": ["sagemaker calls this"]})
        assert r.status_code == 200, r.text
        np.testing.assert_allclose(r.json(), st_model.encode(["sagemaker calls this"]), atol=1e-5, rtol=0)
    finally:
        proc.stop()
