"""LoRA adapters on all-MiniLM-L6-v2 (or the 1.3 GB BERT-large shape of bench.bigmodel: --base 1.3): what
serving through them costs against the base, in the same run.

For each count of random rank-16 adapters on q, k, v and the attention output (loaded at run time through
POST /admin/adapters/NAME/load), one server: the load time per adapter, the memory each holds in an engine
against its file's size, inputs/s at --clients clients each request naming a random adapter against the base
alone (alternating phases), and the 1-client p50 of both (one client alternating base and adapter request
by request: paired). Then, with WARMPOOL_ADAPTER_BYTES room for one adapter, two adapters named in turn by
one client: each request loads its adapter again on demand, from the page cache (warm) and with the
adapter's file evicted from it first (cold); its p50 against the base's is the on-demand load time.
Prints ratios; never asserts.
Usage: .venv/bin/python -m bench.adapters [--adapters 1,8,64] [--seconds 8] [--clients 32] [--rounds 2]
         [--base 0.1|1.3]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from bench.bigmodel import make_model
from bench.common import MODEL, Connection, pct, run, sentences
from tests.server_process import ServerProcess

RANK = 16
TARGETS = ("attention.self.query", "attention.self.key", "attention.self.value", "attention.output.dense")


def write_adapter(dest: Path, seed: int, base: Path) -> Path:
    """A PEFT folder of random rank-16 updates on every layer's q, k, v and attention output of `base`."""
    import torch
    from safetensors.torch import save_file

    config = json.loads((base / "config.json").read_text())
    layers, hidden = config["num_hidden_layers"], config["hidden_size"]
    generator = torch.Generator().manual_seed(seed)
    weights = {}
    for layer in range(layers):
        for target in TARGETS:
            key = f"base_model.model.encoder.layer.{layer}.{target}"
            weights[f"{key}.lora_A.weight"] = torch.randn(RANK, hidden, generator=generator) * 0.02
            weights[f"{key}.lora_B.weight"] = torch.randn(hidden, RANK, generator=generator) * 0.02
    dest.mkdir(parents=True)
    save_file(weights, str(dest / "adapter_model.safetensors"))
    config = {
        "peft_type": "LORA",
        "r": RANK,
        "lora_alpha": 2 * RANK,
        "target_modules": ["query", "key", "value", "attention.output.dense"],
    }
    (dest / "adapter_config.json").write_text(json.dumps(config))
    return dest


async def load_all(port: int, names: list[str]) -> tuple[list[float], list[int]]:
    """Each adapter loaded through the admin API: its ms, and the bytes an engine holds for it."""
    conn, ms, held = Connection(port), [], []
    for name in names:
        t0 = time.perf_counter()
        status, _, body = await conn.post(f"/admin/adapters/{name}/load", {"path": name})
        assert status == 200, body
        ms.append((time.perf_counter() - t0) * 1000)
        held.append(json.loads(body)["memory_bytes"])
    conn.close()
    return ms, held


async def phase(port: int, seconds: float, clients: int, models: list[str | None], texts: list[str]) -> list[float]:
    """Request latencies (ms) of `clients` clients for `seconds`, each request one input naming a model of
    `models` at random (None: the base)."""
    deadline, latencies = time.perf_counter() + seconds, []

    async def client(seed: int) -> None:
        rng, conn = random.Random(seed), Connection(port)
        while time.perf_counter() < deadline:
            name = rng.choice(models)
            body = {"input": rng.choice(texts), **({"model": name} if name else {})}
            t0 = time.perf_counter()
            status, _, _ = await conn.post("/v1/embeddings", body)
            if status == 200:
                latencies.append((time.perf_counter() - t0) * 1000)
        conn.close()

    await asyncio.gather(*(client(seed) for seed in range(clients)))
    return latencies


async def alternating(
    port: int, seconds: float, names: list[str | None], texts: list[str], before: Callable[[str | None], None]
) -> dict[str | None, list[float]]:
    """One client naming `names` in turn (None: the base), `before(name)` run ahead of each request: each
    name's latencies (ms)."""
    deadline, conn, turn = time.perf_counter() + seconds, Connection(port), 0
    latencies: dict[str | None, list[float]] = {name: [] for name in names}
    while time.perf_counter() < deadline:
        name = names[turn % len(names)]
        before(name)
        t0 = time.perf_counter()
        status, _, _ = await conn.post(
            "/v1/embeddings", {"input": texts[turn % len(texts)], **({"model": name} if name else {})}
        )
        if status == 200:
            latencies[name].append((time.perf_counter() - t0) * 1000)
        turn += 1
    conn.close()
    return latencies


