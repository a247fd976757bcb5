"""The GPU's attention (one masked call over the padded grid) equals the CPU's (one call per input),
with every kind of mask the families use. Run on the CPU: the arithmetic is the same."""

from __future__ import annotations

import pytest
import torch

from common.wire import Tokens
from engine.layers.encoder import _attend_spans, band_mask
from engine.layers.grid_attention import attend_grid
from engine.layers.packed import Packed

LENGTHS = [5, 1, 9, 3]


def packed() -> Packed:
    return Packed.of([Tokens(input_ids=list(range(n))) for n in LENGTHS])


def qkv(kv_heads: int = 4) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    total = sum(LENGTHS)
    return (
        torch.randn(total, 4, 8, generator=g),
        torch.randn(total, kv_heads, 8, generator=g),
        torch.randn(total, kv_heads, 8, generator=g),
    )


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("kv_heads", [4, 2])
def test_grid_equals_per_input(causal: bool, kv_heads: int) -> None:
    q, k, v = qkv(kv_heads)
    p = packed()
    expected = _attend_spans(q, k, v, p.spans, None, None, causal)
    torch.testing.assert_close(attend_grid(q, k, v, p, None, None, causal), expected, atol=1e-6, rtol=1e-5)


def test_grid_equals_per_input_in_a_band() -> None:
    q, k, v = qkv()
    p = packed()
    band = band_mask(max(LENGTHS), 2, q.device)
    expected = _attend_spans(q, k, v, p.spans, band, None, False)
    torch.testing.assert_close(attend_grid(q, k, v, p, band, None, False), expected, atol=1e-6, rtol=1e-5)


def test_grid_equals_per_input_with_a_relative_bias() -> None:
    q, k, v = qkv()
    p = packed()
    bias = torch.randn(4, 12, 12, generator=torch.Generator().manual_seed(1))  # larger than the longest input
    expected = _attend_spans(q, k, v, p.spans, bias, 0.5, False)
    torch.testing.assert_close(attend_grid(q, k, v, p, bias, 0.5, False), expected, atol=1e-6, rtol=1e-5)
