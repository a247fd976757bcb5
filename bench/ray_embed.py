"""warmpool.ray.Embedder against a sentence-transformers callable class, both in Ray Data's map_batches.

The same corpus (bench.common's sentences, 4-64 words), the same local Ray runtime on 2 CPUs, one
actor of `--cpus` CPUs each side (Ray sets its torch threads from them), the same batch size; the two
run in turn (ABBA...) and each round's ratio is warmpool's rows/s over sentence-transformers'. A round's
time is the whole pipeline: actor start and model load, tokenizing, forward, the column written back.
Also the largest difference between the two sides' vectors. Never asserts.
Usage: .venv/bin/python -m bench.ray_embed [--model DIR] [--texts 20000] [--rounds 4] [--precision float32]
       [--compile off] [--batch-size 256] [--cpus 2]
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path
from typing import Any

import numpy as np

from bench.common import MODEL, ROOT, sentences
from warmpool.ray import Embedder


class SentenceTransformerEmbedder:
    """The baseline a Ray Data user writes today: a SentenceTransformer per actor, encode per batch."""

    def __init__(self, model_dir: str, batch_size: int) -> None:
        from sentence_transformers import SentenceTransformer

        self.model = SentenceTransformer(model_dir, device="cpu")
        self.batch_size = batch_size

    def __call__(self, batch: dict[str, Any]) -> dict[str, Any]:
        texts = batch["text"].tolist()
        vectors = self.model.encode(texts, batch_size=self.batch_size, convert_to_numpy=True)
        return {**batch, "embedding": vectors.astype(np.float32)}


def one_round(ray: Any, dataset: Any, fn: type, kwargs: dict[str, Any], args: argparse.Namespace) -> tuple[float, Any]:
    """Seconds for the whole map_batches over `dataset`, and its vectors in order."""
    started = time.perf_counter()
    out = dataset.map_batches(
        fn,
        fn_constructor_kwargs=kwargs,
        compute=ray.data.ActorPoolStrategy(size=1),
        num_cpus=args.cpus,
        batch_size=args.batch_size,
    ).take_all()
    return time.perf_counter() - started, np.stack([row["embedding"] for row in out])


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", type=Path, default=MODEL)
    parser.add_argument("--texts", type=int, default=20000)
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--precision", default="float32")
    parser.add_argument("--compile", default="off", help="warmpool's side: off, auto or required (cache warm first)")
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--cpus", type=int, default=2)
    args = parser.parse_args()

    import ray

    ray.init(
        address="local",
        num_cpus=args.cpus,
        include_dashboard=False,
        log_to_driver=False,
        runtime_env={"env_vars": {"PYTHONPATH": str(ROOT)}},
    )
    ray.data.DataContext.get_current().enable_progress_bars = False
    try:
        dataset = ray.data.from_items([{"text": text} for text in sentences(args.texts)]).materialize()
        sides = {
            "warmpool": (
                Embedder,
                {"model_dir": str(args.model), "precision": args.precision, "compile": args.compile},
            ),
            "sentence-transformers": (
                SentenceTransformerEmbedder,
                {"model_dir": str(args.model), "batch_size": args.batch_size},
            ),
        }
        seconds: dict[str, list[float]] = {name: [] for name in sides}
        vectors: dict[str, Any] = {}
        for round_ in range(args.rounds):
            for name in list(sides) if round_ % 2 == 0 else list(sides)[::-1]:
                fn, kwargs = sides[name]
                elapsed, vectors[name] = one_round(ray, dataset, fn, kwargs, args)
                seconds[name].append(elapsed)
    finally:
        ray.shutdown()
    print(f"{args.model.name}, {args.texts} texts, {args.cpus} CPUs, batch_size {args.batch_size}, {args.precision}")
    for name, times in seconds.items():
        print(f"{name}: {args.texts / statistics.median(times):.1f} rows/s (median of {len(times)} rounds)")
    ratios = [s / w for w, s in zip(seconds["warmpool"], seconds["sentence-transformers"], strict=True)]
    print(
        f"warmpool / sentence-transformers per round: {' '.join(f'{r:.2f}' for r in ratios)}; "
        f"median {statistics.median(ratios):.2f}"
    )
    largest = np.abs(vectors["warmpool"] - vectors["sentence-transformers"]).max()
    print(f"largest |difference| between the two sides' vectors: {largest:.2e}")


if __name__ == "__main__":
    main()
