"""Models on demand: three copies of the default model behind one port with a memory budget for two,
loaded when a request names one, the least recently used unloaded to make room; keep_alive; the
admin API. The tests of the zoo run in order, each starting from where the last left it."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from common.settings import Settings
from orchestrator.ondemand import estimate
from tests.conftest import API_KEY
from tests.server_process import ServerProcess, wait_for
from tests.test_overload import metrics
from tests.tiny_models import TinyFolders

DOCS = ["The Eiffel Tower is in Paris.", "Bananas are yellow."]
AUTH = {"Authorization": f"Bearer {API_KEY}"}


@pytest.fixture(scope="module")
def zoo(model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """a, b and c (copies of the default model, one engine each, resident=auto) with a budget for two
    of them; `huge` (four engines) needs more than the budget alone. API key on."""
    root = tmp_path_factory.mktemp("zoo")
    folders = {name: shutil.copytree(model_dir, root / name) for name in ("a", "b", "c", "huge")}
    one = estimate(Settings(model=str(folders["a"]), engines=1))  # type: ignore[call-arg]
    entries = [f"{n}={folders[n]};resident=auto" for n in ("a", "b", "c")]
    entries.append(f"huge={folders['huge']};engines=4;resident=auto")
    server = ServerProcess(
        model_dir,
        root / "zoo.log",
        models=",".join(entries),
        engines=1,
        memory_budget=str(int(2.5 * one)),
        api_key=API_KEY,
    )
    server.client.headers.update(AUTH)
    try:
        yield server.wait_ready()
    finally:
        assert server.stop() == 0


def states(server: ServerProcess) -> dict[str, str]:
    return {m["id"]: m["state"] for m in server.get("/v1/models").json()["data"]}


def embed(server: ServerProcess, model: str | None = None) -> Any:
    return server.post("/v1/embeddings", json={"input": DOCS, **({"model": model} if model else {})})


def counter(server: ServerProcess, name: str, **labels: str) -> float:
    return metrics(server).get((name, tuple(sorted(labels.items()))), 0.0)


def test_the_models_that_fit_start_and_the_third_is_served_after_a_load(
    zoo: ServerProcess, server: ServerProcess
) -> None:
    """a and b fit the budget and start, c stays unloaded; c's first request loads it (a, the least
    recently used, is unloaded for it) and its answer equals a server's that had the model resident."""
    assert states(zoo) == {"a": "ready", "b": "ready", "c": "unloaded", "huge": "unloaded"}
    assert embed(zoo, "a").status_code == 200 and embed(zoo, "b").status_code == 200  # a is the older
    answer = embed(zoo, "c")
    assert answer.status_code == 200, answer.text
    alone = server.post("/v1/embeddings", json={"input": DOCS}).json()["data"]
    np.testing.assert_allclose(
        [d["embedding"] for d in answer.json()["data"]], [d["embedding"] for d in alone], atol=1e-6
    )
    assert states(zoo) == {"a": "unloaded", "b": "ready", "c": "ready", "huge": "unloaded"}
    assert counter(zoo, "warmpool_model_evictions_total", model="a") == 1
    table = {p["name"]: p for p in zoo.startup()["phases"]}
    assert table["ready:c"]["state"] == "done" and table["engine:c"]["state"] == "done"  # its load's own phases
    assert table["engine:a"]["state"] == "skipped" and zoo.get("/health/ready").status_code == 200


def test_the_least_recently_used_model_is_unloaded_first_and_comes_back_on_demand(zoo: ServerProcess) -> None:
    """After c's load, b is the least recently used: a request for a unloads b, not c."""
    assert embed(zoo, "c").status_code == 200  # c after b
    assert embed(zoo, "a").status_code == 200
    assert states(zoo) == {"a": "ready", "b": "unloaded", "c": "ready", "huge": "unloaded"}
    assert counter(zoo, "warmpool_model_evictions_total", model="b") == 1
    cards = {m["id"]: m for m in zoo.get("/v1/models").json()["data"]}
    assert cards["a"]["memory_bytes"] > 0 and cards["b"]["memory_bytes"] == 0 and cards["a"]["last_used"]
    assert counter(zoo, "warmpool_model_resident_bytes", model="a") == cards["a"]["memory_bytes"]


def test_concurrent_first_requests_share_one_load(zoo: ServerProcess) -> None:
    """Eight requests for the unloaded b at once: every one is answered, after one load of b."""
    loads = counter(zoo, "warmpool_model_loads_total", model="b")
    with ThreadPoolExecutor(8) as pool:
        statuses = list(pool.map(lambda _: embed(zoo, "b").status_code, range(8)))
    assert statuses == [200] * 8
    assert counter(zoo, "warmpool_model_loads_total", model="b") == loads + 1
    assert counter(zoo, "warmpool_model_load_wait_seconds_count", model="b") >= 1


def test_a_model_larger_than_the_budget_is_refused_naming_it(zoo: ServerProcess) -> None:
    """huge (four engines) cannot fit even alone: 400 model_too_large, nothing unloaded for it."""
    before = states(zoo)
    refused = embed(zoo, "huge")
    assert refused.status_code == 400
    error = refused.json()["error"]
    assert error["code"] == "model_too_large" and "WARMPOOL_MEMORY_BUDGET" in error["message"]
    assert states(zoo) == before


