"""Bytes on the wire and the client's decode time per 1,000 vectors, per encoding of /v1/embeddings:
float JSON (the baseline), base64 (float32), vLLM's raw `bytes` (float32 and fp8_e4m3), int8 and binary.

One server on the embedded model; each encoding asks for the same `--vectors` texts in requests of
`--batch`, rounds alternating the encodings' order. Decoding is what a client does to get arrays:
json.loads and np.asarray for JSON, base64 then np.frombuffer, the body sliced by vLLM's `metadata`
header. Prints bytes and decode ms per 1,000 vectors, and each against float JSON. Never asserts.
Usage: .venv/bin/python -m bench.wire_encodings [--vectors 1000] [--batch 100] [--rounds 3]
"""

from __future__ import annotations

import argparse
import base64
import json
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from bench.common import MODEL, sentences
from tests.server_process import ServerProcess

ENCODINGS: dict[str, dict[str, Any]] = {
    "float (JSON)": {"encoding_format": "float"},
    "base64": {"encoding_format": "base64"},
    "bytes float32": {"encoding_format": "bytes"},
    "bytes fp8_e4m3": {"encoding_format": "bytes", "embed_dtype": "fp8_e4m3"},
    "int8": {"encoding_format": "int8"},
    "binary": {"encoding_format": "binary"},
}


def decoded(name: str, body: bytes, headers: Any) -> list[np.ndarray]:
    """The vectors as a client gets arrays out of the answer."""
    if name.startswith("bytes"):
        items = json.loads(headers["metadata"])["data"]
        dtype = np.uint8 if "fp8" in name else np.float32  # fp8 codes: the client views them as its fp8 type
        return [np.frombuffer(body[i["start"] : i["end"]], dtype=dtype) for i in items]
    data = json.loads(body)["data"]
    if name == "base64":
        return [np.frombuffer(base64.b64decode(d["embedding"]), dtype="<f4") for d in data]
    return [np.asarray(d["embedding"], dtype=np.float32 if name.startswith("float") else np.int16) for d in data]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--vectors", type=int, default=1000)
    parser.add_argument("--batch", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    texts = sentences(args.vectors, seed=3)
    wire = {name: 0 for name in ENCODINGS}
    decode = {name: float("inf") for name in ENCODINGS}
    with tempfile.TemporaryDirectory() as tmp:
        server = ServerProcess(MODEL, Path(tmp) / "server.log", log_level="warning", cache_bytes="0").wait_ready()
        try:
            server.wait_engines()
            for round_ in range(args.rounds):
                order = list(ENCODINGS) if round_ % 2 == 0 else list(ENCODINGS)[::-1]
                for name in order:
                    sent, spent = 0, 0.0
                    for start in range(0, len(texts), args.batch):
                        body = {"input": texts[start : start + args.batch], **ENCODINGS[name]}
                        answer = server.post("/v1/embeddings", json=body)
                        assert answer.status_code == 200, answer.text
                        sent += len(answer.content) + len(answer.headers.get("metadata", ""))
                        t0 = time.perf_counter()
                        decoded(name, answer.content, answer.headers)
                        spent += time.perf_counter() - t0
                    wire[name] = sent
                    decode[name] = min(decode[name], spent)
        finally:
            server.stop()
    per = 1000 / args.vectors
    base_bytes, base_ms = wire["float (JSON)"], decode["float (JSON)"]
    print(
        f"{args.vectors} vectors of all-MiniLM-L6-v2 (384 dimensions), requests of {args.batch}; best of {args.rounds}"
    )
    print(f"{'encoding':<16} {'KB / 1000':>10} {'x float':>8} {'decode ms / 1000':>17} {'x float':>8}")
    for name in ENCODINGS:
        print(
            f"{name:<16} {wire[name] * per / 1024:>10.1f} {wire[name] / base_bytes:>8.3f} "
            f"{decode[name] * per * 1000:>17.2f} {decode[name] / base_ms:>8.3f}"
        )


if __name__ == "__main__":
    main()
