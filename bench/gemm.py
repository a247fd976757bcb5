"""Know the machine: the GEMM rate of each backend torch can use for the engine's projections, per
precision, on this CPU, against the machine's peak measured in the same run.

Shapes: all-MiniLM-L6-v2's projections (hidden 384): [M x 384] x [384 x 1152] (fused QKV),
[M x 384] x [384 x 384], [M x 384] x [384 x 1536], [M x 1536] x [1536 x 384], at M rows (a packed
group's tokens). Backends, each on the same input and weight:
- `aten`: F.linear, as nn.Linear calls it (float32: MKL's sgemm; bfloat16: oneDNN's matmul, the
  weight reordered on every call);
- `onednn-packed`: torch.ops.mkldnn._linear_pointwise on a weight reordered once by
  torch.ops.mkldnn._reorder_linear_weight (what torch.compile's CPU freezing pass does), packed for
  --pack-rows rows as an engine would pack it once for every M;
- `onednn-plain`: the same operator on the plain [out x in] weight;
- `mkl-packed` (float32): torch.ops.mkl._mkl_linear on cblas_sgemm_pack's weight, packed for this M
  exactly (torch falls back to F.linear on any other M, so an engine could not use it for a packed
  group's varying count);
- `openblas` (float32): numpy's matmul (the wheel's OpenBLAS), its threads held to torch's by
  threadpoolctl, in a table of its own (its threads spin after a call: interleaved with torch's
  OpenMP pool, each slowed the other's next call many times over).
Each cell's backends run in rotating order for --rounds rounds, each call repeated to ~3 ms a round;
GFLOP/s from each backend's median, and the median of the per-round ratios to `aten` (this machine
drifts by tens of percent within a minute; the ratios see the same drift). The peak: a 2048-cube
product, best of the backends. Then, per backend (float32), the row counts M at which a product's
rows differ in bits from the same rows inside a 2048-row product (batch invariance:
engine/precision/rows.py), and MKL's dispatch under its environment knobs (MKL_ENABLE_INSTRUCTIONS,
MKL_DEBUG_CPU_TYPE), each in a subprocess (read when MKL loads), MKL_VERBOSE's line saying which code
path it took, and the float32 rates there. Never asserts.
Usage: .venv/bin/python -m bench.gemm [--rounds 7] [--threads N] [--rows 8,32,128,512,2048]
       [--dtypes float32,bfloat16] [--pack-rows 384] [--no-knobs]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

HIDDEN = 384
SHAPES = {"qkv 384>1152": (HIDDEN, 3 * HIDDEN), "out 384>384": (HIDDEN, HIDDEN), "up 384>1536": (HIDDEN, 4 * HIDDEN)}
SHAPES["down 1536>384"] = (4 * HIDDEN, HIDDEN)
PEAK_SIZE = 2048
ROUND_S = 0.003  # each backend's share of a round: calls repeated to about this long
INVARIANCE_ROWS = [*range(1, 65), 100, 171, 172, 255, 256, 257, 384, 511]
KNOBS: dict[str, dict[str, str]] = {
    "default": {},
    "MKL_ENABLE_INSTRUCTIONS=AVX512": {"MKL_ENABLE_INSTRUCTIONS": "AVX512"},
    "MKL_ENABLE_INSTRUCTIONS=AVX2": {"MKL_ENABLE_INSTRUCTIONS": "AVX2"},
    "MKL_DEBUG_CPU_TYPE=5": {"MKL_DEBUG_CPU_TYPE": "5"},
}
KNOB_ROWS = (32, 512)


def backends(weight: Any, bias: Any, rows: int, pack_rows: int, openblas: bool) -> dict[str, Callable[[Any], Any]]:
    """Each backend's product y = x W^T + b for this weight, made ready (weights packed) beforehand:
    torch's (one OpenMP pool), or with `openblas` numpy's alone (its own threads spin after a call and
    would slow the pool's next call: the two are never interleaved)."""
    import numpy as np
    import torch
    import torch.nn.functional as F

    if openblas:
        w_t, b_np = weight.t().contiguous().numpy(), bias.numpy()
        return {"openblas": lambda x: np.add(np.matmul(x.numpy(), w_t), b_np)}
    calls: dict[str, Callable[[Any], Any]] = {"aten": lambda x: F.linear(x, weight, bias)}
    try:
        packed = torch.ops.mkldnn._reorder_linear_weight(weight, pack_rows)
        calls["onednn-packed"] = lambda x: torch.ops.mkldnn._linear_pointwise(x, packed, bias, "none", [], "")
    except RuntimeError:  # oneDNN packs bfloat16 only on AVX-512 (BW/VL/DQ) or AVX-NE-CONVERT CPUs
        pass
    calls["onednn-plain"] = lambda x: torch.ops.mkldnn._linear_pointwise(x, weight, bias, "none", [], "")
    if weight.dtype == torch.float32 and torch._C.has_mkl:
        mkl_packed = torch.ops.mkl._mkl_reorder_linear_weight(weight, rows)
        calls["mkl-packed"] = lambda x: torch.ops.mkl._mkl_linear(x, mkl_packed, weight, bias, rows)
    return calls


def timed(call: Callable[[], Any], reps: int) -> float:
    started = time.perf_counter()
    for _ in range(reps):
        call()
    return (time.perf_counter() - started) / reps


def measure(calls: dict[str, Callable[[Any], Any]], x: Any, rounds: int) -> dict[str, tuple[float, float]]:
    """Each backend's median seconds a call and median ratio of its time to `aten`'s, rounds rotating
    the order."""
    names = list(calls)
    base = "aten" if "aten" in calls else names[0]
    reps = {}
    for name in names:
        for _ in range(3):  # first-call costs (kernels built, caches filled) out of the rounds
            calls[name](x)
        reps[name] = max(1, min(500, int(ROUND_S / max(timed(lambda n=name: calls[n](x), 1), 1e-7))))  # type: ignore[misc]
    times: dict[str, list[float]] = {name: [] for name in names}
    for r in range(rounds):
        for name in names[r % len(names) :] + names[: r % len(names)]:
            times[name].append(timed(lambda n=name: calls[n](x), reps[name]))  # type: ignore[misc]
    return {
        name: (
            statistics.median(times[name]),
            statistics.median(t / a for t, a in zip(times[name], times[base], strict=True)),
        )
        for name in names
    }


def peak(dtype: Any, rounds: int, pack_rows: int) -> tuple[float, str]:
    """GFLOP/s of the best backend on a PEAK_SIZE-cube product, and which."""
    import torch

    w = torch.randn(PEAK_SIZE, PEAK_SIZE).to(dtype)
    x, b = torch.randn(PEAK_SIZE, PEAK_SIZE).to(dtype), torch.zeros(PEAK_SIZE).to(dtype)
    calls = {k: v for k, v in backends(w, b, PEAK_SIZE, pack_rows, False).items() if k in ("aten", "onednn-packed")}
    tries = max(3, rounds // 2)
    best = {name: min(timed(lambda c=call: c(x), 1) for _ in range(tries)) for name, call in calls.items()}  # type: ignore[misc]
    name = min(best, key=lambda n: best[n])
    return 2 * PEAK_SIZE**3 / best[name] / 1e9, name


def peak_aten(dtype: Any) -> float:
    """GFLOP/s of F.linear on a PEAK_SIZE-cube product, best of 3."""
    import torch
    import torch.nn.functional as F

    w, x = torch.randn(PEAK_SIZE, PEAK_SIZE).to(dtype), torch.randn(PEAK_SIZE, PEAK_SIZE).to(dtype)
    return 2 * PEAK_SIZE**3 / min(timed(lambda: F.linear(x, w), 1) for _ in range(3)) / 1e9


def table(dtype_name: str, rows: list[int], rounds: int, pack_rows: int, openblas: bool = False) -> None:
    import torch

    dtype = getattr(torch, dtype_name)
    top, top_name = peak(dtype, rounds, pack_rows)
    what = "numpy's OpenBLAS alone (not interleaved with torch's)" if openblas else "torch's backends"
    print(f"\n{dtype_name}, {what}: peak {top:.0f} GFLOP/s ({PEAK_SIZE}-cube, {top_name})")
    header = None
    gen = torch.Generator().manual_seed(0)
    for shape, (k, n) in SHAPES.items():
        w = (torch.randn(n, k, generator=gen) / k**0.5).to(dtype)
        b = torch.randn(n, generator=gen).to(dtype)
        for m in rows:
            x = torch.randn(m, k, generator=gen).to(dtype)
            calls = backends(w, b, m, pack_rows, openblas)
            if header is None:
                header = list(calls)
                print(f"{'shape':<14} {'M':>5}  " + "  ".join(f"{name + ' GF/s (x aten)':>26}" for name in header))
            with torch.inference_mode():
                result = measure(calls, x, rounds)
            flops = 2 * m * k * n
            rates = {name: flops / result[name][0] / 1e9 for name in header}
            cells = [f"{rates[name]:>7.1f} {100 * rates[name] / top:>3.0f}%" for name in header]
            ratio = [f"(x{1 / result[name][1]:.2f})" for name in header]
            print(f"{shape:<14} {m:>5}  " + "  ".join(f"{c:>17} {r:>8}" for c, r in zip(cells, ratio, strict=True)))


def invariance(pack_rows: int) -> None:
    """Per float32 backend, the row counts whose rows get other bits than inside a 2048-row product."""
    import torch

    gen = torch.Generator().manual_seed(1)
    print("\nfloat32 batch invariance: M whose rows differ in bits from the same rows of a 2048-row product")
    for shape, (k, n) in SHAPES.items():
        w, b = torch.randn(n, k, generator=gen) / k**0.5, torch.randn(n, generator=gen)
        x = torch.randn(2048, k, generator=gen)
        for name, call in backends(w, b, 2048, pack_rows, False).items():
            if name in ("mkl-packed",):  # packed for one M: any other M runs F.linear
                continue
            with torch.inference_mode():
                full = torch.as_tensor(call(x))
                bad = [m for m in INVARIANCE_ROWS if not torch.equal(torch.as_tensor(call(x[:m])), full[:m])]
            print(f"  {shape:<14} {name:<14} {len(bad):>3} of {len(INVARIANCE_ROWS)}: {bad[:12]}")


KNOB_PROBE = """
import json, sys, time, statistics, torch, torch.nn.functional as F
torch.set_num_threads(int(sys.argv[1]))
w, b = torch.randn(1536, 384), torch.randn(1536)
out = {}
for m in json.loads(sys.argv[2]):
    x = torch.randn(m, 384)
    for _ in range(3):
        F.linear(x, w, b)
    reps = max(1, int(0.003 / (2 * m * 384 * 1536 / 100e9)))
    times = []
    for _ in range(int(sys.argv[3])):
        t = time.perf_counter()
        for _ in range(reps):
            F.linear(x, w, b)
        times.append((time.perf_counter() - t) / reps)
    out[m] = 2 * m * 384 * 1536 / statistics.median(times) / 1e9
print("RESULT " + json.dumps(out))
"""


def knobs(threads: int, rounds: int) -> None:
    """MKL's float32 path under each environment knob, each in its own interpreter, runs alternating."""
    print(f"\nMKL's environment knobs (float32, [M x 384] x [384 x 1536], F.linear; {rounds} runs each, alternating)")
    rates: dict[str, list[dict[str, float]]] = {name: [] for name in KNOBS}
    paths: dict[str, str] = {}
    for _ in range(max(2, rounds // 3)):
        for name, env in KNOBS.items():
            run_env = {**os.environ, **env, "MKL_VERBOSE": "1"}
            args = [str(threads), json.dumps(list(KNOB_ROWS)), str(rounds)]
            done = subprocess.run(
                [sys.executable, "-c", KNOB_PROBE, *args], env=run_env, capture_output=True, text=True, timeout=300
            )
            lines = done.stdout.splitlines()
            path = next((line for line in lines if "MKL_VERBOSE" in line and "Version" not in line), "")
            paths.setdefault(name, next((line for line in lines if "oneMKL" in line or "Intel(R)" in line), path))
            result = next((line for line in lines if line.startswith("RESULT ")), None)
            if result is None:
                paths[name] = f"failed: {done.stderr.strip()[-200:]}"
                continue
            rates[name].append({int(m): v for m, v in json.loads(result[7:]).items()})
    for name, runs in rates.items():
        figures = ", ".join(
            f"M={m}: {statistics.median(run[m] for run in runs):.1f} GFLOP/s" for m in KNOB_ROWS if runs
        )
        print(f"  {name:<32} {figures}")
        print(f"    {paths.get(name, '')[:220]}")


ONEDNN_PROBE = """
import torch
w = torch.randn(1536, 384)
for dtype in (torch.float32, torch.bfloat16):
    packed = torch.ops.mkldnn._reorder_linear_weight(w.to(dtype), 384)
    torch.ops.mkldnn._linear_pointwise(torch.randn(128, 384).to(dtype), packed, None, "none", [], "")
"""


def onednn_paths() -> None:
    """oneDNN's own word (ONEDNN_VERBOSE) on the instruction set and kernel its packed products run on."""
    env = {**os.environ, "ONEDNN_VERBOSE": "1"}
    done = subprocess.run([sys.executable, "-c", ONEDNN_PROBE], env=env, capture_output=True, text=True, timeout=120)
    lines = done.stdout.splitlines()
    print("\noneDNN (ONEDNN_VERBOSE) for a packed [128 x 384] x [384 x 1536], float32 then bfloat16:")
    for line in [line for line in lines if "isa:" in line][:1] + [line for line in lines if ",exec," in line][-2:]:
        print(f"  {line[:220]}")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--threads", type=int, default=0, help="torch threads (default: torch's own)")
    parser.add_argument("--rows", default="8,32,128,512,2048")
    parser.add_argument("--dtypes", default="float32,bfloat16")
    parser.add_argument("--pack-rows", type=int, default=384, help="rows oneDNN's packed weight is packed for")
    parser.add_argument("--no-knobs", action="store_true", help="skip the MKL environment knobs' subprocesses")
    args = parser.parse_args()

    import torch
    from threadpoolctl import threadpool_limits

    threads = args.threads or torch.get_num_threads()
    torch.set_num_threads(threads)
    rows = [int(r) for r in args.rows.split(",")]
    with open("/proc/cpuinfo") as info:
        cpu = next((line.split(":", 1)[1].strip() for line in info if line.startswith("model name")), "?")
    print(f"{cpu}, {threads} threads, torch {torch.__version__}, {args.rounds} rounds (rotating order) per cell")
    print("GFLOP/s and % of the precision's peak; (x aten): median per-round speed ratio against F.linear")
    with threadpool_limits(limits=threads, user_api="blas"):
        for dtype in args.dtypes.split(","):
            if dtype == "bfloat16" and not torch.ops.mkldnn._is_mkldnn_bf16_supported():
                # oneDNN has no bfloat16 kernels for it (its products fail), aten's emulate: the
                # appliance refuses WARMPOOL_DTYPE=bfloat16 on such a CPU (engine/runtime/device.py)
                top = peak_aten(torch.bfloat16)
                print(f"\nbfloat16: this CPU has no bfloat16 instructions (peak {top:.0f} GFLOP/s, emulated)")
                continue
            table(dtype, rows, args.rounds, args.pack_rows)
        if "float32" in args.dtypes:
            table("float32", rows, args.rounds, args.pack_rows, openblas=True)
        invariance(args.pack_rows)
    if not args.no_knobs:
        knobs(threads, args.rounds)
        onednn_paths()


if __name__ == "__main__":
    main()
