"""WARMPOOL_DTYPE on the CPU behind a real server: int8 serves vectors close to float32's; bfloat16 and
float16 serve close to float32 where the CPU has instructions for them and fail the engine phase,
saying why, where it has not."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from engine.runtime.device import DTYPES, cpu_has, cpu_has_int8
from tests.server_process import ServerProcess
from tests.vectors import TEXTS, cosines


def served_vectors(server: ServerProcess) -> np.ndarray:
    r = server.post("/v1/embeddings", json={"input": TEXTS})
    assert r.status_code == 200, r.text
    return np.asarray([d["embedding"] for d in r.json()["data"]])


@pytest.fixture(scope="module")
def float32_vectors(model_dir: Path) -> np.ndarray:
    from sentence_transformers import SentenceTransformer

    return SentenceTransformer(str(model_dir), device="cpu").encode(TEXTS)  # type: ignore[no-any-return]


def test_int8_serves_vectors_close_to_float32(model_dir: Path, tmp_path: Path, float32_vectors: np.ndarray) -> None:
    """With WARMPOOL_DTYPE=int8 the engines (built once in the forkserver) report int8 and what was
    quantized, and serve vectors of cosine >= 0.98 each and >= 0.995 on average to float32's; on a CPU
    without int8 dot-product instructions the engine phase fails saying so, and nothing is served."""
    server = ServerProcess(model_dir, tmp_path / "server.log", dtype="int8", fail_linger=2)
    if not cpu_has_int8():
        try:
            failed = server.wait_failed()
            assert [p["name"] for p in failed] == ["engine"]
            assert "dtype int8: this CPU has no int8 dot-product instructions" in failed[0]["detail"]["error"]
            assert server.post("/v1/embeddings", json={"input": "x"}).status_code == 503
        finally:
            server.stop()
        return
    server.wait_ready()
    try:
        detail = server.phase("engine")["detail"]
        got = served_vectors(server)
    finally:
        assert server.stop() == 0
    assert detail["dtype"] == "int8" and detail["weights"] == "forkserver"
    assert detail["quantization"].startswith("int8 dynamic: 24 projections")
    cosine = cosines(got, float32_vectors)
    assert cosine.min() >= 0.98 and cosine.mean() >= 0.995 and not np.allclose(got, float32_vectors, atol=1e-5)


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_a_half_dtype_serves_where_the_cpu_has_it_and_fails_its_phase_where_not(
    model_dir: Path, tmp_path: Path, float32_vectors: np.ndarray, dtype: str
) -> None:
    """bfloat16 and float16: where this CPU has instructions for the dtype, served vectors have cosine
    >= 0.999 to float32's; where it has not, the engine phase fails with a one-line message naming the
    dtype, and nothing is served."""
    server = ServerProcess(model_dir, tmp_path / "server.log", dtype=dtype, fail_linger=2)
    try:
        if cpu_has(DTYPES[dtype]):
            server.wait_ready()
            assert server.phase("engine")["detail"]["dtype"] == dtype
            assert cosines(served_vectors(server), float32_vectors).min() >= 0.999
            return
        failed = server.wait_failed()
        assert [p["name"] for p in failed] == ["engine"]
        assert f"dtype {dtype}: this CPU has no {dtype} instructions" in failed[0]["detail"]["error"]
        assert server.post("/v1/embeddings", json={"input": "x"}).status_code == 503
    finally:
        server.stop()
