"""The exact result cache on the real app: hits answer bit for bit what the engine answered, say so in
`x-cache`, bill the same usage, and N identical inputs at once cost one forward."""

from __future__ import annotations

import base64
import contextlib
import threading
import uuid
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

from server.core.engine_modes import EngineModes
from tests.app.inprocess import InProcessServer


def text() -> str:
    """An input no other test sends: its first request is a miss."""
    return f"a cached sentence {uuid.uuid4().hex}"


def sample(server: InProcessServer, name: str, **labels: str) -> float:
    return server.services.metrics.registry.get_sample_value(name, labels) or 0.0


def embed(server: InProcessServer, inputs: str | list[str], **extra: object):  # type: ignore[no-untyped-def]
    r = server.post("/v1/embeddings", json={"input": inputs, "encoding_format": "base64", **extra})
    assert r.status_code == 200, r.text
    return r


def raw(response) -> list[bytes]:  # type: ignore[no-untyped-def]
    return [base64.b64decode(d["embedding"]) for d in response.json()["data"]]


def test_a_hit_answers_the_same_bits(server: InProcessServer) -> None:
    one = text()
    first = embed(server, one)
    again = embed(server, one)
    assert raw(again) == raw(first)


def test_x_cache_says_miss_then_hit(server: InProcessServer) -> None:
    one = text()
    assert embed(server, one).headers["x-cache"] == "miss"
    assert embed(server, one).headers["x-cache"] == "hit"


def test_x_cache_says_partial_for_some_inputs_cached(server: InProcessServer) -> None:
    known = text()
    embed(server, known)
    assert embed(server, [known, text()]).headers["x-cache"] == "partial"


def test_usage_is_billed_on_a_hit(server: InProcessServer) -> None:
    one = text()
    first = embed(server, one).json()["usage"]
    assert embed(server, one).json()["usage"] == first


def test_output_options_apply_to_a_cached_answer(server: InProcessServer) -> None:
    """The cache holds the engine's row: dimensions (and renormalising) still apply on a hit."""
    one = text()
    full = np.frombuffer(raw(embed(server, one))[0], dtype=np.float32)
    cut = embed(server, one, dimensions=64)
    assert cut.headers["x-cache"] == "hit"
    got = np.frombuffer(raw(cut)[0], dtype=np.float32)
    np.testing.assert_allclose(got, full[:64] / np.linalg.norm(full[:64]), rtol=1e-6)


def test_a_repeated_input_within_a_request_runs_once(server: InProcessServer) -> None:
    one = text()
    before = sample(server, "warmpool_batch_size_sum", model="all-MiniLM-L6-v2")
    r = embed(server, [one, one, one])
    assert len(set(raw(r))) == 1
    assert sample(server, "warmpool_batch_size_sum", model="all-MiniLM-L6-v2") - before == 1


def test_concurrent_identical_inputs_cost_one_forward(server: InProcessServer) -> None:
    one, clients = text(), 8
    before = sample(server, "warmpool_cache_misses_total")
    forwards = sample(server, "warmpool_batch_size_sum", model="all-MiniLM-L6-v2")
    answers: list[list[bytes]] = []
    start = threading.Barrier(clients)

    def client() -> None:
        start.wait(30)
        answers.append(raw(embed(server, one)))

    threads = [threading.Thread(target=client) for _ in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert len(answers) == clients and all(a == answers[0] for a in answers)
    assert sample(server, "warmpool_cache_misses_total") - before == 1
    assert sample(server, "warmpool_batch_size_sum", model="all-MiniLM-L6-v2") - forwards == 1


def test_status_and_startup_show_the_cache(server: InProcessServer) -> None:
    one = text()
    embed(server, one)
    embed(server, one)
    status = server.get("/status").json()["cache"]
    startup = server.get("/health/startup").json()["cache"]
    for figures in (status, startup):
        assert figures["enabled"] and figures["entries"] >= 1 and 0 < figures["bytes"] <= figures["bound_bytes"]
        assert figures["hits"]["local"] >= 1 and figures["misses"] >= 1


def engines(server: InProcessServer) -> EngineModes:
    (model,) = server.services.models.values()
    return model.engine.modes


@contextlib.contextmanager
def engines_running(server: InProcessServer, mode: str, slot: int | None = None) -> Iterator[None]:
    """The engines (or one more `slot`) as if they had said they run `mode`: the shared app's left eager."""
    modes = engines(server)
    slots = modes.slots if slot is None else [slot]
    for s in slots:
        modes.set(s, mode)
    try:
        yield
    finally:
        for s in slots:
            modes.set(s, "eager") if slot is None else modes.drop(s)


def test_an_answer_kept_from_eager_engines_is_not_served_once_they_run_compiled(server: InProcessServer) -> None:
    """A compiled forward's bits differ from eager's: the key holds the forward that computed the answer."""
    one = text()
    assert embed(server, one).headers["x-cache"] == "miss"
    with engines_running(server, "compiled"):
        assert embed(server, one).headers["x-cache"] == "miss"
        assert embed(server, one).headers["x-cache"] == "hit"
    assert embed(server, one).headers["x-cache"] == "hit"  # eager's entry, kept


def test_nothing_is_kept_while_engines_run_different_forwards(server: InProcessServer) -> None:
    """Between one engine's switch to its compiled forward and the last one's, either may answer."""
    one = text()
    with engines_running(server, "compiled", slot=99):
        assert embed(server, one).headers["x-cache"] == "miss"
        assert embed(server, one).headers["x-cache"] == "miss"
    assert embed(server, one).headers["x-cache"] == "miss"


def test_an_answer_is_not_kept_when_an_engine_switched_while_it_ran(
    server: InProcessServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Looked up while every engine ran eager, answered after one said it runs compiled: not kept."""
    (model,) = server.services.models.values()
    submit = model.engine.submit
    modes = engines(server)

    def switching(*args: Any, **kwargs: Any) -> Any:
        for slot in modes.slots:
            modes.set(slot, "compiled")
        return submit(*args, **kwargs)

    monkeypatch.setattr(model.engine, "submit", switching)
    one = text()
    try:
        assert embed(server, one).headers["x-cache"] == "miss"
    finally:
        for slot in modes.slots:
            modes.set(slot, "eager")
        monkeypatch.undo()
    assert embed(server, one).headers["x-cache"] == "miss"
