"""Compact dense vectors on every embedding surface: float, base64, and Cohere's int8, uint8, binary
and ubinary, each equal to sentence-transformers' quantize_embeddings on the surface's float vectors
(int8/uint8 with each vector's ranges [-R, R], R = INT8_RANGE * |v| / sqrt(d), passed as `ranges`)."""

from __future__ import annotations

import base64
import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from sentence_transformers.util.quantization import quantize_embeddings

from server.core.outputs import INT8_RANGE
from tests.app.inprocess import serving
from tests.conftest import VERTEX_PREDICT
from tests.server_process import Served

TEXTS = ["A man is eating food.", "Ein Mann isst Essen.", "", "Paris is the capital of France.", "🚀 café"]
ENCODINGS = ["float", "base64", "int8", "uint8", "binary", "ubinary"]
TORCH_DTYPES = {
    "float32": torch.float32,
    "float16": torch.float16,
    "bfloat16": torch.bfloat16,
    "fp8_e4m3": torch.float8_e4m3fn,
    "fp8_e5m2": torch.float8_e5m2,
}


def openai(path: str) -> Callable[[Served, str, int | None], list[Any]]:
    def ask(server: Served, encoding: str, dimensions: int | None) -> list[Any]:
        body = {"input": TEXTS, "encoding_format": encoding, "dimensions": dimensions}
        answer = server.post(path, json=body)
        assert answer.status_code == 200, answer.text
        return [d["embedding"] for d in answer.json()["data"]]

    return ask


def tei(server: Served, encoding: str, dimensions: int | None) -> list[Any]:
    answer = server.post("/embed", json={"inputs": TEXTS, "encoding_format": encoding, "dimensions": dimensions})
    assert answer.status_code == 200, answer.text
    return answer.json()  # type: ignore[no-any-return]


def cohere(version: str) -> Callable[[Served, str, int | None], list[Any]]:
    def ask(server: Served, encoding: str, dimensions: int | None) -> list[Any]:
        body = {"texts": TEXTS, "embedding_types": [encoding], "output_dimension": dimensions}
        answer = server.post(f"/{version}/embed", json=body)
        assert answer.status_code == 200, answer.text
        return answer.json()["embeddings"][encoding]  # type: ignore[no-any-return]

    return ask


SURFACES = {
    "openai": openai("/v1/embeddings"),
    "infinity": openai("/embeddings"),
    "tei": tei,
    "cohere-v1": cohere("v1"),
    "cohere-v2": cohere("v2"),
}


def ranges(vector: np.ndarray) -> np.ndarray:
    half = np.float32(INT8_RANGE * np.linalg.norm(vector.astype(np.float64)) / np.sqrt(vector.shape[0]))
    return np.stack([np.full(vector.shape, -half), np.full(vector.shape, half)])


def expected(floats: np.ndarray, encoding: str) -> list[Any]:
    """sentence-transformers' answer for each vector alone (its ranges never the batch's)."""
    if encoding == "float":
        return floats.tolist()  # type: ignore[no-any-return]
    if encoding == "base64":
        return [base64.b64encode(v.astype("<f4").tobytes()).decode() for v in floats]
    if encoding in ("binary", "ubinary"):
        return quantize_embeddings(floats, encoding).tolist()  # type: ignore[union-attr,no-any-return]
    return [quantize_embeddings(v[None], encoding, ranges=ranges(v))[0].tolist() for v in floats]  # type: ignore[index]


@pytest.fixture(scope="module")
def reference(server: Served) -> dict[int | None, np.ndarray]:
    """/v1/embeddings' float vectors, whole and cut to 128 dimensions."""
    return {d: np.array(openai("/v1/embeddings")(server, "float", d), dtype=np.float32) for d in (None, 128)}


@pytest.mark.parametrize("dimensions", [None, 128])
@pytest.mark.parametrize("encoding", ENCODINGS)
@pytest.mark.parametrize("surface", SURFACES)
def test_every_encoding_on_every_surface_is_sentence_transformers(
    server: Served, reference: dict[int | None, np.ndarray], surface: str, encoding: str, dimensions: int | None
) -> None:
    floats = reference[dimensions]
    got = SURFACES[surface](server, encoding, dimensions)
    if encoding == "float":  # JSON's shortest float32 forms, read back as float32
        got = np.array(got, dtype=np.float32).tolist()
    assert got == expected(floats, encoding)


@pytest.fixture(scope="module")
def vertex_server(model_dir: Path) -> Iterator[Served]:
    with serving(model_dir, predict_route=VERTEX_PREDICT) as app:
        yield app


def test_vertex_parameters_take_tei_encoding(vertex_server: Served) -> None:
    """Vertex's `parameters` are TEI's /embed options: encoding_format among them."""
    floats = np.array(tei(vertex_server, "float", None), dtype=np.float32)
    answer = vertex_server.post(VERTEX_PREDICT, json={"instances": TEXTS, "parameters": {"encoding_format": "int8"}})
    assert answer.status_code == 200, answer.text
    assert answer.json()["predictions"] == expected(floats, "int8")


