"""Where one forward of the packed engine spends its time; and what oneDNN-prepacked projections would pay.

Two shapes: the one input a single client sends, and the packed group 32 clients' batch-1 requests
form in the engine (32 sentences cut by engine.runtime.batching.split_by_tokens: the first group). For each,
torch.profiler's self time by kind of operator (projections, attention, norms, activations,
embeddings, the rest) and the Python between them (the wall time no operator accounts for).

With --onednn, the same model with every layer's nn.Linear prepacked for oneDNN (the weight
reordered once into its blocked layout, as torch.compile's CPU freezing pass does) against the
engine's, in alternating rounds (this machine drifts by tens of percent within a minute): on one
length seen before, on lengths never seen, and the resident memory after one input of every length.
oneDNN builds and caches a kernel per input shape, so its speed on a length seen before is not its
speed on a new one, and its caches grow with every new length. Never asserts.
Usage: .venv/bin/python -m bench.forward [--model DIR] [--dtype float32] [--rounds 10] [--onednn]
"""

from __future__ import annotations

import argparse
import random
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


def resident_mb() -> float:
    with open("/proc/self/statm") as handle:
        return int(handle.read().split()[1]) * 4096 / 1e6


def prepack_for_onednn(model: Any) -> None:
    """Every nn.Linear in the model's layer stacks computed by oneDNN from a prepacked weight."""
    import torch
    from torch import nn

    class Prepacked(nn.Module):
        def __init__(self, linear: nn.Linear) -> None:
            super().__init__()
            self.packed = torch.ops.mkldnn._reorder_linear_weight(linear.weight.detach())
            self.bias = linear.bias

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return torch.ops.mkldnn._linear_pointwise(x, self.packed, self.bias, "none", [], "")  # type: ignore[no-any-return]

    for stack in [m for m in model.modules() if isinstance(m, nn.ModuleList)]:
        for parent in list(stack.modules()):
            for name, child in list(parent.named_children()):
                if type(child) is nn.Linear:
                    setattr(parent, name, Prepacked(child))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", type=Path, default=MODEL)
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--onednn", action="store_true", help="also measure oneDNN-prepacked projections")
    args = parser.parse_args()

    import torch

    from common.modelfolder import read_model_folder
    from common.wire import Tokens
    from engine.runtime.batching import split_by_tokens
    from engine.runtime.device import place
    from engine.runtime.heap import HeapTrim
    from engine.runtime.model import PoolingModel
    from server.tokenizing.tokenizer import TokenizerPool

    info = read_model_folder(args.model)
    threads = torch.get_num_threads()
    engine = PoolingModel(info, threads, place("cpu", args.dtype, []))
    pool = TokenizerPool(args.model)
    batch = [(str(i), t) for i, t in enumerate(pool.encode_batch(sentences(32), truncate=info.max_model_len))]
    group = [tokens for _, tokens in split_by_tokens(batch)[0]]
    shapes = {"1 client (1 input)": [batch[0][1]], f"32 clients (a group of {len(group)} inputs)": group}
    print(f"{args.model.name}, {args.dtype}, {threads} threads")
    for label, items in shapes.items():
        tokens = sum(len(item.input_ids) for item in items)
        wall, kinds = breakdown(lambda i=items: engine.forward(i), max(2, 2000 // tokens))  # type: ignore[misc]
        parts = ", ".join(f"{kind} {ms:.2f}" for kind, ms in sorted(kinds.items(), key=lambda kv: -kv[1]))
        print(f"{label}, {tokens} tokens: {wall:.2f} ms under the profiler: {parts}")
    if not args.onednn:
        return
    onednn = PoolingModel(info, threads, place("cpu", args.dtype, []))
    prepack_for_onednn(onednn.model)
    seen = [batch[0][1]]
    a, b, ratios = paired(lambda: engine.forward(seen), lambda: onednn.forward(seen), 20, args.rounds)
    print(
        f"\noneDNN prepacked, one length seen before: {b:.2f} ms against {a:.2f}; "
        f"speedup {statistics.median(ratios):.2f}"
    )
    rng = random.Random(0)
    fresh = iter(range(3, info.max_model_len))  # each length once: never seen by the kernel caches
    new = {"a": 0.0, "b": 0.0}
    for _ in range(min(args.rounds * 8, info.max_model_len - 3) // 2):
        for name, model in (("a", engine), ("b", onednn)):
            item = [Tokens([101] + [rng.randint(1000, 9000) for _ in range(next(fresh, 3) - 2)] + [102])]
            started = time.perf_counter()
            model.forward(item)
            new[name] += time.perf_counter() - started
    print(f"oneDNN prepacked, new lengths (alternating): {new['a'] / new['b']:.2f} x the engine's speed")
    heap = HeapTrim(trim_above=0, every_s=0.0)  # as an idle engine does: what stays is held, not free
    for name, model in (("engine", engine), ("oneDNN prepacked", onednn)):
        before = resident_mb()
        for n in range(3, info.max_model_len):
            model.forward([Tokens([101] * n)])
            heap.idle()
        print(
            f"{name}: resident +{resident_mb() - before:.0f} MB after one input of each length "
            f"3-{info.max_model_len - 1}"
        )


if __name__ == "__main__":
    main()
