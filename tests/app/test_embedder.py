"""warmpool.ray's Embedder called as Ray Data calls it (no Ray here: tests/test_ray_data.py runs it in
actors): the server's /v1/embeddings vectors, in the batch's order, in each batch format."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest
import torch

from engine.runtime.device import cpu_has, cpu_has_int8
from tests.app.test_embeddings import FITTING, LONG, vectors
from tests.server_process import Served
from warmpool import inprocess
from warmpool.ray import Embedder

TEXTS = FITTING + [f"document {i}: {'warm pools ' * (i % 9)}serve {i} vectors" for i in range(50 - len(FITTING))]


@pytest.fixture(autouse=True, scope="module")
def own_cache(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """The embedders' default compile cache (their GEMM backend's record) in this run's tmp folder."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(inprocess, "_COMPILE_CACHE", tmp_path_factory.mktemp("compile-cache"))
        yield


@pytest.fixture(scope="module")
def embedder(model_dir: Path) -> Iterator[Embedder]:
    yield Embedder(model_dir, compile="off")


def served(server: Served, texts: list[str], **body: Any) -> np.ndarray:
    answer = server.post("/v1/embeddings", json={"input": texts, **body})
    assert answer.status_code == 200, answer.text
    return vectors(answer.json())


def test_vectors_equal_the_servers_in_order(server: Served, embedder: Embedder) -> None:
    batch = {"text": np.asarray(TEXTS, dtype=object), "id": np.arange(len(TEXTS))}
    out = embedder(batch)
    assert out["embedding"].dtype == np.float32
    np.testing.assert_allclose(out["embedding"], served(server, TEXTS), rtol=0, atol=1e-6)
    assert out["id"].tolist() == list(range(len(TEXTS)))  # the batch's own columns kept


def test_small_forward_passes_keep_the_order(server: Served, model_dir: Path) -> None:
    """batch_tokens=24: a forward pass per text or two, each row back in its text's place."""
    out = Embedder(model_dir, compile="off", batch_tokens=24)({"text": np.asarray(TEXTS)})
    np.testing.assert_allclose(out["embedding"], served(server, TEXTS), rtol=0, atol=1e-6)


def test_a_text_past_the_models_length_is_cut_as_the_server_cuts_it(server: Served, embedder: Embedder) -> None:
    out = embedder({"text": np.asarray([LONG, "short"])})
    expected = served(server, [LONG, "short"], truncate_prompt_tokens=-1)
    np.testing.assert_allclose(out["embedding"], expected, rtol=0, atol=1e-6)


@pytest.mark.parametrize("to_format", [pd.DataFrame, pa.table], ids=["pandas", "pyarrow"])
def test_pandas_and_arrow_batches_get_the_same_vectors(embedder: Embedder, to_format: Any) -> None:
    expected = embedder({"text": np.asarray(TEXTS[:8])})["embedding"]
    out = embedder(to_format({"text": TEXTS[:8], "id": list(range(8))}))
    frame = out.to_pandas() if isinstance(out, pa.Table) else out
    np.testing.assert_array_equal(np.stack(frame["embedding"]).astype(np.float32), expected)
    assert frame["id"].tolist() == list(range(8))


def test_a_named_text_column_and_output_column(embedder: Embedder, model_dir: Path) -> None:
    named = Embedder(model_dir, compile="off", column="body", output_column="vector")
    out = named({"body": np.asarray(TEXTS[:3])})
    np.testing.assert_array_equal(out["vector"], embedder({"text": np.asarray(TEXTS[:3])})["embedding"])


def test_a_missing_column_names_the_columns_there(embedder: Embedder) -> None:
    with pytest.raises(ValueError, match=r"no column 'text' \(its columns: \['body', 'id'\]\).*column="):
        embedder({"body": np.asarray(["a"]), "id": np.asarray([1])})


def test_a_row_that_is_not_text_is_named(embedder: Embedder) -> None:
    with pytest.raises(ValueError, match="text 1 is a NoneType, not a string"):
        embedder({"text": np.asarray(["a", None], dtype=object)})


def test_an_empty_batch_gets_an_empty_column(embedder: Embedder) -> None:
    out = embedder({"text": np.asarray([], dtype=object)})
    assert out["embedding"].shape == (0, 384)


def test_an_unknown_prompt_name_lists_the_models_prompts(model_dir: Path) -> None:
    with pytest.raises(ValueError, match="prompt_name 'query' is not a prompt of this model"):
        Embedder(model_dir, compile="off", prompt_name="query")


@pytest.mark.parametrize("precision", ["bfloat16", "int8"])
def test_reduced_precisions_run_on_the_engines_precision(embedder: Embedder, model_dir: Path, precision: str) -> None:
    """The engine's own placement: int8 projections or bfloat16 compute (where the CPU has the instructions),
    near the float32 vectors."""
    if not (cpu_has_int8() if precision == "int8" else cpu_has(torch.bfloat16)):
        pytest.skip(f"this CPU has no {precision} instructions (the engine refuses it: another test's matter)")
    reduced = Embedder(model_dir, precision=precision, compile="off")  # type: ignore[arg-type]
    assert reduced.embedder.model.placement.precision == precision
    batch = {"text": np.asarray(TEXTS[:10])}
    cosines = np.sum(reduced(batch)["embedding"] * embedder(batch)["embedding"], axis=1)
    assert cosines.min() > 0.98
