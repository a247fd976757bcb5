"""TEI's gRPC API (WARMPOOL_GRPC_PORT) on the in-process app, called through TEI's own client stubs:
generated from TEI's proto by grpcio-tools into a temporary folder (not warmpool's messages), so the
wire is TEI's. Each RPC answers what its HTTP route answers; errors are TEI's status codes; the API
key is checked from the `authorization` metadata; health and reflection answer."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from server.grpc.calls import LOOP_CHARS
from tests.app.inprocess import InProcessServer, serving
from tests.conftest import API_KEY
from tests.server_process import free_port
from tests.tei_grpc import tei_stubs
from tests.tiny_kinds import build_splade

TEXTS = ["Hello world, the warm pool model", "a", "naïve café 🙂", "the fourth text", "and a fifth"]
KEY = [("authorization", f"Bearer {API_KEY}")]
TIMEOUT_S = 60.0


@pytest.fixture(scope="module")
def tei(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    with tei_stubs(tmp_path_factory.mktemp("tei_stubs")) as stubs:
        yield stubs


@pytest.fixture(scope="module")
def embedder(model_dir: Path) -> Iterator[InProcessServer]:
    """An embedding model behind an API key, with gRPC on."""
    with serving(model_dir, grpc_port=free_port(), api_key=API_KEY) as app:
        app.client.headers["authorization"] = f"Bearer {API_KEY}"
        yield app


@pytest.fixture(scope="module")
def scorers(
    classifier_dir: Path, cross_encoder_dir: Path, model_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[InProcessServer]:
    """A classifier, a cross-encoder and a SPLADE model behind one port: TEI's routes (and RPCs) pick
    the model of their kind."""
    splade = build_splade(tmp_path_factory.mktemp("splade") / "splade", model_dir)
    models = f"clf={classifier_dir},rerank={cross_encoder_dir},splade={splade}"
    with serving(model_dir, models=models, grpc_port=free_port()) as app:
        yield app


def channel(app: InProcessServer) -> grpc.Channel:
    return grpc.insecure_channel(f"127.0.0.1:{app.services.settings.grpc_port}")


def http(app: InProcessServer, path: str, body: dict[str, Any]) -> Any:
    response = app.client.post(path, json=body)
    assert response.status_code == 200, response.text
    return response.json()


def failed(call: Any, *args: Any, **kwargs: Any) -> grpc.RpcError:
    with pytest.raises(grpc.RpcError) as raised:
        call(*args, timeout=TIMEOUT_S, **kwargs)
    return raised.value


# Embed, EmbedAll, Tokenize, Decode, Info (an embedding model)


def test_embed_answers_as_http_embed(embedder: InProcessServer, tei: Any) -> None:
    with channel(embedder) as ch:
        got = tei.rpc.EmbedStub(ch).Embed(tei.pb.EmbedRequest(inputs=TEXTS[0]), metadata=KEY, timeout=TIMEOUT_S)
    expected = http(embedder, "/embed", {"inputs": TEXTS[0]})[0]
    np.testing.assert_array_equal(np.array(got.embeddings, np.float32), np.array(expected, np.float32))
    assert got.metadata.compute_tokens > 0 and got.metadata.compute_chars == len(TEXTS[0])
    assert got.metadata.total_time_ns >= got.metadata.inference_time_ns > 0


def test_embed_stream_answers_each_message_in_order(embedder: InProcessServer, tei: Any) -> None:
    requests = [tei.pb.EmbedRequest(inputs=t, normalize=False) for t in TEXTS]
    with channel(embedder) as ch:
        answers = list(tei.rpc.EmbedStub(ch).EmbedStream(iter(requests), metadata=KEY, timeout=TIMEOUT_S))
    expected = http(embedder, "/embed", {"inputs": TEXTS, "normalize": False})
    got = np.array([a.embeddings for a in answers], np.float32)
    np.testing.assert_allclose(got, np.array(expected, np.float32), atol=1e-5, rtol=0)


@pytest.mark.parametrize(("chars", "on_executor"), [(LOOP_CHARS, False), (LOOP_CHARS + 1, True)])
def test_only_a_long_texts_embed_is_prepared_on_the_executor(
    embedder: InProcessServer, tei: Any, monkeypatch: pytest.MonkeyPatch, chars: int, on_executor: bool
) -> None:
    """A short text's executor hop would cost more CPU than its tokenizing: it is prepared on the loop."""
    executor, ran = embedder.services.executor, []
    submit = executor.submit

    def recorded(fn: Any, *args: Any, **kwargs: Any) -> Any:
        ran.append(getattr(getattr(fn, "func", fn), "__name__", ""))
        return submit(fn, *args, **kwargs)

    monkeypatch.setattr(executor, "submit", recorded)
    request = tei.pb.EmbedRequest(inputs=("word " * chars)[:chars], truncate=True)
    with channel(embedder) as ch:
        got = tei.rpc.EmbedStub(ch).Embed(request, metadata=KEY, timeout=TIMEOUT_S)
    assert len(got.embeddings) > 0
    assert ("at_priority" in ran) == on_executor  # pipeline.at_priority: the prepare the executor runs


