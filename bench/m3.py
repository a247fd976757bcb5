"""bge-m3's three outputs (dense, lexical weights, ColBERT vectors) from one forward, against its
dense vector alone: the time of each, alternated round by round on the same batch, in the engine
(PoolingModel in this process) and through the server (/v1/embeddings). Prints ratios; never asserts.
Usage: .venv/bin/python -m bench.m3 FOLDER [--rounds 10] [--batch 32]  (bench.shapes m3-xlm-roberta-base)
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench.common import sentences
from tests.server_process import ServerProcess

ALL = ("dense", "sparse", "multi_vector")


def timed(fn: Callable[[], Any]) -> float:
    started = time.perf_counter()
    fn()
    return time.perf_counter() - started


def paired(dense: Callable[[], Any], everything: Callable[[], Any], rounds: int) -> tuple[float, float, list[float]]:
    """Median seconds of each, and each round's ratio (everything over dense), the order alternating."""
    dense(), everything()  # first-call costs
    pairs = []
    for i in range(rounds):
        if i % 2:
            b, a = timed(everything), timed(dense)
        else:
            a, b = timed(dense), timed(everything)
        pairs.append((a, b))
    return statistics.median(a for a, _ in pairs), statistics.median(b for _, b in pairs), [b / a for a, b in pairs]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("folder", type=Path)
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--batch", type=int, default=32)
    args = parser.parse_args()
    from common.modelfolder import read_model_folder
    from engine.runtime.model import PoolingModel
    from server.tokenizing.tokenizer import TokenizerPool

    texts = sentences(args.batch)
    info = read_model_folder(args.folder)
    model = PoolingModel(info, threads=os.cpu_count() or 1)
    tokens = TokenizerPool(args.folder).encode_batch(texts, truncate=info.max_model_len)
    marked = [t._replace(outputs=ALL) for t in tokens]
    report("engine", *paired(lambda: model.forward(tokens), lambda: model.forward_outputs(marked), args.rounds))
    with tempfile.TemporaryDirectory() as tmp:
        server = ServerProcess(args.folder, Path(tmp) / "m3.log", log_level="warning")
        server.wait_ready(600)
        try:
            body = {"input": texts}

            def post(extra: dict[str, Any]) -> None:
                r = server.post("/v1/embeddings", json={**body, **extra}, timeout=300)
                assert r.status_code == 200, r.text

            report("server", *paired(lambda: post({}), lambda: post({"outputs": list(ALL)}), args.rounds))
        finally:
            server.stop()


def report(where: str, dense: float, everything: float, ratios: list[float]) -> None:
    spread = f"{min(ratios):.2f}-{max(ratios):.2f}"
    print(
        f"{where}: dense alone {dense * 1000:.1f} ms, all three {everything * 1000:.1f} ms a batch: "
        f"x{statistics.median(ratios):.3f} (rounds {spread})"
    )


if __name__ == "__main__":
    main()