def test_load_and_unload_over_the_admin_api(zoo: ServerProcess) -> None:
    """load and unload are idempotent, keyed, 404 for an unknown name; a load shows its own phases."""
    assert zoo.client.post("/admin/models/c/unload", headers={"Authorization": "Bearer wrong"}).status_code == 401
    assert zoo.post("/admin/models/nope/load").status_code == 404
    loaded = zoo.post("/admin/models/c/load")
    assert loaded.status_code == 200 and loaded.json()["state"] == "ready", loaded.text
    assert zoo.post("/admin/models/c/unload").json()["state"] == "unloaded"
    assert zoo.post("/admin/models/c/unload").json()["state"] == "unloaded"
    assert states(zoo)["c"] == "unloaded"
    assert counter(zoo, "warmpool_model_unloads_total", model="c", reason="asked") == 1
    tokenized = zoo.post("/tokenize", json={"model": "c", "prompt": "hello"})  # the tokenizer alone wakes it too
    assert tokenized.status_code == 200 and states(zoo)["c"] == "ready", tokenized.text
    assert zoo.post("/admin/models/c/unload").json()["state"] == "unloaded"
    assert zoo.post("/admin/models/c/load").json()["state"] == "ready"
    assert zoo.post("/admin/models/c/load").json()["state"] == "ready"
    assert {p["name"]: p["state"] for p in zoo.startup()["phases"]}["warmup:c"] == "done"
    assert embed(zoo, "c").status_code == 200


def test_an_unload_lets_the_requests_in_flight_finish(zoo: ServerProcess) -> None:
    """A long request for c is answered in full although c is unloaded while it runs."""
    assert embed(zoo, "c").status_code == 200
    long = {"input": ["word " * 150] * 64, "model": "c"}
    with ThreadPoolExecutor(1) as pool:
        running = pool.submit(lambda: zoo.post("/v1/embeddings", json=long, timeout=120))
        wait_for(lambda: running.done() or metrics(zoo)[("warmpool_inputs_in_flight", ())] > 0, 30, "the long request")
        assert zoo.post("/admin/models/c/unload", timeout=120).json()["state"] == "unloaded"
        answered = running.result(timeout=120)
    assert answered.status_code == 200 and len(answered.json()["data"]) == 64


def test_keep_alive_unloads_an_idle_model_and_a_request_past_the_load_wait_gets_503(
    model_dir: Path, cross_encoder_dir: Path, tmp_path: Path
) -> None:
    """rerank (resident=auto, keep_alive=1) is unloaded once idle; with WARMPOOL_LOAD_WAIT shorter than a
    load, the request that wakes it is a 503 with Retry-After, and it is served once loaded."""
    server = ServerProcess(
        model_dir,
        tmp_path / "log",
        models=f"embed={model_dir},rerank={cross_encoder_dir};resident=auto;keep_alive=1",
        engines=1,
        load_wait=0.001,  # far shorter than any load: a fork and a warm-up take milliseconds at least
    )
    body = {"text_1": "Where is the Eiffel Tower?", "text_2": DOCS, "model": "rerank"}
    try:
        server.wait_ready()
        wait_for(lambda: states(server)["rerank"] == "unloaded", 30, "rerank to be unloaded when idle")
        assert counter(server, "warmpool_model_unloads_total", model="rerank", reason="idle") == 1
        held = server.post("/score", json=body)
        assert held.status_code == 503 and held.headers["Retry-After"] == "1"
        assert "WARMPOOL_LOAD_WAIT" in held.json()["error"]["message"]
        wait_for(lambda: server.post("/score", json=body).status_code == 200, 60, "rerank to serve once loaded")
        assert server.post("/v1/embeddings", json={"input": "still here"}).status_code == 200
    finally:
        assert server.stop() == 0


def test_a_model_with_no_room_beside_always_resident_ones_gets_503_no_room(
    model_dir: Path, cross_encoder_dir: Path, tmp_path: Path
) -> None:
    """Where the budget is held by `always` models, nothing can be unloaded for an `auto` one: its
    request is a 503 no_room with Retry-After naming the budget, and the resident model still serves."""
    embed_bytes = estimate(Settings(model=str(model_dir), engines=1))  # type: ignore[call-arg]
    rerank_bytes = estimate(Settings(model=str(cross_encoder_dir), engines=1))  # type: ignore[call-arg]
    server = ServerProcess(
        model_dir,
        tmp_path / "log",
        models=f"embed={model_dir},rerank={cross_encoder_dir};resident=auto",
        engines=1,
        memory_budget=str(embed_bytes + rerank_bytes - 1),
    )
    body = {"text_1": "Where is the Eiffel Tower?", "text_2": DOCS, "model": "rerank"}
    try:
        server.wait_ready()
        refused = server.post("/score", json=body)
        assert refused.status_code == 503 and refused.headers["Retry-After"] == "1", refused.text
        assert refused.json()["error"]["code"] == "no_room"
        assert "WARMPOOL_MEMORY_BUDGET" in refused.json()["error"]["message"]
        assert states(server)["rerank"] == "unloaded"
        assert server.post("/v1/embeddings", json={"input": "still here"}).status_code == 200
    finally:
        assert server.stop() == 0


def test_load_and_unload_cycles_leave_no_descriptors_open(tiny: TinyFolders, tmp_path: Path) -> None:
    """30 admin load/unload cycles of an on-demand model (a tiny one: a load takes less): the HTTP
    process holds as many descriptors after them as after the first few (each stopped engine's pidfd
    and forkserver pipe are closed)."""
    folder = tiny["gte"]
    server = ServerProcess(folder, tmp_path / "log", models=f"a={folder},b={folder};resident=auto", engines=1)

    def cycles(count: int) -> int:
        for _ in range(count):
            assert server.post("/admin/models/b/load").json()["state"] == "ready"
            assert server.post("/admin/models/b/unload").json()["state"] == "unloaded"
        return len(os.listdir(f"/proc/{server.proc.pid}/fd"))

    try:
        server.wait_ready()
        warm = cycles(5)  # what a first load opens for good (the forkserver's connection, imports)
        assert cycles(30) <= warm + 2  # a client's connection may come and go
    finally:
        assert server.stop() == 0
