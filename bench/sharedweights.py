"""Memory and start-up of big models: RSS, PSS and private memory per process with 1 and 2 engines,
load and warm-up seconds, on a BERT-large-shaped random checkpoint (~1.34 GB in float32) built in a
temporary folder (never committed).

The files are read once first, so every run starts from a warm page cache. Each engine serves a few
requests before its memory is read (it has touched all of its weights by then). Prints one JSON line
per run; never asserts.
Usage: .venv/bin/python -m bench.sharedweights [--source TREE] [--engines 1 2] [--dtype float32|bfloat16]
         [--shard-mb 0] [--folder PATH]
"""

from __future__ import annotations

import argparse
import json
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from bench.common import MODEL, ROOT, sentences
from common.procmem import parent_pid, process_memory
from tests.checkpoints import random_bert
from tests.server_process import ServerProcess

LARGE = {
    "hidden_size": 1024,
    "num_hidden_layers": 24,
    "num_attention_heads": 16,
    "intermediate_size": 4096,
    "max_position_embeddings": 512,
    "vocab_size": 30522,
}


def build(dest: Path, dtype: str, shard_mb: int, shape: dict[str, int] = LARGE) -> Path:
    """A sentence-transformers folder (mean pooling, 256 tokens) around a random BertModel of `shape`,
    its weights in `dtype`, in one file or in shards of `shard_mb` MB."""
    import torch

    random_bert(dest, MODEL, shape, getattr(torch, dtype), shard_mb)
    modules = [
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
    ]
    (dest / "modules.json").write_text(json.dumps(modules))
    (dest / "sentence_bert_config.json").write_text(json.dumps({"max_seq_length": 256}))
    (dest / "1_Pooling").mkdir(exist_ok=True)
    pooling = {"word_embedding_dimension": shape["hidden_size"], "pooling_mode_mean_tokens": True}
    (dest / "1_Pooling" / "config.json").write_text(json.dumps(pooling))
    return dest


def read_all(folder: Path) -> None:
    """Every file once, into the page cache."""
    for path in folder.rglob("*"):
        if path.is_file():
            with path.open("rb", buffering=0) as handle:
                while handle.read(16 << 20):
                    pass


def measure(folder: Path, engines: int, source: Path, log: Path) -> dict[str, Any]:
    """One server: start-up phases, then memory per process after each engine served requests."""
    server = ServerProcess(folder, log, source=source, engines=engines, max_batch_tokens=2048)
    try:
        server.wait_ready(900)
        detail = server.wait_engines(900)
        phases = {p["name"]: p for p in server.startup()["phases"]}
        texts = sentences(8, seed=1)
        with ThreadPoolExecutor(2 * engines) as pool:  # concurrent requests: each engine gets some
            for _ in range(3):
                codes = list(
                    pool.map(
                        lambda _: server.post("/v1/embeddings", json={"input": texts}).status_code, range(2 * engines)
                    )
                )
                assert set(codes) == {200}, codes
        pids = [pid for pid in detail["pids"] if pid]
        forkserver = parent_pid(pids[0])
        memory = {f"engine{i}": process_memory(pid) for i, pid in enumerate(pids)}
        if forkserver is not None and forkserver != server.proc.pid:
            memory["forkserver"] = process_memory(forkserver)
        return {
            "engines": engines,
            "ready_s": round(phases["ready"]["started_s"], 2),
            "forkserver_s": phases["forkserver"]["duration_s"],
            "engine": {k: v for k, v in phases["engine"]["detail"].items() if k not in ("pids", "memory")},
            "warmup": phases["warmup"]["detail"],
            "memory": memory,
            "pss_total_mb": round(sum(m["pss_mb"] for m in memory.values() if m), 1),
        }
    finally:
        server.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--source", type=Path, default=ROOT, help="the tree `python -m orchestrator` runs from")
    parser.add_argument("--engines", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    parser.add_argument("--shard-mb", type=int, default=0, help="shards of this size (0: one file)")
    parser.add_argument("--folder", type=Path, help="use (or build once into) this folder")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        folder = args.folder or Path(tmp) / "bert-large"
        if not (folder / "config.json").is_file():
            build(folder, args.dtype, args.shard_mb)
        weights = sum(p.stat().st_size for p in folder.glob("model*.safetensors"))
        read_all(folder)
        for engines in args.engines:
            result = measure(folder, engines, args.source, Path(tmp) / f"server-{engines}.log")
            print(json.dumps({"weights_mb": round(weights / 1e6, 1), **result}), flush=True)


if __name__ == "__main__":
    main()
