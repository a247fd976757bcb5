"""One appliance serving the default embedding model and a tiny cross-encoder behind one port."""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.server_process import ServerProcess, steady_load, wait_for
from tests.test_overload import metrics

QUERY = "Where is the Eiffel Tower?"
DOCS = ["The Eiffel Tower is in Paris.", "Bananas are yellow.", "The tower was finished in 1889."]


@pytest.fixture(scope="module")
def appliance(
    model_dir: Path, cross_encoder_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ServerProcess]:
    log = tmp_path_factory.mktemp("logs") / "several.log"
    server = ServerProcess(model_dir, log, models=f"embed={model_dir},rerank={cross_encoder_dir}")
    try:
        yield server
    finally:
        assert server.stop() == 0


def phases(server: ServerProcess) -> dict[str, dict[str, Any]]:
    return {p["name"]: p for p in server.startup()["phases"]}


def test_each_models_phases_show_while_the_first_ready_one_serves(appliance: ServerProcess) -> None:
    """As soon as one model is ready it serves, and the table shows both models' own phases."""

    def one_ready() -> dict[str, dict[str, Any]] | None:
        table = phases(appliance)
        return table if "done" in (table["ready:embed"]["state"], table["ready:rerank"]["state"]) else None

    table = wait_for(one_ready, 120, "a model to be ready")
    first = "embed" if table["ready:embed"]["state"] == "done" else "rerank"
    assert {f"{p}:{m}" for p in ("prefetch", "engine", "warmup", "ready") for m in ("embed", "rerank")} <= set(table)
    assert {table[f"engine:{m}"]["model"] for m in ("embed", "rerank")} == {"embed", "rerank"}
    body = {"input": "hi", "model": first} if first == "embed" else {"text_1": QUERY, "text_2": DOCS, "model": first}
    assert appliance.post("/v1/embeddings" if first == "embed" else "/score", json=body).status_code == 200
    appliance.wait_ready()
    assert appliance.get("/health/ready?model=rerank").status_code == 200
    assert appliance.get("/health/ready?model=nope").status_code == 404


def test_each_model_answers_as_its_own_server_would(
    appliance: ServerProcess, server: ServerProcess, cross_encoder_server: ServerProcess
) -> None:
    """/v1/embeddings (the default model) and /rerank (the reranker, no model named) equal two
    single-model servers' answers."""
    appliance.wait_ready()
    got = appliance.post("/v1/embeddings", json={"input": DOCS}).json()["data"]
    alone = server.post("/v1/embeddings", json={"input": DOCS}).json()["data"]
    np.testing.assert_allclose([d["embedding"] for d in got], [d["embedding"] for d in alone], atol=1e-6)
    ranked = appliance.post("/rerank", json={"query": QUERY, "documents": DOCS}).json()
    single = cross_encoder_server.post("/rerank", json={"query": QUERY, "documents": DOCS}).json()
    assert ranked["model"] == "rerank"
    assert [r["index"] for r in ranked["results"]] == [r["index"] for r in single["results"]]
    np.testing.assert_allclose(
        [r["relevance_score"] for r in ranked["results"]], [r["relevance_score"] for r in single["results"]], atol=1e-6
    )
    named = appliance.post("/v1/embeddings", json={"input": "x", "model": "nope"})
    assert named.status_code == 404 and "'embed', 'rerank'" in named.json()["error"]["message"]
    listed = {m["id"]: m for m in appliance.get("/v1/models").json()["data"]}
    assert {n: (m["kind"], m["state"]) for n, m in listed.items()} == {
        "embed": ("embedding", "ready"),
        "rerank": ("cross-encoder", "ready"),
    }


def test_killing_one_models_engine_leaves_the_other_serving(appliance: ServerProcess) -> None:
    """kill -9 of the reranker's engine: every embedding request still succeeds, and the reranker
    serves again once its engine is re-forked."""
    appliance.wait_ready()
    victim = phases(appliance)["engine:rerank"]["detail"]["pids"][0]
    statuses: list[int] = []
    with steady_load(appliance, 4, {"input": DOCS, "model": "embed"}, statuses):
        wait_for(lambda: len(statuses) >= 8, 60, "load on the embedder")
        os.kill(victim, signal.SIGKILL)

        def rerank_back() -> bool:
            detail = phases(appliance)["engine:rerank"]["detail"]
            return victim not in detail["pids"] and detail["up"] >= 1

        wait_for(rerank_back, 60, "the reranker's engine to be replaced")
        served = len(statuses)
        wait_for(lambda: len(statuses) >= served + 8, 60, "embedding requests after the restart")
    assert set(statuses) == {200}
    wait_for(
        lambda: appliance.post("/score", json={"text_1": QUERY, "text_2": DOCS, "model": "rerank"}).status_code == 200,
        30,
        "the reranker to serve again",
    )
    samples = metrics(appliance)
    assert samples[("warmpool_engine_restarts_total", (("model", "rerank"),))] == 1
    assert samples.get(("warmpool_engine_restarts_total", (("model", "embed"),)), 0) == 0
    assert {labels for name, labels in samples if name == "warmpool_engines_up"} == {
        (("model", "embed"),),
        (("model", "rerank"),),
    }


def test_a_broken_model_fails_the_appliance_by_default(model_dir: Path, tmp_path: Path) -> None:
    """WARMPOOL_ON_MODEL_FAILURE=exit: the broken model's engine phase fails, then the process exits 1."""
    broken = tmp_path / "broken"
    broken.mkdir()
    server = ServerProcess(model_dir, tmp_path / "log", models=f"embed={model_dir},bad={broken}", fail_linger=0)
    assert server.proc.wait(120) == 1
    assert "model folder" in server.log_path.read_text() or "config.json" in server.log_path.read_text()
    server.stop()


def test_serve_others_keeps_serving_the_models_that_started(model_dir: Path, tmp_path: Path) -> None:
    """serve-others: the broken model shows failed, the other is ready and serves."""
    broken = tmp_path / "broken"
    broken.mkdir()
    server = ServerProcess(
        model_dir, tmp_path / "log", models=f"embed={model_dir},bad={broken}", on_model_failure="serve-others"
    )
    try:
        server.wait_ready()
        table = phases(server)
        assert table["engine:bad"]["state"] == "failed" and table["ready:embed"]["state"] == "done"
        assert server.post("/v1/embeddings", json={"input": "still here"}).status_code == 200
        states = {m["id"]: m["state"] for m in server.get("/v1/models").json()["data"]}
        assert states == {"embed": "ready", "bad": "failed"}
        assert server.get("/health/ready?model=bad").status_code == 503
    finally:
        assert server.stop() == 0
