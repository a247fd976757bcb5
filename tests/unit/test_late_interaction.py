"""Multi-vector (ColBERT) models give sentence-transformers' MultiVectorEncoder vectors for queries
and documents, and its MaxSim scores: a tiny random folder in PyLate's layout, in-process."""

from __future__ import annotations

import os

os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["HF_HUB_DISABLE_TELEMETRY"] = "1"
os.environ["DO_NOT_TRACK"] = "1"

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from common.modelfolder import read_model_folder
from common.settings import Settings
from engine.runtime.model import PoolingModel
from server.core.inputs import RequestContext
from server.core.services import ServedModel
from server.http.errors import APIError
from server.kinds import multi_vector
from tests.tiny_kinds import build_colbert, build_multi_vector_encoder, build_stanford_colbert
from tests.unit.pools import pool as pool_of

QUERIES = ["hello world", "what keeps the warm pool model loaded?", "naïve café 🙂", "the warm pool engine " * 8]
DOCUMENTS = ["Hello, world!", "the warm pool keeps models loaded; engines restart.", "a", "the model text " * 20]


@pytest.fixture(scope="module", params=["pylate", "pylate-masks-attended", "stanford", "multi-vector-encoder"])
def folder(request: pytest.FixtureRequest, model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("colbert")
    if request.param == "stanford":
        return build_stanford_colbert(root / "colbert", model_dir)
    if request.param == "multi-vector-encoder":
        return build_multi_vector_encoder(root / "colbert", model_dir)
    return build_colbert(root / "colbert", model_dir, attend_to_expansion_tokens=request.param.endswith("attended"))


LENGTHS = {"pylate": (12, 24, 16), "stanford": (10, 20, 8)}  # query length, document length, dimensions


def context(folder: Path) -> RequestContext:
    info = read_model_folder(folder)
    served = ServedModel("colbert", info, pool_of(folder, late=info.late), engine=None)  # type: ignore[arg-type]
    return RequestContext(model=served, served={"colbert": served}, settings=Settings())


def encoded(folder: Path, texts: list[str], role: multi_vector.Role) -> list[np.ndarray]:
    ctx = context(folder)
    tokens = multi_vector.tokenize(texts, ctx, role, truncate=-1)
    rows = PoolingModel(ctx.folder, threads=1).forward_tokens(tokens)
    return [multi_vector.kept(r, t, role, ctx) for r, t in zip(rows, tokens, strict=True)]


def reference(folder: Path) -> Any:
    from sentence_transformers import MultiVectorEncoder

    return MultiVectorEncoder(str(folder), device="cpu")


def lengths(folder: Path) -> tuple[int, int, int]:
    return LENGTHS["stanford" if (folder / "artifact.metadata").is_file() else "pylate"]


def test_a_colbert_folder_is_a_native_multi_vector_model(folder: Path) -> None:
    """PyLate's config (or Stanford's artifact.metadata) makes the folder a multi-vector model of
    its projection's dimensions per token, served natively, whose documents take at most
    document_length tokens."""
    info = read_model_folder(folder)
    query, document, dims = lengths(folder)
    assert (info.kind, info.dimensions, info.native, info.max_model_len) == ("multi-vector", dims, True, document)
    assert info.late is not None and info.late.query_length == query


@pytest.mark.parametrize("role", ["query", "document"])
def test_token_vectors_match_the_multi_vector_encoder(folder: Path, role: multi_vector.Role) -> None:
    """Each query's vectors (as many as its length, masks included) and each document's vectors
    without punctuation equal MultiVectorEncoder.encode_query / encode_document within 1e-5, texts
    cut at their length."""
    texts = QUERIES if role == "query" else DOCUMENTS
    got = encoded(folder, texts, role)
    model = reference(folder)
    expected = (model.encode_query if role == "query" else model.encode_document)(texts, convert_to_numpy=True)
    assert [g.shape for g in got] == [e.shape for e in expected]
    query, document, _ = lengths(folder)
    if role == "query":
        assert {g.shape[0] for g in got} == {query}
    else:
        assert got[0].shape[0] == 5 and got[-1].shape[0] == document  # [CLS] [D] hello world [SEP]; cut
    for g, e in zip(got, expected, strict=True):
        np.testing.assert_allclose(g, e, atol=1e-5)


def test_maxsim_matches_the_multi_vector_encoder(folder: Path) -> None:
    """MaxSim of every query against every document is MultiVectorEncoder.similarity's."""
    queries, documents = encoded(folder, QUERIES, "query"), encoded(folder, DOCUMENTS, "document")
    got = np.array([[multi_vector.maxsim(q, d) for d in documents] for q in queries])
    model = reference(folder)
    expected = model.similarity(model.encode_query(QUERIES), model.encode_document(DOCUMENTS)).numpy()
    np.testing.assert_allclose(got, expected, atol=1e-4)
    assert len({round(float(v), 3) for v in got.ravel()}) > 8  # the scores tell the pairs apart


def test_a_role_outside_query_and_document_is_a_400(folder: Path) -> None:
    """prompt_name or input_type naming neither role is refused, naming the field; none is a document."""
    ctx = context(folder)
    assert multi_vector.role_of(ctx) == "document"
    assert multi_vector.role_of(ctx, input_type="search_query") == "query"
    with pytest.raises(APIError) as refused:
        multi_vector.role_of(ctx, prompt_name="classification")
    assert refused.value.status == 400 and refused.value.param == "prompt_name"


def test_scoring_takes_a_permit_per_list_and_no_response_budget(folder: Path) -> None:
    """/score's token lists (each distinct query and document) each hold an admission permit, and
    the per-token response budget, meant for answers of vectors, does not refuse a score."""
    from server.core.admission import Admission
    from server.routes import score

    ctx = context(folder)
    ctx.admission = Admission(64, 0.0)
    ctx.settings = Settings(max_response_bytes=1024)
    tokens, _ = score.tokenize_pairs(QUERIES[:2] * 2, DOCUMENTS * 1, ctx, -1, ("text_1", "text_2"))
    assert len(tokens) == ctx.admitted == 2 + len(DOCUMENTS)
    with pytest.raises(APIError) as refused:  # the same inputs' vectors would not fit
        multi_vector.tokenize(DOCUMENTS, ctx, "document", truncate=-1)
    assert "WARMPOOL_MAX_RESPONSE_BYTES" in refused.value.message


def test_queries_leave_out_the_skiplist_where_the_model_says_so(model_dir: Path, tmp_path: Path) -> None:
    """A MultiVectorEncoder whose MultiVectorMask skips in queries too scores by MaxSim without the
    queries' punctuation vectors, as MultiVectorEncoder.similarity does."""
    import json

    from server.routes import score

    folder = build_multi_vector_encoder(tmp_path / "colbert", model_dir)
    mask = folder / "2_MultiVectorMask" / "config.json"
    mask.write_text(json.dumps({**json.loads(mask.read_text()), "skiplist_tasks": ["query", "document"]}))
    ctx = context(folder)
    queries = ["what, exactly, keeps the pool warm?"]
    tokens, pairs = score.tokenize_pairs(queries * len(DOCUMENTS), DOCUMENTS, ctx, -1, ("text_1", "text_2"))
    got = score.pair_scores(
        np.array(PoolingModel(ctx.folder, threads=1).forward_tokens(tokens), dtype=object), pairs, ctx
    )
    model = reference(folder)
    expected = model.similarity(model.encode_query(queries), model.encode_document(DOCUMENTS)).numpy()[0]
    np.testing.assert_allclose(got, expected, atol=1e-4)
