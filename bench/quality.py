"""What lower precision costs in quality: vectors of a fixed corpus in int8 (and bfloat16/float16
where this CPU has them) against float32 on the same model, in-process on the engine's own model.

Prints, per dtype: the mean and minimum cosine similarity of each text's vector to its float32
vector, and the top-10 retrieval overlap (for each query, the share of float32's 10 nearest corpus
texts that the dtype's 10 nearest also hold), and the encode rate against float32's. Never asserts.
Usage: .venv/bin/python -m bench.quality [--model DIR] [--texts 2000] [--queries 200]
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

import numpy as np

from bench.common import MODEL
from common.folderjson import ModelError
from common.modelfolder import read_model_folder
from engine.runtime.device import place
from engine.runtime.model import PoolingModel
from server.tokenizing.tokenizer import TokenizerPool

BATCH = 32
SOURCES = (
    "builtins",
    "os",
    "pathlib",
    "json",
    "re",
    "asyncio",
    "collections",
    "itertools",
    "functools",
    "statistics",
    "subprocess",
    "threading",
    "email",
    "http.client",
    "unittest",
    "argparse",
    "logging",
    "decimal",
    "datetime",
    "random",
    "socket",
    "ssl",
    "sqlite3",
    "tarfile",
    "zipfile",
    "typing",
)


def corpus(n: int) -> list[str]:
    """Up to n distinct English sentences of 6-60 words from the standard library's docstrings: varied
    real prose, the same on every machine with this Python, nothing to download."""
    import importlib
    import inspect
    import re

    found: dict[str, None] = {}
    for name in SOURCES:
        module = importlib.import_module(name)
        for _, member in sorted(inspect.getmembers(module), key=lambda m: m[0]):
            for sentence in re.split(r"(?<=[.!?])\s+", " ".join((inspect.getdoc(member) or "").split())):
                if 6 <= len(sentence.split()) <= 60 and not sentence.startswith(">>>"):
                    found.setdefault(sentence, None)
    return list(found)[:n]


def encode(model: PoolingModel, items: list, batch: int = BATCH) -> tuple[np.ndarray, float]:  # type: ignore[type-arg]
    """Unit vectors of `items` and texts/s."""
    model.forward(items[:batch])
    started = time.perf_counter()
    vectors = np.concatenate([model.forward(items[i : i + batch]) for i in range(0, len(items), batch)])
    rate = len(items) / (time.perf_counter() - started)
    return vectors / np.linalg.norm(vectors, axis=1, keepdims=True), rate


def top_overlap(reference: np.ndarray, other: np.ndarray, queries: int, k: int = 10) -> float:
    """Mean share of the reference's k nearest corpus texts (queries excluded) that `other` finds too."""
    q_ref, c_ref = reference[:queries], reference[queries:]
    q_oth, c_oth = other[:queries], other[queries:]
    near_ref = np.argsort(-(q_ref @ c_ref.T), axis=1)[:, :k]
    near_oth = np.argsort(-(q_oth @ c_oth.T), axis=1)[:, :k]
    shared = [len(set(a) & set(b)) / k for a, b in zip(near_ref, near_oth, strict=True)]
    return float(np.mean(shared))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", type=Path, default=MODEL)
    parser.add_argument("--texts", type=int, default=2000, help="corpus size, queries included")
    parser.add_argument("--queries", type=int, default=200)
    parser.add_argument("--dtypes", nargs="+", default=["int8", "bfloat16", "float16"])
    args = parser.parse_args()
    threads = os.cpu_count() or 1
    info = read_model_folder(args.model)
    pool = TokenizerPool(args.model)
    texts = corpus(args.texts)
    items = [pool.encode(text, truncate=info.max_model_len) for text in texts]
    tokens = sum(len(item.input_ids) for item in items) / len(items)
    reference, reference_rate = encode(PoolingModel(info, threads, place("cpu", "float32", [])), items)
    print(f"{args.model.name}: {len(texts)} texts ({tokens:.1f} tokens each), {args.queries} of them as queries")
    print(f"  float32    {reference_rate:7.1f} texts/s")
    for dtype in args.dtypes:
        try:
            placement = place("cpu", dtype, [])
        except ModelError as exc:
            print(f"  {dtype:9s}  refused: {exc}")
            continue
        vectors, rate = encode(PoolingModel(info, threads, placement), items)
        cosine = (vectors * reference).sum(axis=1)
        print(
            f"  {dtype:9s}  {rate:7.1f} texts/s ({rate / reference_rate:.2f} x float32); cosine to float32 "
            f"mean {cosine.mean():.5f} min {cosine.min():.5f}; "
            f"top-10 overlap {top_overlap(reference, vectors, args.queries):.3f}"
        )


if __name__ == "__main__":
    main()
