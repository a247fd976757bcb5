"""Response arithmetic and encoding, run on the executor: vector maths, activations, base64, JSON."""

from __future__ import annotations

import base64
from typing import Any

import numpy as np
import orjson

from server.http.errors import bad_request


def normalize(vectors: np.ndarray) -> np.ndarray:
    norms = np.linalg.norm(vectors, axis=1, keepdims=True)
    return (vectors / np.maximum(norms, 1e-12)).astype(np.float32)


def embeddings(vectors: np.ndarray, dimensions: int | None, norm: bool) -> np.ndarray:
    """Pooled vectors as the model's modules define them, truncated to `dimensions` (Matryoshka)."""
    if dimensions is not None:
        if dimensions > vectors.shape[1]:
            raise bad_request(
                f"dimensions={dimensions} is larger than the model's {vectors.shape[1]}",
                "dimensions",
            )
        vectors = vectors[:, :dimensions]
        norm = True
    return normalize(vectors) if norm else vectors.astype(np.float32)


def scores(logits: np.ndarray, raw: bool = False) -> np.ndarray:
    """The head's logits as float64 when `raw` (TEI's raw_scores), else activated."""
    return logits.astype(np.float64) if raw else activate(logits)


def activate(logits: np.ndarray) -> np.ndarray:
    """Softmax over the labels; a single-label head (cross-encoder) gets a sigmoid, as vLLM does."""
    logits = logits.astype(np.float64)
    if logits.shape[1] == 1:
        return 1.0 / (1.0 + np.exp(-logits))
    shifted = np.exp(logits - logits.max(axis=1, keepdims=True))
    return shifted / shifted.sum(axis=1, keepdims=True)


def encode_vector(vector: np.ndarray, encoding_format: str) -> np.ndarray | str:
    """base64 of little-endian float32 (what the openai client decodes), or the array for to_json."""
    if encoding_format == "base64":
        return base64.b64encode(vector.astype("<f4").tobytes()).decode("ascii")
    return vector


JSON_FLOAT_BYTES = 16  # the most a float32 takes in to_json: 15 characters at most, and a comma
ENTRY_BYTES = 36  # the most one sparse weight takes: {"index":30521,"value":1.2345678e-05},


def to_json(body: Any) -> bytes:
    """orjson writes float32 arrays in their shortest round-trip form, ~10x faster than json."""
    return orjson.dumps(body, option=orjson.OPT_SERIALIZE_NUMPY)


def quantize(vectors: np.ndarray, kind: str) -> list[Any]:
    """Cohere's embedding types. binary/ubinary pack the signs 8 to a byte, as Cohere and
    sentence-transformers' quantize_embeddings do (binary is ubinary less 128). int8/uint8 scale
    each vector by its largest magnitude to the full range, so no calibration set is needed and
    cosine similarity is kept to within the rounding."""
    if kind == "float":
        return [v for v in vectors.astype(np.float32)]
    if kind == "base64":
        return [encode_vector(v, "base64") for v in vectors]
    if kind in ("binary", "ubinary"):
        packed = np.packbits(vectors > 0, axis=1).astype(np.int32)
        return (packed - 128 if kind == "binary" else packed).tolist()  # type: ignore[no-any-return]
    scale = 127.0 / np.maximum(np.abs(vectors).max(axis=1, keepdims=True), 1e-12)
    signed = np.clip(np.rint(vectors * scale), -128, 127).astype(np.int32)
    return (signed + 128 if kind == "uint8" else signed).tolist()  # type: ignore[no-any-return]
