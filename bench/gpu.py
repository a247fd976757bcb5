"""The GPU path on a machine with an NVIDIA GPU. Prints, never asserts; the project's own machines
have none, so this runs where one is lent (README: GPUs).

1. exactness: float32 on the GPU against the CPU (max |diff|), bfloat16/float16 against float32
   (minimum cosine), in-process on the same folder;
2. GPU memory of one engine against the weight bytes;
3. throughput at 32 and 128 clients against sentence-transformers `encode` on the same GPU;
4. cold start to ready and first embedding against a naive server on the GPU, for the default
   model and a ~1.3 GB random BERT-large;
5. a killed engine serving again.
Usage: .venv/bin/python -m bench.gpu [--seconds 10] [--skip-big] [--workdir DIR (kept: the servers' logs)]
"""

from __future__ import annotations

import argparse
import contextlib
import tempfile
import time
from pathlib import Path

import numpy as np

from bench.coldstart import big_model, kill_recovery, run_naive, run_warmpool
from bench.common import MODEL, run, sentences
from bench.load import load


def exactness(model: Path, texts: list[str]) -> None:
    from common.modelfiles import weight_files
    from common.modelfolder import read_model_folder
    from engine.runtime.device import memory_detail, place
    from engine.runtime.model import PoolingModel
    from server.tokenizing.tokenizer import TokenizerPool

    info, tokenizer = read_model_folder(model), TokenizerPool(model)
    tokens = [tokenizer.encode(t, truncate=info.max_model_len) for t in texts[:64]]
    cpu = PoolingModel(info, 4, place("cpu", "float32", [])).forward(tokens)
    for dtype in ("float32", "bfloat16", "float16"):
        placement = place("cuda:0", dtype, weight_files(model))
        gpu = PoolingModel(info, 4, placement).forward(tokens)
        cosine = (cpu * gpu).sum(1) / np.linalg.norm(cpu, axis=1) / np.linalg.norm(gpu, axis=1)
        weights = sum(p.stat().st_size for p in weight_files(model)) / 1e6
        print(
            f"  {dtype:8}: max |gpu - cpu| {np.abs(gpu - cpu).max():.2e}, min cosine {cosine.min():.6f}; "
            f"{memory_detail(placement)} for {weights:.0f} MB of weights on disk ({placement.detail})"
        )


def forward_times(model: Path, texts: list[str]) -> None:
    """The engine's forward alone, in bfloat16: what the GPU takes for a batch, before any HTTP."""
    import torch

    from common.modelfolder import read_model_folder
    from engine.runtime.device import place
    from engine.runtime.model import PoolingModel
    from server.tokenizing.tokenizer import TokenizerPool

    info, tokenizer = read_model_folder(model), TokenizerPool(model)
    engine = PoolingModel(info, 4, place("cuda:0", "bfloat16", []))
    for size in (1, 32, 128):
        tokens = [tokenizer.encode(t, truncate=info.max_model_len) for t in texts[:size]]
        for _ in range(3):
            engine.forward(tokens)
        torch.cuda.synchronize()
        started = time.perf_counter()
        for _ in range(20):
            engine.forward(tokens)
        elapsed = (time.perf_counter() - started) / 20
        print(f"  forward of {size:3} inputs: {elapsed * 1000:.2f} ms = {size / elapsed:.0f} inputs/s")


def raw_throughput(model: Path, texts: list[str]) -> float:
    import torch
    from sentence_transformers import SentenceTransformer

    st = SentenceTransformer(str(model), device="cuda")
    st.encode(texts[:256], batch_size=128)
    torch.cuda.synchronize()
    started = time.perf_counter()
    st.encode(texts, batch_size=128)
    torch.cuda.synchronize()
    rate = len(texts) / (time.perf_counter() - started)
    del st
    torch.cuda.empty_cache()
    return rate


def serve(model: Path, tmp: Path, seconds: float, texts: list[str]) -> None:
    timeline, server = run_warmpool(model, tmp / f"{model.name}.warmpool.log", cold=True, device="cuda")
    naive = run_naive(model, tmp / f"{model.name}.naive.log", device="cuda")
    print(f"  cold start, warmpool: {timeline}")
    print(f"  cold start, naive:    {naive}")
    try:
        server.wait_ready()
        detail = server.wait_engines()
        print(f"  engines: {detail}")
        raw = raw_throughput(model, texts)
        for clients in (32, 128):
            window = run(load(server.port, clients, seconds, texts))
            print(
                f"  {clients:3} clients: {window.inputs_s:.1f} inputs/s = {window.inputs_s / raw:.2f} x raw {raw:.1f}"
            )
        many = run(load(server.port, 32, seconds, texts, body=lambda r: {"input": r.sample(texts, 16)}, per_request=16))
        print(f"   32 clients x 16 inputs a request: {many.inputs_s:.1f} inputs/s = {many.inputs_s / raw:.2f} x raw")
        print(f"  killed engine serving again after {kill_recovery(server):.2f} s")
    finally:
        server.stop()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seconds", type=float, default=10)
    parser.add_argument("--skip-big", action="store_true")
    parser.add_argument("--workdir", type=Path, help="kept afterwards (the servers' logs); else a temporary one")
    args = parser.parse_args()
    texts = sentences(4000)
    print("exactness and memory, default model:")
    exactness(MODEL, texts)
    forward_times(MODEL, texts)
    with tempfile.TemporaryDirectory() if args.workdir is None else contextlib.nullcontext(args.workdir) as tmp:
        print("default model:")
        serve(MODEL, Path(tmp), args.seconds, texts)
        if not args.skip_big:
            big = big_model(Path(tmp) / "bert-large")
            print("~1.3 GB random BERT-large:")
            exactness(big, texts)
            serve(big, Path(tmp), args.seconds, texts)


if __name__ == "__main__":
    main()
