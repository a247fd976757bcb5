"""Request priority on a real server (vLLM's semantics: lower runs first): an interactive request
overtakes a bulk flood queued before it; bad priorities are 400s."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

from tests.server_process import ServerProcess, serving, wait_for

SENTENCE = "the engine answers the urgent request first while the bulk inputs wait in line"
WORDS = SENTENCE.split(" ")


def text(i: int) -> str:
    return " ".join(WORDS[(i + j) % len(WORDS)] for j in range(48))


@pytest.fixture(scope="module")
def one_engine(model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """One engine: every input waits in the same queue."""
    with serving(model_dir, tmp_path_factory.mktemp("logs") / "priority.log", engines=1) as proc:
        yield proc


@pytest.mark.alone  # a fixed load on both cores: beside another worker its engine threads thrash
def test_an_interactive_request_overtakes_a_bulk_flood(one_engine: ServerProcess) -> None:
    """Bulk requests at priority 1 fill the engine's queue; a priority-0 request sent after them
    (its priority in the x-priority header) is answered while most of them still wait."""
    finished: list[str] = []
    lock = threading.Lock()

    def post(name: str, body: dict, headers: dict[str, str]) -> None:  # type: ignore[type-arg]
        r = httpx.post(one_engine.url + "/v1/embeddings", json=body, headers=headers, timeout=120)
        assert r.status_code == 200, r.text
        with lock:
            finished.append(name)

    bulk = [{"input": [text(i * 32 + j) for j in range(32)], "priority": 1} for i in range(8)]
    with ThreadPoolExecutor(9) as pool:
        floods = [pool.submit(post, f"bulk{i}", body, {}) for i, body in enumerate(bulk)]

        def queued() -> bool:  # at least 7 of the 8 bulk requests wait: the urgent one overtakes 4 with room
            return one_engine.get("/status").json()["queue_depth"] >= 7 * 32

        wait_for(queued, 60, "the bulk inputs queued")
        urgent = pool.submit(post, "urgent", {"input": "where is my answer"}, {"x-priority": "0"})
        urgent.result(timeout=60)
        with lock:
            overtaken = 8 - sum(name.startswith("bulk") for name in finished)
        for future in floods:
            future.result(timeout=120)
    assert overtaken >= 4, finished


@pytest.mark.parametrize(
    ("body", "headers"),
    [
        ({"input": "x", "priority": "high"}, {}),
        ({"input": "x", "priority": 1.5}, {}),
        ({"input": "x", "priority": 2**40}, {}),
        ({"input": "x"}, {"x-priority": "soon"}),
    ],
)
def test_a_priority_that_is_not_a_bounded_integer_is_a_400(
    one_engine: ServerProcess,
    body: dict,
    headers: dict[str, str],  # type: ignore[type-arg]
) -> None:
    """The body field and the header take integers (magnitude below 2^31) only."""
    r = one_engine.post("/v1/embeddings", json=body, headers=headers)
    assert r.status_code == 400, r.text
    assert "priority" in r.json()["error"]["message"]


def test_every_surface_reads_the_priority(one_engine: ServerProcess) -> None:
    """TEI's and Cohere's bodies take the field too: a bad one is refused in each surface's shape."""
    tei = one_engine.post("/embed", json={"inputs": "x", "priority": "soon"})
    assert tei.status_code == 400 and "priority" in tei.json()["error"]
    cohere = one_engine.post("/v2/embed", json={"texts": ["x"], "priority": "soon", "embedding_types": ["float"]})
    assert cohere.status_code == 400 and "priority" in cohere.json()["message"]
    assert one_engine.post("/embed", json={"inputs": "x", "priority": -3}).status_code == 200