def test_a_vector_does_not_depend_on_its_batch(server: Served) -> None:
    """int8 codes of a text alone equal its codes among others."""
    alone = server.post("/v1/embeddings", json={"input": TEXTS[0], "encoding_format": "int8"}).json()["data"]
    among = server.post("/v1/embeddings", json={"input": TEXTS, "encoding_format": "int8"}).json()["data"]
    assert alone[0]["embedding"] == among[0]["embedding"]


@pytest.mark.parametrize("path", ["/v1/embeddings", "/pooling"])
@pytest.mark.parametrize(
    ("dtype", "endianness"),
    [("float16", "little"), ("bfloat16", "big"), ("float32", "big"), ("fp8_e4m3", "big"), ("fp8_e5m2", "little")],
)
def test_vllm_embed_dtype_and_endianness(server: Served, path: str, dtype: str, endianness: str) -> None:
    """vLLM's embed_dtype and endianness: base64 of the floats as torch converts them."""
    floats = server.post(path, json={"input": TEXTS}).json()["data"]
    body = {"input": TEXTS, "encoding_format": "base64", "embed_dtype": dtype, "endianness": endianness}
    answer = server.post(path, json=body).json()["data"]
    key = "embedding" if path == "/v1/embeddings" else "data"
    for got, want in zip(answer, floats, strict=True):
        as_torch = torch.tensor(want[key], dtype=torch.float32).to(TORCH_DTYPES[dtype])
        raw = as_torch.view({1: torch.uint8, 2: torch.int16, 4: torch.int32}[as_torch.itemsize]).numpy()
        order = ">" if endianness == "big" else "<"
        assert base64.b64decode(got[key]) == raw.astype(raw.dtype.newbyteorder(order)).tobytes()


def raw_vectors(body: bytes, items: list[dict[str, Any]]) -> list[torch.Tensor]:
    """vLLM's client-side decoding of a `bytes` answer (its examples' decode_pooling_output)."""
    vectors = []
    for item in items:
        dtype = TORCH_DTYPES[item["embed_dtype"]]
        view = {1: np.uint8, 2: np.int16, 4: np.int32}[dtype.itemsize]
        raw = np.frombuffer(body[item["start"] : item["end"]], dtype=view)
        if item["endianness"] == "big":
            raw = raw.byteswap()
        vectors.append(torch.from_numpy(raw.copy()).view(dtype).reshape(item["shape"]))
    return vectors


@pytest.mark.parametrize(("path", "key"), [("/v1/embeddings", "embedding"), ("/pooling", "data"), ("/embed", None)])
@pytest.mark.parametrize(("dtype", "endianness"), [("float32", "little"), ("bfloat16", "big"), ("fp8_e4m3", "native")])
def test_vllm_bytes_are_the_vectors_with_their_metadata(
    server: Served, path: str, key: str | None, dtype: str, endianness: str
) -> None:
    """encoding_format bytes: the body is the vectors' bytes, the `metadata` header says where each is."""
    field = "inputs" if key is None else "input"
    floats = server.post(path, json={field: TEXTS}).json()
    floats = floats if key is None else [d[key] for d in floats["data"]]
    body = {field: TEXTS, "encoding_format": "bytes", "embed_dtype": dtype, "endianness": endianness}
    answer = server.post(path, json=body)
    assert answer.status_code == 200, answer.text
    assert answer.headers["content-type"] == "application/octet-stream"
    metadata = json.loads(answer.headers["metadata"])
    if key is not None:  # vLLM's envelope beside the items
        assert metadata["model"] and metadata["usage"]["prompt_tokens"] > 0
    got = raw_vectors(answer.content, metadata["data"])
    want = [torch.tensor(v, dtype=torch.float32).to(TORCH_DTYPES[dtype]) for v in floats]
    assert all(torch.equal(g.view(torch.uint8), w.view(torch.uint8)) for g, w in zip(got, want, strict=True))


def test_vllm_bytes_only_has_no_metadata(server: Served) -> None:
    with_metadata = server.post("/v1/embeddings", json={"input": TEXTS, "encoding_format": "bytes"})
    bare = server.post("/v1/embeddings", json={"input": TEXTS, "encoding_format": "bytes_only"})
    assert bare.status_code == 200 and "metadata" not in bare.headers
    assert bare.content == with_metadata.content


def test_vertex_refuses_raw_bytes(vertex_server: Served) -> None:
    answer = vertex_server.post(VERTEX_PREDICT, json={"instances": TEXTS, "parameters": {"encoding_format": "bytes"}})
    assert answer.status_code == 400 and "encoding_format" in answer.json()["error"], answer.text


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"encoding_format": "int8", "embed_dtype": "float16"}, "embed_dtype"),
        ({"encoding_format": "int4"}, "encoding_format"),
        ({"encoding_format": "base64", "embed_dtype": "float64"}, "embed_dtype"),
    ],
)
def test_encodings_that_cannot_apply_are_400(server: Served, body: dict[str, Any], field: str) -> None:
    answer = server.post("/v1/embeddings", json={"input": TEXTS, **body})
    assert answer.status_code == 400 and answer.json()["error"]["param"] == field, answer.text
