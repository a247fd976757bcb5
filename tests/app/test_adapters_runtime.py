"""LoRA adapters loaded and unloaded at run time (POST /admin/adapters/{name}/load|unload): served as
PEFT serves them once loaded, a 404 once unloaded; folders only under WARMPOOL_ADAPTER_ROOT; an adapter
of another base refused with its reason; the least recently used dropped to keep WARMPOOL_ADAPTER_BYTES
and loaded again by the request naming it; loads and unloads while clients send requests, every answer
right."""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.app.inprocess import InProcessServer, serving
from tests.lora_adapters import build_adapter, reference
from tests.server_process import wait_for
from tests.tiny_models import TinyFolders

TEXTS = ["the warm pool model", "Hello world, the engine"]


@pytest.fixture(scope="module")
def root(tiny: TinyFolders, model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """WARMPOOL_ADAPTER_ROOT: adapters of the tiny XLM-R, and one of all-MiniLM-L6-v2 (another base: its
    hidden size 384, the tiny one's 32)."""
    root = tmp_path_factory.mktemp("adapter-root")
    for name, seed in (("legal", 1), ("medical", 2), ("tax", 3), ("a", 4), ("b", 5)):
        build_adapter(root / name, tiny["xlm-roberta"], seed=seed)
    build_adapter(root / "minilm", model_dir, seed=6, layers_to_transform=[0, 1])  # layers the tiny one has too
    return root


@pytest.fixture(scope="module")
def app(tiny: TinyFolders, root: Path) -> Iterator[InProcessServer]:
    with serving(tiny["xlm-roberta"], served_model_name="base", adapter_root=str(root)) as served:
        yield served


def embed(app: InProcessServer, model: str) -> tuple[int, object]:
    r = app.post("/v1/embeddings", json={"model": model, "input": TEXTS})
    body = r.json()
    return r.status_code, [item["embedding"] for item in body["data"]] if r.status_code == 200 else body


def test_a_loaded_adapter_serves_peft_s_vectors(app: InProcessServer, tiny: TinyFolders, root: Path) -> None:
    r = app.post("/admin/adapters/legal/load", json={"path": "legal"})
    assert r.status_code == 200, r.text
    assert r.json()["state"] == "ready" and r.json()["memory_bytes"] > 0
    status, vectors = embed(app, "legal")
    assert status == 200, vectors
    np.testing.assert_allclose(vectors, reference(tiny["xlm-roberta"], root / "legal", TEXTS), atol=1e-5, rtol=0)


def test_an_unloaded_adapter_is_a_404(app: InProcessServer) -> None:
    assert app.post("/admin/adapters/medical/load", json={"path": "medical"}).status_code == 200
    r = app.post("/admin/adapters/medical/unload")
    assert r.status_code == 200, r.text
    status, body = embed(app, "medical")
    assert status == 404, body
    assert "model 'medical' does not exist" in body["error"]["message"]  # type: ignore[index]


def test_models_and_the_startup_detail_list_a_loaded_adapter(app: InProcessServer, root: Path) -> None:
    assert app.post("/admin/adapters/tax/load", json={"path": str(root / "tax")}).status_code == 200
    cards = {card["id"]: card for card in app.get("/v1/models").json()["data"]}
    assert cards["tax"]["parent"] == "base" and cards["tax"]["root"] == str(root / "tax")
    assert cards["tax"]["state"] == "ready" and cards["tax"]["memory_bytes"] > 0
    phases = {phase["name"]: phase for phase in app.get("/health/startup").json()["phases"]}
    ready = phases["ready"]["detail"]
    assert ready["adapters"]["tax"]["memory_bytes"] == cards["tax"]["memory_bytes"]


def test_the_status_page_s_poll_lists_a_loaded_adapter(app: InProcessServer) -> None:
    assert app.post("/admin/adapters/legal/load", json={"path": "legal"}).status_code == 200
    adapters = app.get("/status").json()["adapters"]
    assert adapters["base"]["legal"]["state"] == "ready" and adapters["base"]["legal"]["loaded_at"] == "run time"


def test_requests_with_an_adapter_are_counted_by_its_name(app: InProcessServer) -> None:
    assert app.post("/admin/adapters/legal/load", json={"path": "legal"}).status_code == 200
    assert embed(app, "legal")[0] == 200
    line = 'warmpool_adapter_requests_total{adapter="legal",model="base"}'
    assert any(row.startswith(line) for row in app.get("/metrics").text.splitlines())


def _outside(tmp_path: Path, root: Path) -> tuple[str, Path]:
    """A symlink under the root to an adapter folder outside it."""
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    link = root / f"link-{tmp_path.name}"
    link.symlink_to(outside, target_is_directory=True)
    return link.name, outside


@pytest.mark.parametrize(
    ("how", "status", "reason"),
    [
        ("dots", 400, "'..' is not allowed"),
        ("absolute", 403, "is outside WARMPOOL_ADAPTER_ROOT"),
        ("symlink", 403, "through a symlink"),
    ],
)
def test_a_folder_outside_the_root_is_refused_naming_why(
    app: InProcessServer, root: Path, tmp_path: Path, how: str, status: int, reason: str
) -> None:
    link, outside = _outside(tmp_path, root)
    path = {"dots": "legal/../../x", "absolute": str(outside), "symlink": link}[how]
    r = app.post("/admin/adapters/escape/load", json={"path": path})
    assert r.status_code == status, r.text
    assert reason in r.json()["error"]["message"]


def test_an_adapter_of_another_base_is_refused_with_its_reason(app: InProcessServer) -> None:
    r = app.post("/admin/adapters/minilm/load", json={"path": "minilm"})
    assert r.status_code == 400, r.text
    assert "adapter 'minilm'" in r.json()["error"]["message"]
    assert "was trained on another base" in r.json()["error"]["message"]
    assert "maps 384 features" in r.json()["error"]["message"]
    assert "minilm" not in {card["id"] for card in app.get("/v1/models").json()["data"]}


def test_without_a_root_run_time_loading_is_refused(tiny: TinyFolders, root: Path) -> None:
    with serving(tiny["xlm-roberta"], served_model_name="base") as served:
        r = served.post("/admin/adapters/legal/load", json={"path": str(root / "legal")})
    assert r.status_code == 403, r.text
    assert "set WARMPOOL_ADAPTER_ROOT" in r.json()["error"]["message"]


def test_the_least_recently_used_is_dropped_for_room_and_loaded_again_on_demand(tiny: TinyFolders, root: Path) -> None:
    one = (root / "a" / "adapter_model.safetensors").stat().st_size
    cap = one + one // 2  # room for one adapter
    with serving(tiny["xlm-roberta"], served_model_name="base", adapter_root=str(root), adapter_bytes=str(cap)) as app:
        assert app.post("/admin/adapters/a/load", json={"path": "a"}).status_code == 200
        assert app.post("/admin/adapters/b/load", json={"path": "b"}).status_code == 200
        states = {c["id"]: c["state"] for c in app.get("/v1/models").json()["data"]}
        assert (states["a"], states["b"]) == ("unloaded", "ready")
        status, vectors = embed(app, "a")  # loaded again for this request; b makes room
        assert status == 200, vectors
        np.testing.assert_allclose(vectors, reference(tiny["xlm-roberta"], root / "a", TEXTS), atol=1e-5, rtol=0)
        states = {c["id"]: c["state"] for c in app.get("/v1/models").json()["data"]}
        assert (states["a"], states["b"]) == ("ready", "unloaded")


def test_a_name_loaded_again_from_other_files_is_not_answered_from_the_cache(
    app: InProcessServer, tiny: TinyFolders, root: Path
) -> None:
    """The result cache keys an input by its adapter's files, not its name alone."""
    assert app.post("/admin/adapters/swap/load", json={"path": "a"}).status_code == 200
    _, first = embed(app, "swap")
    assert app.post("/admin/adapters/swap/unload").status_code == 200
    assert app.post("/admin/adapters/swap/load", json={"path": "b"}).status_code == 200
    _, second = embed(app, "swap")
    np.testing.assert_allclose(second, reference(tiny["xlm-roberta"], root / "b", TEXTS), atol=1e-5, rtol=0)
    assert not np.allclose(first, second)


CYCLES = 4  # loads and unloads of b, each seen answered both ways
WAIT_S = 30.0  # any one wait here: a hang fails the test


def test_loads_and_unloads_under_load_leave_every_answer_right(tiny: TinyFolders, root: Path) -> None:
    """Two clients each of the base, of a loaded adapter a and of b keep sending while b is loaded and unloaded
    over and over: every 200 is its model's reference vectors (the base's, PEFT's), every other answer b's 404
    while it is unloaded; never a 5xx, nothing hangs (the result cache off: every request reaches the engine)."""
    from sentence_transformers import SentenceTransformer

    base = tiny["xlm-roberta"]
    expected = {
        "base": SentenceTransformer(str(base), device="cpu").encode(TEXTS),
        "a": reference(base, root / "a", TEXTS),
        "b": reference(base, root / "b", TEXTS),
    }
    answers: list[tuple[str, int, Any]] = []  # (model, status, vectors or error body), appended by the clients
    stop = threading.Event()
    settings = {"adapter_root": str(root), "cache_bytes": "0", "request_timeout": WAIT_S}
    with serving(base, served_model_name="base", **settings) as app:
        assert app.post("/admin/adapters/a/load", json={"path": "a"}).status_code == 200

        def client(model: str) -> None:
            while not stop.is_set():
                answers.append((model, *embed(app, model)))

        def seen() -> Counter[tuple[str, int]]:
            return Counter((model, status) for model, status, _ in list(answers))

        clients = [threading.Thread(target=client, args=(model,), daemon=True) for model in [*expected] * 2]
        for thread in clients:
            thread.start()
        try:
            for _ in range(CYCLES):
                before = seen()
                assert app.post("/admin/adapters/b/load", json={"path": "b"}).status_code == 200
                wait_for(lambda before=before: seen()[("b", 200)] > before[("b", 200)], WAIT_S, "b answered")
                before = seen()
                assert app.post("/admin/adapters/b/unload").status_code == 200
                wait_for(lambda before=before: seen()[("b", 404)] > before[("b", 404)], WAIT_S, "b's 404")
        finally:
            stop.set()
            for thread in clients:
                thread.join(WAIT_S)
        assert not any(thread.is_alive() for thread in clients), "a client's request never ended"
    for model, status, got in answers:
        if status == 200:
            np.testing.assert_allclose(got, expected[model], atol=1e-5, rtol=0, err_msg=model)
        else:
            assert (model, status, got["error"]["code"]) == ("b", 404, "model_not_found"), got
    counts = seen()
    assert counts[("base", 200)] and counts[("a", 200)], counts
