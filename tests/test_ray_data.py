"""warmpool.ray's Embedder in a Ray Data pipeline on a local Ray runtime (its actors are processes): each
row's vector is the server's /v1/embeddings vector for its text, rows in the dataset's order."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.app.test_embedder import TEXTS
from tests.server_process import ROOT, Served
from warmpool.ray import Embedder

ray = pytest.importorskip("ray")


@pytest.fixture(scope="module")
def local_ray() -> Iterator[Any]:
    """A Ray runtime of its own on two CPUs (never one already running), its workers importing this checkout."""
    ray.init(
        address="local",
        num_cpus=2,
        include_dashboard=False,
        log_to_driver=False,
        runtime_env={"env_vars": {"PYTHONPATH": str(ROOT)}},
    )
    context = ray.data.DataContext.get_current()
    context.enable_progress_bars = False
    # Ray Data hands blocks on as they finish unless told to keep the dataset's order (a block held
    # up on a busy machine came out after the next one): what a pipeline that needs its order sets
    context.execution_options.preserve_order = True
    try:
        yield ray
    finally:
        ray.shutdown()


def test_map_batches_gives_the_servers_vectors_in_order(
    local_ray: Any, server: Served, model_dir: Path, tmp_path: Path
) -> None:
    dataset = local_ray.data.from_items([{"id": i, "text": text} for i, text in enumerate(TEXTS)])
    rows = dataset.map_batches(
        Embedder,
        fn_constructor_kwargs={"model_dir": str(model_dir), "compile": "off", "compile_cache": str(tmp_path)},
        compute=local_ray.data.ActorPoolStrategy(size=1),
        batch_size=16,
    ).take_all()
    assert [row["id"] for row in rows] == list(range(len(TEXTS)))
    answer = server.post("/v1/embeddings", json={"input": TEXTS}).json()
    expected = np.asarray([d["embedding"] for d in sorted(answer["data"], key=lambda d: d["index"])])
    np.testing.assert_allclose(np.stack([row["embedding"] for row in rows]), expected, rtol=0, atol=1e-6)
