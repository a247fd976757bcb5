"""Where one forward of the packed engine spends its time, and what prepacking the projections pays.

Two shapes: the one input a single client sends, and the packed group 32 clients' batch-1 requests
form in the engine (32 sentences cut by engine.batching.split_by_tokens: the first group). For each,
torch.profiler's self time by kind of operator (projections, attention, norms, activations,
embeddings, the rest) and the Python between them (the wall time no operator accounts for); then
the forward with the engine's prepacked projections (engine/prepacked.py) against the same model
with nn.Linear, in alternating rounds (this machine drifts by tens of percent within a minute).
Never asserts.
Usage: .venv/bin/python -m bench.forward [--model DIR] [--dtype float32] [--rounds 10]
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench.common import MODEL, sentences

KINDS = {
    "projections": ("addmm", "aten::mm", "_linear_pointwise", "_int_mm", "aten::bmm"),
    "attention": ("scaled_dot_product", "softmax"),
    "norms": ("layer_norm", "rsqrt", "aten::pow", "aten::mean"),
    "activations": ("gelu", "silu", "relu", "tanh"),
    "embeddings": ("embedding", "index_select"),
}


def kind_of(name: str) -> str:
    return next((kind for kind, marks in KINDS.items() if any(mark in name for mark in marks)), "other ops")


def breakdown(forward: Callable[[], Any], reps: int) -> tuple[float, dict[str, float]]:
    """Wall ms per forward, and each kind's self CPU ms per forward (plus Python: the rest of the wall)."""
    from torch.profiler import ProfilerActivity, profile

    forward()
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        started = time.perf_counter()
        for _ in range(reps):
            forward()
        wall = (time.perf_counter() - started) * 1000 / reps
    kinds: dict[str, float] = {}
    for event in prof.key_averages():
        kinds[kind_of(event.key)] = kinds.get(kind_of(event.key), 0.0) + event.self_cpu_time_total / 1000 / reps
    kinds["python between ops"] = max(0.0, wall - sum(kinds.values()))
    return wall, kinds


def paired(a: Callable[[], Any], b: Callable[[], Any], reps: int, rounds: int) -> tuple[float, float, list[float]]:
    """Median ms of a and of b over alternating rounds (ABBA...), and each round's a/b."""
    times: dict[str, list[float]] = {"a": [], "b": []}
    for round_ in range(rounds):
        for name in "ab" if round_ % 2 == 0 else "ba":
            call = a if name == "a" else b
            started = time.perf_counter()
            for _ in range(reps):
                call()
            times[name].append((time.perf_counter() - started) * 1000 / reps)
    ratios = [x / y for x, y in zip(times["a"], times["b"], strict=True)]
    return statistics.median(times["a"]), statistics.median(times["b"]), ratios


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", type=Path, default=MODEL)
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--rounds", type=int, default=10)
    args = parser.parse_args()

    import numpy as np
    import torch

    from common.modelfolder import read_model_folder
    from engine import families
    from engine.batching import split_by_tokens
    from engine.device import place
    from engine.model import PoolingModel
    from server.tokenizer import TokenizerPool

    info = read_model_folder(args.model)
    threads = torch.get_num_threads()
    engine = PoolingModel(info, threads, place("cpu", args.dtype, []))
    plain = PoolingModel(info, threads, place("cpu", args.dtype, []))
    labels = None if info.kind == "embedding" else len(info.id2label)
    plain.model = families.load(info.path, info.config, labels, torch.device("cpu"), plain.placement.dtype)
    pool = TokenizerPool(args.model)
    texts = sentences(32)
    batch = [(str(i), tokens) for i, tokens in enumerate(pool.encode_batch(texts, truncate=info.max_model_len))]
    group = [tokens for _, tokens in split_by_tokens(batch)[0]]
    shapes = {
        "1 client (1 input)": [batch[0][1]],
        f"32 clients (a group of {len(group)} inputs)": group,
    }
    print(f"{args.model.name}, {args.dtype}, {threads} threads; {engine.weights.get('prepacked', 'not prepacked')}")
    for label, items in shapes.items():
        tokens = sum(len(item.input_ids) for item in items)
        reps = max(2, 2000 // tokens)
        error = float(np.abs(engine.forward(items) - plain.forward(items)).max())
        print(f"\n{label}, {tokens} tokens; prepacked against nn.Linear: max |difference| {error:.1e}")
        for name, model in (("nn.Linear", plain), ("prepacked", engine)):
            wall, kinds = breakdown(lambda m=model, i=items: m.forward(i), reps)  # type: ignore[misc]
            parts = ", ".join(f"{kind} {ms:.2f}" for kind, ms in sorted(kinds.items(), key=lambda kv: -kv[1]))
            print(f"  {name:9s} {wall:7.2f} ms under the profiler: {parts}")
        a, b, ratios = paired(lambda i=items: plain.forward(i), lambda i=items: engine.forward(i), reps, args.rounds)  # type: ignore[misc]
        print(
            f"  unprofiled, {args.rounds} alternating rounds: nn.Linear {a:.2f} ms, prepacked {b:.2f} ms; "
            f"speedup median {statistics.median(ratios):.2f} (rounds {min(ratios):.2f}-{max(ratios):.2f})"
        )


if __name__ == "__main__":
    main()
