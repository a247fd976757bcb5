"""Two models in one appliance against two single-model appliances started at the same time: the
time until both models serve, and the memory all their processes hold (proportional set size, so
pages the processes share count once). The reranker is a BERT-base-shaped random cross-encoder
generated in a temp dir. Alternating runs, medians, ratios measured in this run; never asserts.
Usage: .venv/bin/python -m bench.several [--runs 3]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

from bench.common import MODEL
from tests.server_process import ServerProcess, wait_for


def reranker(dest: Path) -> Path:
    """A BERT-base-shaped (110M parameters) cross-encoder with random weights and MiniLM's tokenizer."""
    import torch
    from transformers import BertConfig, BertForSequenceClassification

    from tests.tiny_models import save_with_tokenizer

    torch.manual_seed(0)
    config = BertConfig(num_labels=1, id2label={0: "score"}, label2id={"score": 0})
    return save_with_tokenizer(BertForSequenceClassification(config), dest, MODEL)


def pss_mb(server: ServerProcess) -> float:
    """Proportional memory of the appliance's process tree (shared pages split between sharers)."""
    total = 0
    for pid in [server.proc.pid, *server.children()]:
        try:
            rollup = Path(f"/proc/{pid}/smaps_rollup").read_text()
        except OSError:
            continue
        total += next(int(line.split()[1]) for line in rollup.splitlines() if line.startswith("Pss:"))
    return total / 1024


def until_ready(servers: list[ServerProcess]) -> float:
    """Seconds from the first start until every server answers /health/ready 200."""
    started = min(s.started for s in servers)
    for server in servers:
        server.wait_ready(300)
    wait_for(lambda: all(s.get("/health/ready").status_code == 200 for s in servers), 60, "all ready")
    return time.monotonic() - started


def one_appliance(rerank: Path, log: Path) -> tuple[float, float]:
    server = ServerProcess(MODEL, log, models=f"embed={MODEL},rerank={rerank}")
    try:
        seconds = until_ready([server])  # one engine per model: all are up at ready
        return seconds, pss_mb(server)
    finally:
        server.stop()


def two_appliances(rerank: Path, log: Path) -> tuple[float, float]:
    """Each alone gets the engines a model gets in the shared appliance (one), so the cores match."""
    servers = [ServerProcess(MODEL, log.with_suffix(".a"), engines=1), ServerProcess(rerank, log, engines=1)]
    try:
        seconds = until_ready(servers)
        return seconds, sum(pss_mb(s) for s in servers)
    finally:
        for server in servers:
            server.stop()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        rerank = reranker(Path(tmp) / "bert-base-reranker")
        log = Path(tmp) / "server.log"
        runs: dict[str, list[tuple[float, float]]] = {"one": [], "two": []}
        for i in range(args.runs):
            order = (("one", one_appliance), ("two", two_appliances))
            for name, run in order if i % 2 == 0 else order[::-1]:
                runs[name].append(run(rerank, log))
                print(
                    f"run {i + 1} {name}: ready {runs[name][-1][0]:.2f} s, PSS {runs[name][-1][1]:.0f} MB", flush=True
                )
    ready = {k: statistics.median(r[0] for r in v) for k, v in runs.items()}
    memory = {k: statistics.median(r[1] for r in v) for k, v in runs.items()}
    print(f"one appliance, two models: both ready in {ready['one']:.2f} s, {memory['one']:.0f} MB PSS (median)")
    print(f"two appliances:            both ready in {ready['two']:.2f} s, {memory['two']:.0f} MB PSS (median)")
    print(f"one/two: time {ready['one'] / ready['two']:.2f}, memory {memory['one'] / memory['two']:.2f}")


if __name__ == "__main__":
    main()
