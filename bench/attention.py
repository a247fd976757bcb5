"""Attention over a packed batch: the engine's call per input against one call for the whole batch.

The packed layout (engine/layers/packed.py) holds every input's tokens one after another. engine/layers/encoder.py
runs scaled_dot_product_attention once per input on its own span; the two ways to make it one call
are the padded grid (scatter onto [inputs, longest], a key mask, one call, gather back) and torch's
nested jagged tensors (one call on the jagged layout itself). Each is timed on the shapes a layer of
all-MiniLM-L6-v2 sees (12 heads of 32) for one input and for groups of 8 and 32 inputs of 10-70
tokens, in float32 and bfloat16, checked to agree with the loop first. Prints ms per call; never asserts.
`--device cuda` times the same calls on a GPU (synchronised), with a group of 128 inputs beside.
Usage: .venv/bin/python -m bench.attention [--reps 200] [--device cuda]
"""

from __future__ import annotations

import argparse
import random
import time
from collections.abc import Callable

import torch
import torch.nn.functional as F

from engine.layers.encoder import _attend_spans

HEADS, SIZE = 12, 32


def timed(call: Callable[[], torch.Tensor], reps: int, device: torch.device) -> float:
    for _ in range(5):
        call()
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    sync()
    started = time.perf_counter()
    for _ in range(reps):
        call()
    sync()
    return (time.perf_counter() - started) / reps * 1000


def ways(lengths: list[int], dtype: torch.dtype, device: torch.device) -> dict[str, Callable[[], torch.Tensor]]:
    """The three ways, each a call on the same packed q, k, v."""
    total, count, longest = sum(lengths), len(lengths), max(lengths)
    q, k, v = (torch.randn(total, HEADS, SIZE, dtype=dtype, device=device) for _ in range(3))
    sizes = torch.tensor(lengths)
    starts = torch.cumsum(sizes, 0) - sizes
    spans = list(zip(starts.tolist(), lengths, strict=True))
    seq = torch.repeat_interleave(torch.arange(count), sizes)
    cells = (seq * longest + torch.arange(total) - starts[seq]).to(device)  # each token's cell in the grid
    keys = (torch.arange(longest)[None, :] < sizes[:, None])[:, None, None, :].to(device)
    offsets = torch.cat([torch.zeros(1, dtype=torch.long), torch.cumsum(sizes, 0)]).to(device)

    def padded() -> torch.Tensor:
        grids = []
        for t in (q, k, v):
            grid = t.new_zeros(count * longest, HEADS, SIZE)
            grid[cells] = t
            grids.append(grid.view(count, longest, HEADS, SIZE).transpose(1, 2))
        out = F.scaled_dot_product_attention(*grids, attn_mask=keys)
        return out.transpose(1, 2).reshape(count * longest, HEADS * SIZE)[cells]

    def nested() -> torch.Tensor:
        jagged = [torch.nested.nested_tensor_from_jagged(t, offsets).transpose(1, 2) for t in (q, k, v)]
        return F.scaled_dot_product_attention(*jagged).transpose(1, 2).values().reshape(total, HEADS * SIZE)

    return {
        "per input (the engine's)": lambda: _attend_spans(q, k, v, spans, None, None, False),
        "padded, one call": padded,
        "nested jagged, one call": nested,
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--reps", type=int, default=200)
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args()
    device = torch.device(args.device)
    rng = random.Random(0)
    counts = (8, 32, 128) if device.type == "cuda" else (8, 32)
    groups = {"1 input": [20], **{f"{n} inputs": [rng.randint(10, 70) for _ in range(n)] for n in counts}}
    print(f"{device}, {torch.get_num_threads()} threads, {HEADS} heads of {SIZE}: ms per call")
    for dtype in (torch.float32, torch.bfloat16):
        for label, lengths in groups.items():
            calls = ways(lengths, dtype, device)
            reference = next(iter(calls.values()))()
            results = []
            for name, call in calls.items():
                try:
                    torch.testing.assert_close(call(), reference, atol=2e-2, rtol=2e-2)
                    results.append(f"{name} {timed(call, args.reps, device):.3f}")
                except Exception as exc:  # a way torch does not run on this CPU or dtype
                    results.append(f"{name} failed ({type(exc).__name__})")
            print(f"{str(dtype).removeprefix('torch.')}, {label} ({sum(lengths)} tokens): {', '.join(results)}")


if __name__ == "__main__":
    main()
