"""Warm-up: pay the first-call costs with small shapes, and price a token without forwards that grow
with the model.

What a first request needs is a forward that has run once: torch's lazily made kernels, thread pool
and allocator, and the weights' pages mapped. One input of 8 tokens pays all of it; a longer input
after it costs the first time what it costs the second (BERT-large shape on 2 cores: 1 x 8 tokens
296 ms first, 98 ms next; 1 x 256 after them 853 ms first, 864 ms next). The warm-up this replaces
ran 1 x the longest input, then 1 x 8 and 16 x 32 twice each: ~1,300 tokens, 4.7 s on that model.

Two figures come out of it: the seconds one token costs (the stall watchdog's default timeout) and
the per-call overhead in tokens (the padded fallback's split, engine.runtime.batching.split_by_length). A
token costs the model's matrix work (2 x its projection weights, in FLOPs) at the rate one GEMM of
its widest projection runs over PROBE_TOKENS tokens: tens of milliseconds however deep the model.
The overhead is what the second 8-token forward took beyond its 8 tokens.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from common.wire import Tokens
from engine.precision.int8 import Int8Linear
from engine.runtime.batching import GROUP_TOKENS

SMALL = 8  # tokens in the warm-up forwards
PROBE_TOKENS = GROUP_TOKENS  # rows of the GEMM that prices a token: a packed group's size


@dataclass(frozen=True)
class Warmup:
    overhead_tokens: float  # one forward's fixed cost, in tokens
    per_token_s: float
    detail: dict[str, Any] = field(default_factory=dict)  # what it did, for the warmup phase


def warm_up(forward: Callable[[list[Tokens]], Any], model: nn.Module, token: int, device: torch.device) -> Warmup:
    """Two forwards of one 8-token input (`forward` returns on the host, so its time is the
    device's), then the GEMM that prices a token."""
    small = [Tokens([token] * SMALL)]
    first_s = _timed(lambda: forward(small), device)
    again_s = _timed(lambda: forward(small), device)
    layers = projections(model)
    if not layers:  # nothing to price a token by: the forward's time, all of it per token
        return Warmup(1.0, again_s / SMALL, {"forwards": [f"1x{SMALL}", f"1x{SMALL}"]})
    flops_per_token = 2 * sum(layer.in_features * layer.out_features for layer in layers)
    widest = max(layers, key=lambda layer: layer.in_features * layer.out_features)
    dtype = next(p.dtype for p in model.parameters() if p.is_floating_point())  # int8 layers take floats
    with torch.inference_mode():
        x = torch.randn(PROBE_TOKENS, widest.in_features, dtype=dtype, device=device)
        probe_s = min(_timed(lambda: widest(x), device) for _ in range(2))
    flops_per_s = 2 * PROBE_TOKENS * widest.in_features * widest.out_features / max(probe_s, 1e-9)
    per_token_s = max(flops_per_token / flops_per_s, 1e-9)
    overhead = min(max((again_s - SMALL * per_token_s) / per_token_s, 1.0), 512.0)
    detail = {
        "forwards": [f"1x{SMALL}", f"1x{SMALL}"],
        "first_forward_ms": round(first_s * 1000, 1),
        "forward_ms": round(again_s * 1000, 1),
        "probe_gemm": f"{PROBE_TOKENS}x{widest.out_features}x{widest.in_features}",
        "probe_gflops": round(flops_per_s / 1e9, 1),
        "mflop_per_token": round(flops_per_token / 1e6, 3),
    }
    return Warmup(overhead, per_token_s, detail)


def projections(model: nn.Module) -> list[nn.Linear | Int8Linear]:
    """The projections every token goes through (nn.Linear, fused, oneDNN-packed or int8): not
    embedding tables, of which a token reads one row."""
    return [m for m in model.modules() if isinstance(m, nn.Linear | Int8Linear)]


def _timed(call: Callable[[], Any], device: torch.device) -> float:
    started = time.perf_counter()
    call()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter() - started
