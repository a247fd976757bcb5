"""How far a rate of inputs is from what the machine's cores can do: the model's matrix work per input
against the peak of one large GEMM measured here, now.

A token costs 2 x the projection weights it passes through in FLOPs (the warmup phase's
mflop_per_token); attention's own products are left out (a few percent at tens of tokens), so the
share printed is a slight underestimate. The peak is the best of a few [2048 x 2048] x [2048 x 2048]
products on all cores, in float32 and bfloat16 on the faster of `@` and oneDNN on a packed weight (the
engine's choice, engine/precision/gemm.py: on an AMD Zen 5, MKL's `@` reached 44 % of oneDNN's float32
rate, and a share of it would flatter), and in int8 (torch._int_mm, int32 accumulation).
"""

from __future__ import annotations

import time
from collections.abc import Callable

SIZE = 2048


def peak_gflops(dtype: str) -> float:
    """Best rate of a SIZE^3 product in float32, bfloat16 or int8 (GFLOP/s; GOP/s for int8)."""
    import torch

    if dtype == "int8":
        a = torch.randint(-127, 127, (SIZE, SIZE), dtype=torch.int8)
        calls: list[Callable[[], object]] = [lambda: torch._int_mm(a, a)]
    else:
        a = torch.randn(SIZE, SIZE, dtype=getattr(torch, dtype))
        calls = [lambda: a @ a]
        if torch.backends.mkldnn.is_available():
            packed = torch.ops.mkldnn._reorder_linear_weight(a, SIZE)
            calls.append(lambda: torch.ops.mkldnn._linear_pointwise(a, packed, None, "none", [], ""))
    best = float("inf")
    for call in calls:
        call()
        for _ in range(3):
            started = time.perf_counter()
            call()
            best = min(best, time.perf_counter() - started)
    return 2 * SIZE**3 / best / 1e9


def achieved_gflops(inputs_s: float, tokens_per_input: float, mflop_per_token: float) -> float:
    return inputs_s * tokens_per_input * mflop_per_token / 1e3
