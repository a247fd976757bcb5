"""What float32's rows padded to a multiple of 4 cost a forward (engine/precision/rows.py), in process.

Two engines of the embedded model in this process, one as served (its float32 projections on a
multiple of FLOAT32_STEP rows) and one with those wrappers taken off, called in turn (ABBA per
round) on the same groups, so both see the same drift; per shape the median of the per-round ratios
padded / unpadded. Shapes: one input of 3..64 tokens (a lone client: where the padding adds up to 3
rows to a product of few) and groups of 32 inputs of ~20 tokens (32 clients' share of a group).
Never asserts.
Usage: .venv/bin/python -m bench.row_padding [--rounds 30] [--threads 2]
"""

from __future__ import annotations

import argparse
import random
import statistics
import time

import torch

from bench.common import MODEL
from common.modelfolder import read_model_folder
from common.wire import Tokens
from engine.precision.rows import RowBucketed
from engine.runtime.device import place
from engine.runtime.model import PoolingModel

SHAPES = {"1 x 3": [3], "1 x 5": [5], "1 x 11": [11], "1 x 23": [23], "1 x 64": [64], "32 x ~20": [0] * 32}


def unpadded(model: PoolingModel) -> PoolingModel:
    """The wrappers replaced by the projections they wrap: float32 as it ran before."""
    for parent in list(model.model.modules()):
        for name, child in list(parent.named_children()):
            if isinstance(child, RowBucketed):
                setattr(parent, name, child.inner)
    return model


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    info = read_model_folder(MODEL)
    padded = PoolingModel(info, args.threads, place("cpu", "float32", []))
    plain = unpadded(PoolingModel(info, args.threads, place("cpu", "float32", [])))
    torch.set_num_threads(args.threads)
    rng = random.Random(1)
    word = lambda: rng.randrange(1000, 30000)  # noqa: E731
    print(f"float32, {args.threads} threads, {args.rounds} rounds (ABBA) per shape; {info.path.name}")
    print(f"{'group':<10} {'unpadded ms':>11} {'padded ms':>10} {'padded/unpadded':>16}")
    for name, lengths in SHAPES.items():
        group = [Tokens([101, *(word() for _ in range((n or rng.randint(12, 28)) - 2)), 102]) for n in lengths]
        times: dict[str, list[float]] = {"padded": [], "plain": []}
        for model in (padded, plain):
            model.forward(group)  # first-call costs out of the rounds
        for r in range(args.rounds):
            for label in ("padded", "plain") if r % 2 else ("plain", "padded"):
                model = padded if label == "padded" else plain
                t0 = time.perf_counter()
                model.forward(group)
                times[label].append(time.perf_counter() - t0)
        ratio = statistics.median(p / q for p, q in zip(times["padded"], times["plain"], strict=True))
        print(
            f"{name:<10} {statistics.median(times['plain']) * 1e3:>11.2f} "
            f"{statistics.median(times['padded']) * 1e3:>10.2f} {ratio:>16.3f}"
        )


if __name__ == "__main__":
    main()
