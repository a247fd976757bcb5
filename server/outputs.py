"""Response arithmetic and encoding, run on the executor: vector maths, activations, base64, JSON."""

from __future__ import annotations

import base64
from typing import Any

import numpy as np
import orjson

from server.errors import bad_request


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


def to_json(body: Any) -> bytes:
    """orjson writes float32 arrays in their shortest round-trip form, ~10x faster than json."""
    return orjson.dumps(body, option=orjson.OPT_SERIALIZE_NUMPY)
