"""Which GEMM backend an eager CPU engine's float32 layer projections run on: MKL (nn.Linear's sgemm)
or oneDNN on a weight packed once, chosen per CPU class by measuring both on the model's shapes.

On 2 cores of an AMD EPYC Zen 4 (torch 2.13: MKL 2024.2, oneDNN 3.x; bench.gemm) MKL takes a generic
path on this AMD CPU and its knobs (MKL_ENABLE_INSTRUCTIONS; MKL_DEBUG_CPU_TYPE, ignored) did not
help, while oneDNN's AVX-512 kernels on a packed weight ran all-MiniLM-L6-v2's projections
1.07-1.76x faster in every (shape, rows) cell measured, 8 to 2048 rows (docs/operations/gemm.md).
Which wins depends on the CPU, so it is measured, not assumed: per projection shape (in, out), each
backend at PROBE_ROWS rows, best of a few calls (tens of ms a model, when it is built: never on the
request path); oneDNN where it took less time over them. The choice is kept in a record beside the
compile cache, keyed as its artifacts are (torch, the CPU's instruction set, precision): the next
start reads it, another CPU class misses and measures again.

The packed weight replaces the plain one (built where the model is built: in the forkserver, one copy
for every engine). oneDNN builds and keeps a kernel per row count: below FLOAT32_EXACT_FROM rows they
go on a multiple of ROW_STEP (at most 15 zero rows: 15 kernels a shape), from it as they are, since
the copy padding makes of a large group's input cost more than oneDNN gains (32 inputs of ~20 tokens:
0.97x MKL's speed padded, 1.22x not; groups of 256-511 rows each new to the caches still 1.07x), and
its caches are capped (engine/precision/rows.py): an engine's memory stays bounded whatever the
lengths. Its rows keep their bits whatever the count from 2 rows (bench.gemm: none of 2-64, ...,
511 differ inside a 2048-row product, where MKL's few-row products do), so a text's vector is the
same alone and in any group. A compiled engine runs the graph's own products (MKL's): the choice is
for eager engines (WARMPOOL_COMPILE=off).
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from engine.precision.rows import FLOAT32_EXACT_FROM, ROW_STEP, RowBucketed, cap_kernel_caches
from engine.runtime.device import cpu_class

PROBE_ROWS = (16, 64, 384)  # a short input, a few, a packed group (engine.runtime.batching.GROUP_TOKENS)
PROBE_CALLS = 3  # per backend and row count: the best of them
PACK_ROWS = 384  # the rows oneDNN picks the packed layout for: a packed group's
RECORDS = "gemm"  # the records' folder in the compile cache
BACKENDS = ("mkl", "onednn")


class OneDnnLinear(nn.Module):
    """y = x W^T + b on oneDNN, with W reordered once into the blocked layout its kernel reads."""

    bias: torch.Tensor | None

    def __init__(self, linear: nn.Linear) -> None:
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        # a buffer: an opaque oneDNN tensor, not a parameter anything trains or saves
        self.register_buffer("packed", torch.ops.mkldnn._reorder_linear_weight(linear.weight.detach(), PACK_ROWS))
        self.register_buffer("bias", None if linear.bias is None else linear.bias.detach())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.reshape(-1, self.in_features)
        out = torch.ops.mkldnn._linear_pointwise(rows, self.packed, self.bias, "none", [], "")
        return out.view(*x.shape[:-1], self.out_features)  # type: ignore[no-any-return]

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, oneDNN packed"


def record_key(precision: str) -> str:
    """The record's name: what the compile cache's key holds of the machine (engine/compiling/package.py)."""
    facts = {"torch": torch.__version__, "isa": cpu_class(), "precision": precision}
    return hashlib.sha256(json.dumps(facts, sort_keys=True).encode()).hexdigest()[:32]


def choose(shapes: set[tuple[int, int]], precision: str, cache: Path) -> dict[str, str]:
    """The backend of each (in, out) projection shape, as "INxOUT": the record's where it holds every
    shape, else measured now and the record written (a cache that cannot be written costs a re-measure)."""
    path = cache / RECORDS / f"{record_key(precision)}.json"
    try:
        known: dict[str, str] = json.loads(path.read_text())["choice"]
    except (OSError, ValueError, KeyError, TypeError):
        known = {}
    wanted = {f"{k}x{n}" for k, n in shapes}
    if wanted <= known.keys() and all(known[s] in BACKENDS for s in wanted):
        return {s: known[s] for s in wanted}
    choice = {**known, **{f"{k}x{n}": measure(k, n) for k, n in sorted(shapes)}}
    record = {"choice": choice, "threads": torch.get_num_threads(), "cpu": cpu_class()[:2]}
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        partial = path.with_suffix(f".{os.getpid()}.partial")
        partial.write_text(json.dumps(record, sort_keys=True))
        partial.replace(path)  # whole or not at all, whichever engine writes last
    except OSError:
        pass
    return {s: choice[s] for s in wanted}


def measure(k: int, n: int) -> str:
    """The faster backend for an [M x k] x [k x n] product with bias, summed over PROBE_ROWS."""
    gen = torch.Generator().manual_seed(0)
    linear = nn.Linear(k, n)
    with torch.no_grad():
        linear.weight.copy_(torch.randn(n, k, generator=gen) / k**0.5)
    onednn = OneDnnLinear(linear)
    spent = dict.fromkeys(BACKENDS, 0.0)
    with torch.inference_mode():
        for m in PROBE_ROWS:
            x = torch.randn(m, k, generator=gen)
            calls = {"mkl": lambda x=x: F.linear(x, linear.weight, linear.bias), "onednn": lambda x=x: onednn(x)}
            for call in calls.values():
                call()  # first-call costs (oneDNN's kernel for this count) out of the timing
            for name, call in calls.items():
                spent[name] += min(_timed(call) for _ in range(PROBE_CALLS))
    return min(BACKENDS, key=lambda name: spent[name])


def _timed(call: Any) -> float:
    started = time.perf_counter()
    call()
    return time.perf_counter() - started


def select(model: nn.Module, precision: str, cache: Path) -> int:
    """Put the float32 layer projections of `model` on oneDNN where the choice says so, in place; the
    number moved (none in another precision: bfloat16's run on oneDNN already, int8's on _int_mm)."""
    if precision != "float32" or not torch.backends.mkldnn.is_available():  # a torch built without oneDNN: MKL
        return 0
    cap_kernel_caches()  # before oneDNN's first use in this process, which measuring may be
    found = _wrapped(model)
    choice = choose({(c.in_features, c.out_features) for _, _, c in found}, precision, cache)
    moved = 0
    for parent, name, linear in found:
        if choice[f"{linear.in_features}x{linear.out_features}"] == "onednn":
            setattr(parent, name, on_onednn(linear))
            moved += 1
    return moved


def on_onednn(linear: nn.Linear) -> RowBucketed:
    """The projection as the engine runs it on oneDNN: its packed weight, its rows' counts bounded."""
    return RowBucketed(OneDnnLinear(linear), ROW_STEP, FLOAT32_EXACT_FROM)


def _wrapped(model: nn.Module) -> list[tuple[nn.Module, str, nn.Linear]]:
    """The layers' projections (engine/precision/rows.py layer_projections), seen through the
    RowBucketed wrapper float32 gives them: (the wrapper's parent, its name, the projection)."""
    found: dict[tuple[int, str], tuple[nn.Module, str, nn.Linear]] = {}  # a stack inside a stack: once
    for stack in [m for m in model.modules() if isinstance(m, nn.ModuleList)]:
        for parent in list(stack.modules()):
            for name, child in list(parent.named_children()):
                inner = child.inner if isinstance(child, RowBucketed) else child
                if type(inner) is nn.Linear:
                    found[(id(parent), name)] = (parent, name, inner)
    return list(found.values())


def describe(model: nn.Module) -> dict[str, Any]:
    """How many layer projections run on oneDNN's packed weights, for the engine phase; {} for none."""
    moved = sum(isinstance(m, OneDnnLinear) for m in model.modules())
    return {"gemm": f"oneDNN packed: {moved} projections (float32, chosen for this CPU)"} if moved else {}
