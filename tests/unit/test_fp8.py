"""vLLM's fp8 embed_dtypes computed without torch, code for code as torch 2.13 converts float32."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from server.core.fp8 import codes

EDGES = [0.0, -0.0, np.nan, np.inf, -np.inf, 448, 464, 463.9, 480, 1e30, 57344, 61440, 61439, 65536]
SUBNORMAL = [2**-9, 2**-10, 1.5 * 2**-9, 2.5 * 2**-9, 2**-17, 2**-16, 3 * 2**-17]


def values() -> np.ndarray:
    rng = np.random.default_rng(0)
    spreads = [rng.normal(0, scale, 20000) for scale in (1e-3, 0.05, 1, 300, 1e5)]
    return np.concatenate([*spreads, EDGES, SUBNORMAL]).astype(np.float32)


@pytest.mark.parametrize(("name", "dtype"), [("fp8_e4m3", torch.float8_e4m3fn), ("fp8_e5m2", torch.float8_e5m2)])
def test_codes_are_torchs(name: str, dtype: torch.dtype) -> None:
    """Nearest code with ties to even, subnormals, saturation (e4m3fn) and infinity (e5m2), NaN."""
    x = values()
    want = torch.from_numpy(x).to(dtype).view(torch.uint8).numpy()
    got = codes(x, name)
    wrong = np.nonzero(got != want)[0]
    assert wrong.size == 0, [(float(x[i]), int(want[i]), int(got[i])) for i in wrong[:5]]


def test_shape_is_kept() -> None:
    assert codes(np.zeros((2, 3), dtype=np.float32), "fp8_e5m2").shape == (2, 3)
