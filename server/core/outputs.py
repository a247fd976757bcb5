"""Response arithmetic and encoding, run on the executor: vector maths, activations, base64, JSON."""

from __future__ import annotations

import base64
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import orjson

from server.core import fp8
from server.core.ids import random_hex
from server.http.errors import bad_request

if TYPE_CHECKING:
    from server.core.inputs import RequestContext


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


_ORDER = {"native": "=", "little": "<", "big": ">"}


def float_bytes(vector: np.ndarray, dtype: str = "float32", endianness: str = "little") -> bytes:
    """A vector's bytes in vLLM's `embed_dtype` (float32, float16, bfloat16, fp8_e4m3, fp8_e5m2) and
    `endianness`. bfloat16 is float32's upper half rounded to nearest even, as torch converts it."""
    order = _ORDER[endianness]
    values = np.asarray(vector, dtype=np.float32)
    if dtype in fp8.FORMATS:  # one byte a value: no order
        return fp8.codes(values, dtype).tobytes()
    if dtype == "bfloat16":
        bits = values.view(np.uint32).astype(np.uint64)
        rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16
        return rounded.astype(f"{order}u2").tobytes()
    return values.astype(f"{order}{'f2' if dtype == 'float16' else 'f4'}").tobytes()


def encode_vector(
    vector: np.ndarray, encoding_format: str, dtype: str = "float32", endianness: str = "little"
) -> np.ndarray | str:
    """base64 of the vector's bytes (little-endian float32 by default: what the openai client
    decodes), or the array: for to_json, or for raw_vectors (the RAW formats)."""
    if encoding_format == "base64":
        return base64.b64encode(float_bytes(vector, dtype, endianness)).decode("ascii")
    return vector


# int8/uint8 ranges: every dimension of a vector v quantized over [-R, R], R = INT8_RANGE * |v| / sqrt(d).
# For unit vectors that is one fixed range for every vector (dot products of the codes stay comparable
# across vectors), and never the batch's: a vector's codes do not depend on the other inputs.
# all-MiniLM-L6-v2, 300 texts: no component past 4.46 / sqrt(d); 5 kept the most top-10 neighbours
# (docs/api.md: the measurements behind it).
INT8_RANGE = 5.0


def int8_half_ranges(vectors: np.ndarray) -> np.ndarray:
    """R per vector (a column), as float32: sentence-transformers' ranges are [-R, R] in every dimension."""
    norms = np.linalg.norm(vectors.astype(np.float64), axis=1, keepdims=True)
    return (INT8_RANGE * norms / np.sqrt(vectors.shape[1])).astype(np.float32)


def quantized(vectors: np.ndarray, precision: str) -> np.ndarray:
    """sentence-transformers' quantize_embeddings arithmetic (float32, floor into 256 buckets), each
    vector with ranges [-R, R]; binary/ubinary pack the signs 8 to a byte, binary being ubinary - 128."""
    values = vectors.astype(np.float32)
    if precision in ("binary", "ubinary"):
        packed = np.packbits(values > 0, axis=1).astype(np.int32)
        return packed - 128 if precision == "binary" else packed
    half = int8_half_ranges(values)
    starts = -half
    steps = (half - starts) / np.float32(255)
    steps = np.where(steps == 0, np.float32(1), steps)
    codes = np.clip(np.floor((values - starts) / steps), 0, 255).astype(np.int32)
    return codes - 128 if precision == "int8" else codes


QUANTIZED = ("int8", "uint8", "binary", "ubinary")


def encode_vectors(
    vectors: np.ndarray, encoding_format: str, dtype: str = "float32", endianness: str = "little"
) -> list[Any]:
    """Each vector as an embedding surface answers it: floats, base64 of its bytes, or the codes of
    one of the QUANTIZED precisions (Cohere's embedding types, as sentence-transformers computes them)."""
    if encoding_format in QUANTIZED:
        return quantized(vectors, encoding_format).tolist()  # type: ignore[no-any-return]
    floats = vectors.astype(np.float32)
    return [encode_vector(v, encoding_format, dtype, endianness) for v in floats]


RAW = ("bytes", "bytes_only")  # vLLM's: the body is the vectors' bytes, not JSON


@dataclass(frozen=True)
class RawBody:
    """A rendered answer that is not JSON: its bytes, media type and headers."""

    content: bytes
    media_type: str = "application/octet-stream"
    headers: dict[str, str] = field(default_factory=dict)


def raw_vectors(
    vectors: Sequence[np.ndarray], encoding_format: str, dtype: str, endianness: str, meta: dict[str, Any]
) -> RawBody:
    """vLLM's `bytes` answer: each vector's bytes one after another; with `bytes` (not `bytes_only`) a
    `metadata` header holds `meta` (the surface's envelope) and, per vector, where its bytes are."""
    parts: list[bytes] = []
    items: list[dict[str, Any]] = []
    offset = 0
    for index, vector in enumerate(vectors):
        part = float_bytes(vector, dtype, endianness)
        shape = list(np.shape(vector))
        items.append(
            {
                "index": index,
                "embed_dtype": dtype,
                "endianness": endianness,
                "start": offset,
                "end": offset + len(part),
                "shape": shape,
            }
        )
        parts.append(part)
        offset += len(part)
    headers = {} if encoding_format == "bytes_only" else {"metadata": orjson.dumps({**meta, "data": items}).decode()}
    return RawBody(b"".join(parts), headers=headers)


JSON_FLOAT_BYTES = 16  # the most a float32 takes in to_json: 15 characters at most, and a comma
ENTRY_BYTES = 36  # the most one sparse weight takes: {"index":30521,"value":1.2345678e-05},


def to_json(body: Any) -> bytes:
    """orjson writes float32 arrays in their shortest round-trip form, ~10x faster than json."""
    return orjson.dumps(body, option=orjson.OPT_SERIALIZE_NUMPY)


def envelope(prefix: str, ctx: RequestContext, **fields: Any) -> dict[str, Any]:
    """vLLM's common response fields."""
    return {
        "id": f"{prefix}-{random_hex()}",
        "object": "list",
        "created": int(time.time()),
        "model": ctx.model_name,
        **fields,
    }
