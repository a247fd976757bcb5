"""One copy of the weights for every engine, behind a real server: a BERT-base-shaped random encoder
saved in bfloat16 shards and served in float32, so its float32 weights exist only in memory (built once,
in the forkserver). Memory is read from /proc/PID/smaps_rollup."""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
import torch

from common.procmem import process_memory
from tests.checkpoints import random_bert
from tests.server_process import ServerProcess, serving, wait_for

BASE = {"hidden_size": 768, "num_hidden_layers": 12, "num_attention_heads": 12, "intermediate_size": 3072}
TEXTS = ["The forkserver holds the weights.", "Every engine maps them.", "naïve café 日本語", ""]


@pytest.fixture(scope="module")
def folder(model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return random_bert(tmp_path_factory.mktemp("bert-base") / "model", model_dir, BASE, torch.bfloat16, shard_mb=100)


@pytest.fixture(scope="module")
def weights_mb(folder: Path) -> float:
    """The model's weights in float32: twice its bfloat16 shards."""
    return 2 * sum(p.stat().st_size for p in folder.glob("model-*.safetensors")) / 1e6


@pytest.fixture(scope="module")
def server(folder: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    with serving(folder, tmp_path_factory.mktemp("logs") / "server.log", engines=2) as proc:
        yield proc


def embed(server: ServerProcess) -> np.ndarray:
    r = server.post("/v1/embeddings", json={"input": TEXTS})
    assert r.status_code == 200, r.text
    return np.asarray([d["embedding"] for d in r.json()["data"]])


def test_two_engines_share_one_copy_of_the_weights(server: ServerProcess, weights_mb: float) -> None:
    """Once both engines have served, each maps the whole float32 model as memory shared with the other
    processes and holds privately (what a second engine adds) less than a quarter of one copy; the engine
    phase reports each engine's and the forkserver's memory."""
    pids = server.wait_engines()["pids"]
    with ThreadPoolExecutor(4) as pool:  # concurrent requests: each engine serves some
        list(pool.map(lambda _: embed(server), range(8)))
    for pid in pids:
        memory = process_memory(pid)
        assert memory is not None
        assert memory["shared_mb"] > 0.9 * weights_mb, memory
        assert memory["private_mb"] < 0.25 * weights_mb, memory
    reported = server.phase("engine")["detail"]["memory"]
    assert {m["pid"] for m in reported if m["process"].startswith("engine")} == set(pids)
    assert [m["process"] for m in reported if m["pid"] not in pids] == ["forkserver"]
    assert all(m["pss_mb"] <= m["rss_mb"] for m in reported)


def test_re_forked_engines_serve_correct_vectors_without_a_copy(
    server: ServerProcess, folder: Path, weights_mb: float
) -> None:
    """Both engines, killed in turn, are re-forked holding no private copy of the weights (the
    forkserver's, inherited: nothing read or converted again), and the vectors they serve are
    SentenceTransformer's (the same folder, in float32) within 1e-5."""
    from sentence_transformers import SentenceTransformer

    for slot in (0, 1):
        victim = server.wait_engines()["pids"][slot]
        os.kill(victim, signal.SIGKILL)

        def replaced(victim: int = victim) -> bool:
            detail = server.phase("engine")["detail"]
            return victim not in detail["pids"] and detail["up"] == 2

        wait_for(replaced, 120, f"engine {slot} to be re-forked and ready")
    for pid in server.wait_engines()["pids"]:
        memory = process_memory(pid)
        assert memory is not None and memory["private_mb"] < 0.25 * weights_mb, memory
    reference = SentenceTransformer(str(folder), device="cpu", model_kwargs={"dtype": torch.float32})
    np.testing.assert_allclose(embed(server), reference.encode(TEXTS), atol=1e-5, rtol=0)
