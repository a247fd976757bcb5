"""Images/s through /v1/embeddings at 1 and 32 clients against transformers' get_image_features, with a prober.

The model is a CLIP folder of openai/clip-vit-base-patch32's shapes with random weights, built in a
temporary folder (tests/tiny_vision.py); the images are photo-sized JPEGs (640 x 480, smooth colour
with grain, ~89 KB), sent as data: URLs in Infinity's shape (`"modality": "image"`), one per request
unless a level says more (`8x4`: 8 clients, 4 images a request). The baseline is what a user of
transformers runs on the same files: Pillow's decode, the folder's PIL image processor
(CLIPImageProcessorPil: CLIPImageProcessor without torchvision) and CLIPModel.get_image_features at
batch 32, on as many threads as the server's engines have cores. As in bench.load, each level's time
is split into windows that alternate with baseline runs (the machine drifts), and a level's ratio is
the median of its windows'. Never asserts.
Usage: .venv/bin/python -m bench.images [--seconds 15] [--windows 3] [--clients 1,32,8x4] [--engines N]
         [--raw-images 64] [--probe /health/live] [--source DIR]
--source runs the server from another source tree (a checkout of an older commit), as bench.paired's --b-source.
"""

from __future__ import annotations

import argparse
import base64
import io
import json
import os
import random
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench.common import ROOT, pct
from bench.load import Level, run_level
from tests.server_process import ServerProcess
from tests.tiny_vision import VIT_B_32, build_clip

BATCH = 32  # the baseline's batch


def photos(count: int, size: tuple[int, int] = (640, 480), seed: int = 0) -> list[bytes]:
    """Distinct JPEGs (quality 90) of a photo's size and weight: colour waves with grain, ~89 KB (noise
    alone weighs 276 KB at this size, 3x a photo's bytes; a flat image would decode faster than one)."""
    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(seed)
    width, height = size
    y, x = np.mgrid[0:height, 0:width] / np.array([height, width])[:, None, None]
    out = []
    for _ in range(count):
        phase, freq = rng.uniform(0, 2 * np.pi, 3), rng.uniform(1, 4, 3)
        waves = [128 + 90 * np.sin(2 * np.pi * freq[c] * x + phase[c]) * np.cos(np.pi * freq[c] * y) for c in range(3)]
        pixels = np.clip(np.stack(waves, -1) + rng.normal(0, 8, (height, width, 3)), 0, 255).astype(np.uint8)
        data = io.BytesIO()
        Image.fromarray(pixels).save(data, format="JPEG", quality=90)
        out.append(data.getvalue())
    return out


def data_urls(jpegs: list[bytes]) -> list[str]:
    return [f"data:image/jpeg;base64,{base64.b64encode(data).decode()}" for data in jpegs]


def image_requests(urls: list[str], per_request: int = 1, model: str | None = None) -> Callable[[random.Random], bytes]:
    """Request bodies for bench.load's clients: `per_request` of the images in Infinity's shape, as
    JSON bytes joined from the images' strings encoded once (json.dumps of a 120 KB body is 0.2 ms of
    the cores the server is measured on; the join, 0.01)."""
    encoded = [json.dumps(url).encode() for url in urls]
    head = json.dumps({"model": model} if model else {})[:-1].encode()  # the object left open
    start = head + (b', "input": [' if model else b'"input": [')

    def body(rng: random.Random) -> bytes:
        return start + b", ".join(rng.choices(encoded, k=per_request)) + b'], "modality": "image"}'

    return body


class RawClip:
    """transformers on the same JPEGs: decode, the PIL image processor, get_image_features."""

    def __init__(self, folder: Path, jpegs: list[bytes], count: int, threads: int) -> None:
        import torch
        from transformers import CLIPImageProcessorPil, CLIPModel

        torch.set_num_threads(threads)
        self.torch = torch
        self.model = CLIPModel.from_pretrained(str(folder)).eval()
        self.processor = CLIPImageProcessorPil.from_pretrained(str(folder))
        self.jpegs = [jpegs[i % len(jpegs)] for i in range(count)]
        self.embed(self.jpegs[:BATCH])  # first-call costs

    def embed(self, batch: list[bytes]) -> Any:
        from PIL import Image

        images = [Image.open(io.BytesIO(data)).convert("RGB") for data in batch]
        pixels = self.processor(images=images, return_tensors="pt")["pixel_values"]
        with self.torch.inference_mode():
            return self.model.get_image_features(pixel_values=pixels).pooler_output

    def throughput(self) -> float:
        """Images/s at batch 32."""
        started = time.perf_counter()
        for i in range(0, len(self.jpegs), BATCH):
            self.embed(self.jpegs[i : i + BATCH])
        return len(self.jpegs) / (time.perf_counter() - started)

    def single_latency(self, count: int = 20) -> float:
        """Median ms for one image alone."""
        singles = []
        for data in self.jpegs[:count]:
            started = time.perf_counter()
            self.embed([data])
            singles.append((time.perf_counter() - started) * 1000)
        return statistics.median(singles)