def evict(folder: Path) -> None:
    """The adapter's file dropped from the page cache (a cold load reads the disk)."""
    fd = os.open(folder / "adapter_model.safetensors", os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def one_count(base: Path, root: Path, count: int, args: argparse.Namespace, texts: list[str]) -> None:
    names = [f"a{i}" for i in range(count)]
    server = ServerProcess(base, root / f"server-{count}.log", adapter_root=root).wait_ready()
    try:
        load_ms, held = run(load_all(server.port, names))
        size = statistics.median((root / n / "adapter_model.safetensors").stat().st_size for n in names)
        rates: dict[str, list[float]] = {"base": [], "adapters": []}
        p50: dict[str, list[float]] = {"base": [], "adapters": []}
        for _ in range(args.rounds):
            for label, models in (("base", [None]), ("adapters", list(names))):
                rates[label].append(
                    len(run(phase(server.port, args.seconds, args.clients, models, texts))) / args.seconds
                )
            paired = run(alternating(server.port, args.seconds, [None, names[0]], texts, lambda _: None))
            p50["base"].append(pct(paired[None], 0.5))
            p50["adapters"].append(pct(paired[names[0]], 0.5))
        plain, adapted = statistics.median(rates["base"]), statistics.median(rates["adapters"])
        print(
            f"{count:>3} adapters: load {statistics.median(load_ms):.1f} ms each (median), "
            f"{statistics.median(held) / 1e6:.2f} MB per engine each vs file {size / 1e6:.2f} MB; "
            f"{args.clients} clients: base {plain:.0f} inputs/s, adapters {adapted:.0f} ({adapted / plain:.2f}x); "
            f"1 client p50: base {statistics.median(p50['base']):.1f} ms, "
            f"adapter {statistics.median(p50['adapters']):.1f} ms "
            f"({statistics.median(p50['adapters']) / statistics.median(p50['base']):.2f}x)"
        )
    finally:
        server.stop()


def on_demand(base: Path, root: Path, args: argparse.Namespace, texts: list[str]) -> None:
    cap = int(1.5 * (root / "a0" / "adapter_model.safetensors").stat().st_size)  # room for one
    if not (root / "a1").exists():
        write_adapter(root / "a1", seed=1, base=base)
    server = ServerProcess(base, root / "server-cap.log", adapter_root=root, adapter_bytes=cap).wait_ready()
    try:
        run(load_all(server.port, ["a0", "a1"]))

        def cold(name: str | None) -> None:
            if name:
                evict(root / name)

        for label, before in (("warm", lambda _: None), ("cold", cold)):
            got = run(alternating(server.port, args.seconds / 2, [None, "a0", None, "a1"], texts, before))
            plain = pct(got[None], 0.5)
            reloading = pct(got["a0"] + got["a1"], 0.5)
            print(
                f"on demand, page cache {label} (room for one adapter, two named in turn, base requests between): "
                f"p50 {reloading:.1f} ms vs base {plain:.1f} ms: a load on demand ~{reloading - plain:.1f} ms"
            )
    finally:
        server.stop()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--adapters", default="1,8,64")
    parser.add_argument("--seconds", type=float, default=8.0)
    parser.add_argument("--clients", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--base", choices=("0.1", "1.3"), default="0.1", help="the base's GB (bench.bigmodel's)")
    args = parser.parse_args()
    counts = [int(n) for n in args.adapters.split(",")]
    texts = sentences(512)
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "adapters"
        root.mkdir()
        base = MODEL if args.base == "0.1" else make_model(args.base, Path(tmp))
        print(f"base: {base.name}")
        for i in range(max(counts)):
            write_adapter(root / f"a{i}", seed=i, base=base)
        for count in counts:
            one_count(base, root, count, args, texts)
        on_demand(base, root, args, texts)


if __name__ == "__main__":
    main()
