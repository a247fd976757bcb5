"""`warmpool embed` on a Parquet corpus against sentence-transformers' encode of the same texts.

The CLI runs against a server already up (its start is not the corpus' time), then the server is
stopped and sentence-transformers encodes the same texts in this process at the same batch size, so
the two never share the 2 cores. Prints inputs/s of each, their ratio, and how far the vectors are
apart. Never asserts.
Usage: .venv/bin/python -m bench.embed_cli [--rows 20000] [--batch-size 64] [--concurrency 4]
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from bench.common import MODEL, ROOT, sentences
from tests.server_process import ServerProcess


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", type=int, default=20000)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--concurrency", type=int, default=4)
    args = parser.parse_args()
    texts = sentences(args.rows)
    with tempfile.TemporaryDirectory() as tmp:
        corpus, out = Path(tmp) / "corpus.parquet", Path(tmp) / "out.parquet"
        pq.write_table(pa.table({"id": list(range(len(texts))), "text": texts}), corpus)
        server = ServerProcess(MODEL, Path(tmp) / "server.log", log_level="warning").wait_ready(600)
        try:
            command = [sys.executable, "-m", "orchestrator", "embed", str(corpus), "-o", str(out), "--url", server.url]
            command += ["--batch-size", str(args.batch_size), "--concurrency", str(args.concurrency)]
            started = time.perf_counter()
            subprocess.run(command, cwd=ROOT, check=True, stderr=subprocess.DEVNULL)
            cli_s = time.perf_counter() - started
        finally:
            server.stop()
        served = np.array(pq.read_table(out).column("embedding").to_pylist(), dtype=np.float32)

    from sentence_transformers import SentenceTransformer

    model = SentenceTransformer(str(MODEL), device="cpu")
    model.encode(texts[: args.batch_size], batch_size=args.batch_size)  # its first-call costs, as the server's warm-up
    started = time.perf_counter()
    reference = model.encode(texts, batch_size=args.batch_size, convert_to_numpy=True)
    st_s = time.perf_counter() - started
    cli_rate, st_rate = len(texts) / cli_s, len(texts) / st_s
    print(f"rows {len(texts)}, batch {args.batch_size}, concurrency {args.concurrency}")
    print(f"warmpool embed (Parquet in and out, over HTTP): {cli_rate:8.1f} inputs/s")
    print(f"sentence-transformers encode (in process):      {st_rate:8.1f} inputs/s")
    print(f"ratio warmpool embed / sentence-transformers: {cli_rate / st_rate:.2f}")
    print(f"max |difference| of the vectors: {np.abs(served - reference).max():.2e}")


if __name__ == "__main__":
    main()