def levels(spec: str) -> list[tuple[int, int]]:
    """'1,32,8x4' -> (clients, images a request) pairs."""
    out = []
    for part in spec.split(","):
        clients, _, per_request = part.partition("x")
        out.append((int(clients), int(per_request or 1)))
    return out


def model_name(server: ServerProcess) -> str:
    return str(server.get("/v1/models").json()["data"][0]["id"])


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seconds", type=float, default=15, help="load per level, all windows together")
    parser.add_argument("--windows", type=int, default=3, help="baseline runs interleaved per level")
    parser.add_argument("--clients", default="1,32,8x4", help="levels: clients, or clients x images a request")
    parser.add_argument("--engines", type=int, help="WARMPOOL_ENGINES (default: the server's)")
    parser.add_argument("--raw-images", type=int, default=64, help="images per baseline run (batches of 32)")
    parser.add_argument("--probe", default="/health/live", help="what the prober polls under load")
    parser.add_argument("--source", type=Path, default=ROOT, help="the source tree the server runs from")
    args = parser.parse_args()
    threads = os.cpu_count() or 1
    jpegs = photos(8)
    urls = data_urls(jpegs)
    results: list[tuple[Level, int]] = []
    single: list[float] = []
    with tempfile.TemporaryDirectory() as tmp:
        folder = build_clip(Path(tmp) / "clip-vit-b-32", shape=VIT_B_32)
        raw = RawClip(folder, jpegs, args.raw_images, threads)
        settings = {"engines": args.engines} if args.engines else {}
        log, source = Path(tmp) / "server.log", args.source.resolve()
        server = ServerProcess(folder, log, source=source, log_level="warning", **settings).wait_ready(600)
        server.wait_engines(300)
        try:
            name = model_name(server)
            for clients, per_request in levels(args.clients):
                body = image_requests(urls, per_request, name)
                if clients == per_request == 1:
                    single.append(raw.single_latency())
                level = run_level(
                    server.port, raw, clients, args.seconds, args.windows, urls, "/v1/embeddings",
                    probe=args.probe, body=body, per_request=per_request,
                )  # fmt: skip
                results.append((level, per_request))
                if clients == per_request == 1:
                    single.append(raw.single_latency())
        finally:
            server.stop()
    if args.source.resolve() != ROOT:
        print(f"server from {args.source}")
    report(results, single, threads, args.probe, sum(map(len, jpegs)) // len(jpegs))


def report(results: list[tuple[Level, int]], single: list[float], threads: int, probe: str, jpeg_bytes: int) -> None:
    print(
        f"ViT-B/32-shaped CLIP, random weights; 640 x 480 JPEGs (~{jpeg_bytes // 1000} KB) as data: URLs. Baseline: "
        f"decode + CLIPImageProcessorPil + CLIPModel.get_image_features, float32, batch {BATCH}, {threads} threads, "
        "images/s"
    )
    for level, per_request in results:
        rates = " / ".join(f"{r:.1f}" for r in level.raw)
        print(f"  around the {level.clients}x{per_request} windows: {rates}")
    print(f"clients  images/req  images/s  x_raw (windows)     p50_ms  p99_ms  {probe} p50/p99/max ms  errors")
    for level, per_request in results:
        t = level.total
        spread = "-".join(f"{r:.2f}" for r in (min(level.ratios), max(level.ratios)))
        probes = f"{pct(t.probes, 0.5):.2f} / {t.probe_p99:.2f} / {max(t.probes, default=float('nan')):.2f}"
        print(
            f"{level.clients:7d}  {per_request:10d}  {t.inputs_s:8.1f}  {statistics.median(level.ratios):5.2f} "
            f"({spread})  {pct(t.latencies, 0.5):6.1f}  {pct(t.latencies, 0.99):6.1f}  {probes:>22}  {t.errors:6d}"
        )
    print("where a request's time goes, server means per request, ms (prepare: parse, decode, preprocess):")
    for level, per_request in results:
        m = level.stages
        print(
            f"  {level.clients:3d}x{per_request}: at the client {statistics.mean(level.total.latencies):6.1f} = "
            f"in the handler {m['handler']:6.1f} (prepare {m['tokenize']:5.1f}, to the engine {m['queue']:5.1f}, "
            f"forward {m['forward']:5.1f}) + outside it {statistics.mean(level.total.latencies) - m['handler']:5.1f}"
        )
    if single:
        print(f"baseline, one image alone: p50 {statistics.mean(single):.1f} ms")


if __name__ == "__main__":
    main()