def test_without_the_result_cache_a_short_texts_embed_never_leaves_the_loop(
    model_dir: Path, tei: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Prepared and rendered on the loop (the cache, when on, renders on the executor where it
    stores its rows): the answer is HTTP's, and the executor ran nothing for it."""
    with serving(model_dir, grpc_port=free_port(), cache_bytes="0") as app:
        executor, ran = app.services.executor, []
        submit = executor.submit

        def recorded(fn: Any, *args: Any, **kwargs: Any) -> Any:
            ran.append(getattr(getattr(fn, "func", fn), "__name__", ""))
            return submit(fn, *args, **kwargs)

        monkeypatch.setattr(executor, "submit", recorded)
        with channel(app) as ch:
            got = tei.rpc.EmbedStub(ch).Embed(tei.pb.EmbedRequest(inputs=TEXTS[0]), timeout=TIMEOUT_S)
        assert {"at_priority", "_finish"}.isdisjoint(ran)
        expected = http(app, "/embed", {"inputs": TEXTS[0]})[0]
    np.testing.assert_array_equal(np.array(got.embeddings, np.float32), np.array(expected, np.float32))


def test_embed_all_answers_as_http_embed_all(embedder: InProcessServer, tei: Any) -> None:
    with channel(embedder) as ch:
        got = tei.rpc.EmbedStub(ch).EmbedAll(tei.pb.EmbedAllRequest(inputs=TEXTS[2]), metadata=KEY, timeout=TIMEOUT_S)
    expected = np.array(http(embedder, "/embed_all", {"inputs": TEXTS[2]})[0], np.float32)
    np.testing.assert_array_equal(np.array([t.embeddings for t in got.token_embeddings], np.float32), expected)


def test_tokenize_and_its_stream_answer_as_http_tokenize(embedder: InProcessServer, tei: Any) -> None:
    with channel(embedder) as ch:
        stub = tei.rpc.TokenizeStub(ch)
        one = stub.Tokenize(tei.pb.EncodeRequest(inputs=TEXTS[2], add_special_tokens=True), metadata=KEY)
        streamed = list(stub.TokenizeStream(iter([tei.pb.EncodeRequest(inputs=t) for t in TEXTS[:2]]), metadata=KEY))
    expected = http(embedder, "/tokenize", {"inputs": TEXTS[2]})[0]

    def as_dicts(answer: Any) -> list[dict[str, Any]]:
        return [
            {
                "id": t.id,
                "text": t.text,
                "special": t.special,
                "start": t.start if t.HasField("start") else None,
                "stop": t.stop if t.HasField("stop") else None,
            }
            for t in answer.tokens
        ]

    assert as_dicts(one) == expected
    assert [as_dicts(a) for a in streamed] == http(
        embedder, "/tokenize", {"inputs": TEXTS[:2], "add_special_tokens": False}
    )


def test_decode_answers_as_http_decode(embedder: InProcessServer, tei: Any) -> None:
    ids = [101, 7592, 2088, 102]
    with channel(embedder) as ch:
        got = tei.rpc.TokenizeStub(ch).Decode(tei.pb.DecodeRequest(ids=ids, skip_special_tokens=True), metadata=KEY)
    assert got.text == http(embedder, "/decode", {"ids": ids})[0]


def test_info_describes_the_model(embedder: InProcessServer, tei: Any) -> None:
    with channel(embedder) as ch:
        got = tei.rpc.InfoStub(ch).Info(tei.pb.InfoRequest(), metadata=KEY, timeout=TIMEOUT_S)
    expected = embedder.client.get("/info").json()
    assert got.model_type == tei.pb.MODEL_TYPE_EMBEDDING
    assert (got.model_id, got.max_input_length, got.max_client_batch_size) == (
        expected["model_id"],
        expected["max_input_length"],
        expected["max_client_batch_size"],
    )


# Errors and the API key


def test_empty_inputs_are_invalid_argument_with_teis_message(embedder: InProcessServer, tei: Any) -> None:
    with channel(embedder) as ch:
        error = failed(tei.rpc.EmbedStub(ch).Embed, tei.pb.EmbedRequest(inputs=""), metadata=KEY)
    assert (error.code(), error.details()) == (grpc.StatusCode.INVALID_ARGUMENT, "`inputs` cannot be empty")


def test_too_long_without_truncate_is_invalid_argument(embedder: InProcessServer, tei: Any) -> None:
    with channel(embedder) as ch:
        error = failed(tei.rpc.EmbedStub(ch).Embed, tei.pb.EmbedRequest(inputs="word " * 2000), metadata=KEY)
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT, error.details()


def test_a_route_the_model_does_not_serve_is_failed_precondition(embedder: InProcessServer, tei: Any) -> None:
    with channel(embedder) as ch:
        error = failed(tei.rpc.PredictStub(ch).Predict, tei.pb.PredictRequest(inputs="hi"), metadata=KEY)
    assert error.code() == grpc.StatusCode.FAILED_PRECONDITION, error.details()


def test_a_failed_stream_message_ends_the_stream_with_its_status(embedder: InProcessServer, tei: Any) -> None:
    requests = [tei.pb.EmbedRequest(inputs="fine"), tei.pb.EmbedRequest(inputs="")]
    with channel(embedder) as ch, pytest.raises(grpc.RpcError) as raised:
        list(tei.rpc.EmbedStub(ch).EmbedStream(iter(requests), metadata=KEY, timeout=TIMEOUT_S))
    assert raised.value.code() == grpc.StatusCode.INVALID_ARGUMENT


def test_a_bad_priority_metadata_is_invalid_argument(embedder: InProcessServer, tei: Any) -> None:
    metadata = [*KEY, ("x-priority", "soon")]
    with channel(embedder) as ch:
        error = failed(tei.rpc.EmbedStub(ch).Embed, tei.pb.EmbedRequest(inputs="hi"), metadata=metadata)
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT, error.details()


def test_without_the_api_key_calls_are_unauthenticated(embedder: InProcessServer, tei: Any) -> None:
    with channel(embedder) as ch:
        error = failed(tei.rpc.EmbedStub(ch).Embed, tei.pb.EmbedRequest(inputs="hi"))
        wrong = failed(tei.rpc.EmbedStub(ch).Embed, tei.pb.EmbedRequest(inputs="hi"), metadata=[("authorization", "x")])
    assert error.code() == wrong.code() == grpc.StatusCode.UNAUTHENTICATED


def test_without_the_api_key_streams_are_unauthenticated(embedder: InProcessServer, tei: Any) -> None:
    with channel(embedder) as ch, pytest.raises(grpc.RpcError) as raised:
        list(tei.rpc.EmbedStub(ch).EmbedStream(iter([tei.pb.EmbedRequest(inputs="hi")]), timeout=TIMEOUT_S))
    assert raised.value.code() == grpc.StatusCode.UNAUTHENTICATED


# Health and reflection


def test_health_is_serving_once_the_model_is_ready(embedder: InProcessServer) -> None:
    request = health_pb2.HealthCheckRequest(service="tei.v1.Embed")
    with channel(embedder) as ch:
        stub = health_pb2_grpc.HealthStub(ch)
        watched = stub.Watch(request, timeout=TIMEOUT_S)  # answers at once, then on each change: no polling
        status = next(s.status for s in watched if s.status == health_pb2.HealthCheckResponse.SERVING)
        watched.cancel()
    assert status == health_pb2.HealthCheckResponse.SERVING


def test_reflection_lists_teis_services(embedder: InProcessServer) -> None:
    ask = reflection_pb2.ServerReflectionRequest(list_services="")
    with channel(embedder) as ch:
        (answer,) = reflection_pb2_grpc.ServerReflectionStub(ch).ServerReflectionInfo(iter([ask]), timeout=TIMEOUT_S)
    names = {s.name for s in answer.list_services_response.service}
    assert {"tei.v1.Embed", "tei.v1.Predict", "tei.v1.Rerank", "tei.v1.Tokenize", "tei.v1.Info"} <= names


# Predict, Rerank, EmbedSparse (a classifier, a cross-encoder and a SPLADE model)


def predictions(answer: Any) -> list[tuple[str, float]]:
    return [(p.label, round(p.score, 5)) for p in answer.predictions]


def test_predict_and_its_stream_answer_as_http_predict(scorers: InProcessServer, tei: Any) -> None:
    with channel(scorers) as ch:
        stub = tei.rpc.PredictStub(ch)
        one = stub.Predict(tei.pb.PredictRequest(inputs=TEXTS[0]), timeout=TIMEOUT_S)
        streamed = list(stub.PredictStream(iter([tei.pb.PredictRequest(inputs=t) for t in TEXTS]), timeout=TIMEOUT_S))
    expected = http(scorers, "/predict", {"inputs": [[t] for t in TEXTS]})
    rounded = [[(p["label"], round(p["score"], 5)) for p in labels] for labels in expected]
    assert predictions(one) == rounded[0]
    assert [predictions(a) for a in streamed] == rounded


def test_predict_pair_answers_as_http_predict_of_a_pair(scorers: InProcessServer, tei: Any) -> None:
    pair = TEXTS[:2]
    with channel(scorers) as ch:
        got = tei.rpc.PredictStub(ch).PredictPair(tei.pb.PredictPairRequest(inputs=pair), timeout=TIMEOUT_S)
        error = failed(tei.rpc.PredictStub(ch).PredictPair, tei.pb.PredictPairRequest(inputs=TEXTS[:3]))
    expected = http(scorers, "/predict", {"inputs": pair})
    assert predictions(got) == [(p["label"], round(p["score"], 5)) for p in expected]
    assert (error.code(), error.details()) == (
        grpc.StatusCode.INVALID_ARGUMENT,
        "`inputs` must have a single or two elements. Given: 3",
    )


def test_rerank_and_its_stream_answer_as_http_rerank(scorers: InProcessServer, tei: Any) -> None:
    query, texts = "warm pool", TEXTS
    with channel(scorers) as ch:
        stub = tei.rpc.RerankStub(ch)
        one = stub.Rerank(tei.pb.RerankRequest(query=query, texts=texts, return_text=True), timeout=TIMEOUT_S)
        pairs = iter([tei.pb.RerankStreamRequest(query=query, text=t) for t in texts])
        streamed = stub.RerankStream(pairs, timeout=TIMEOUT_S)
    expected = http(scorers, "/rerank", {"query": query, "texts": texts, "return_text": True})
    assert [(r.index, round(r.score, 5), r.text) for r in one.ranks] == [
        (e["index"], round(e["score"], 5), e["text"]) for e in expected
    ]
    assert [(r.index, round(r.score, 5)) for r in streamed.ranks] == [
        (e["index"], round(e["score"], 5)) for e in expected
    ]


def test_rerank_of_no_texts_is_invalid_argument(scorers: InProcessServer, tei: Any) -> None:
    with channel(scorers) as ch:
        error = failed(tei.rpc.RerankStub(ch).Rerank, tei.pb.RerankRequest(query="q"))
    assert (error.code(), error.details()) == (grpc.StatusCode.INVALID_ARGUMENT, "`texts` cannot be empty")


def test_embed_sparse_answers_as_http_embed_sparse(scorers: InProcessServer, tei: Any) -> None:
    with channel(scorers) as ch:
        stub = tei.rpc.EmbedStub(ch)
        one = stub.EmbedSparse(tei.pb.EmbedSparseRequest(inputs=TEXTS[0]), timeout=TIMEOUT_S)
        streamed = list(stub.EmbedSparseStream(iter([tei.pb.EmbedSparseRequest(inputs=t) for t in TEXTS[:2]])))
    expected = http(scorers, "/embed_sparse", {"inputs": TEXTS[:2]})

    def same(answer: Any, row: list[dict[str, Any]]) -> None:
        assert [v.index for v in answer.sparse_embeddings] == [e["index"] for e in row]
        got = np.array([v.value for v in answer.sparse_embeddings], np.float32)
        np.testing.assert_allclose(got, np.array([e["value"] for e in row], np.float32), atol=1e-5, rtol=0)

    same(one, expected[0])
    for answer, row in zip(streamed, expected, strict=True):
        same(answer, row)


@pytest.fixture(scope="module")
def keyed(model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[InProcessServer]:
    """Tenants of a keys file, with gRPC on: its calls are checked as HTTP's requests are."""
    keys = {
        "tenants": {
            "search": {"keys": ["search-key"], "scopes": ["inference"]},
            "ops": {"keys": ["ops-key"], "scopes": ["admin", "metrics"]},
            "tiny": {"keys": ["tiny-key"], "scopes": ["inference"], "quota": {"tokens_per_minute": 5}},
        }
    }
    path = tmp_path_factory.mktemp("secrets") / "keys.json"
    path.write_text(json.dumps(keys))
    with serving(model_dir, grpc_port=free_port(), api_keys_file=path) as app:
        yield app


@pytest.mark.parametrize(
    ("key", "code"),
    [
        ("search-key", None),
        ("ops-key", grpc.StatusCode.PERMISSION_DENIED),  # no `inference` scope
        ("tiny-key", grpc.StatusCode.RESOURCE_EXHAUSTED),  # more tokens than its minute
        ("nobody", grpc.StatusCode.UNAUTHENTICATED),
    ],
)
def test_tenants_scopes_and_quotas_hold_on_grpc(keyed: InProcessServer, tei: Any, key: str, code: Any) -> None:
    request = tei.pb.EmbedRequest(inputs="a sentence of more than five tokens, surely")
    metadata = [("authorization", f"Bearer {key}")]
    with channel(keyed) as ch:
        if code is None:
            assert tei.rpc.EmbedStub(ch).Embed(request, metadata=metadata, timeout=TIMEOUT_S).embeddings
        else:
            assert failed(tei.rpc.EmbedStub(ch).Embed, request, metadata=metadata).code() == code
