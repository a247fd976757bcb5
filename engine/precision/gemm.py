"""Which GEMM backend a CPU engine's float32 and bfloat16 layer projections run on: nn.Linear's
(float32: MKL's sgemm; bfloat16: oneDNN on the plain weight, reordered at every call) or oneDNN on a
weight packed once, chosen per CPU class by measuring both on the model's shapes.

MKL takes a generic path on AMD CPUs and its knobs (MKL_ENABLE_INSTRUCTIONS; MKL_DEBUG_CPU_TYPE,
ignored) do not help, while oneDNN's AVX-512 kernels on a packed weight ran all-MiniLM-L6-v2's
projections 1.07-1.76x faster on 2 cores of a Zen 4 and 2.2-2.6x on a Zen 5, in every (shape, rows)
cell measured, 8 to 2048 rows (bench.gemm; docs/operations/gemm.md). Which wins depends on the CPU,
so it is measured, not assumed (bfloat16 too: its packed weight ran a Zen 5's products 1.1-2.4x
faster, with the same bits): per projection shape (in, out), each backend at PROBE_ROWS rows,
best of a few calls (tens of ms a model, when it is built: never on the request path); oneDNN where
it took less time over them. The choice is kept in a record beside the compile cache, keyed as its
artifacts are (torch, the CPU's instruction set, precision): the next start reads it, another CPU
class misses and measures again.

Every such projection is a PackedLinear: an nn.Linear whose product is one operator,
warmpool::linear, in eager engines and in compiled graphs alike (a compiled graph would otherwise
run MKL's addmm: 0.6x the eager engine's speed on the Zen 5). Where oneDNN is chosen, the packed
weight is made where the model is built (in the forkserver: one copy for every engine) and kept in
PACKED under the address of the tensor that takes the plain weight's place: one element, broadcast
to the weight's shape, so that the parameter keeps its name, shape and dtype (a compiled package
is handed the model's tensors by name) and the model holds no second copy.

oneDNN builds and keeps a kernel per row count (~1 MB each for these shapes, ~0.25 ms to build), so
rows go on a multiple of ROW_STEP (at most 15 zero rows; in a compiled graph the wrapper's padding is
fused into the operation before it, and the operator copies nothing: two copies, a wrapper's to a
multiple of 4 and the operator's, cost 5-10 % of a 32-client group's forward) and its caches are capped
(engine/precision/rows.py): an engine's memory stays bounded whatever the lengths. Against exact
counts, on the Zen 5, 3,000 products of 200-700 rows took 0.75x the time (no kernel built after the
first few dozen) and held 100 MB of kernels instead of 371. Its rows keep their bits whatever the
count from 2 rows (bench.gemm: none of 2-64, ..., 511 differ inside a 2048-row product, where MKL's
few-row products do), so a text's vector is the same alone and in any group.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
import weakref
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from engine.precision.rows import ROW_STEP, RowBucketed, cap_kernel_caches, layer_projections
from engine.runtime.device import Placement, cpu_class

PROBE_ROWS = (16, 64, 384)  # a short input, a few, a packed group (engine.runtime.batching.GROUP_TOKENS)
PROBE_CALLS = 3  # per backend and row count: the best of them
PACK_ROWS = 384  # the rows oneDNN picks the packed layout for: a packed group's
RECORDS = "gemm"  # the records' folder in the compile cache
BACKENDS = ("mkl", "onednn")  # "mkl": F.linear (in bfloat16, oneDNN on the plain weight, reordered per call)
PACKABLE = {torch.float32: "float32", torch.bfloat16: "bfloat16"}
LINEAR_SCHEMA = "linear(Tensor x, Tensor weight, Tensor? bias) -> Tensor"

# the address of the tensor standing in a packed projection's weight -> (that tensor, kept so that
# no other takes its address while the entry lives; oneDNN's packed copy of the weight)
PACKED: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}


def product(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """x W^T + b: on oneDNN's packed copy of `weight` if one was made (pack()), on a multiple of
    ROW_STEP rows (zero rows added, their outputs cut off: oneDNN builds and keeps a kernel per
    count); else nn.Linear's."""
    entry = PACKED.get(weight.data_ptr())
    if entry is None:
        return F.linear(x, weight, bias)
    rows = x.reshape(-1, x.shape[-1])
    n = rows.shape[0]
    if n % ROW_STEP:  # eager float32 from FLOAT32_EXACT_FROM rows: the wrapper (route()) left them be
        rows = F.pad(rows, (0, 0, 0, (-n) % ROW_STEP))
    out = onednn(rows, entry[1], bias)[:n]
    return out.view(*x.shape[:-1], out.shape[-1])


def onednn(rows: torch.Tensor, packed: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    return torch.ops.mkldnn._linear_pointwise(rows, packed, bias, "none", [], "")  # type: ignore[no-any-return]


# One operator for a compiled graph (engine/compiling/package.py registers its shape function);
# the low-level Library API, as warmpool::attend's (engine/layers/encoder.py).
_LIBRARY = torch.library.Library("warmpool", "FRAGMENT")
_LIBRARY.define(LINEAR_SCHEMA)
_LIBRARY.impl("linear", product, "CompositeExplicitAutograd")


def linear_shape(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """warmpool::linear's output for the exporter, which traces shapes, not values."""
    return x.new_empty((*x.shape[:-1], weight.shape[0]))


class PackedLinear(nn.Linear):
    """An nn.Linear (its weight and bias, under their names) whose product is product(): a graph
    being compiled sees one warmpool::linear, an eager forward calls it directly."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if torch.compiler.is_compiling():
            return torch.ops.warmpool.linear(x, self.weight, self.bias)  # type: ignore[no-any-return]
        return product(x, self.weight, self.bias)

    def extra_repr(self) -> str:
        backend = "oneDNN packed" if self.weight.data_ptr() in PACKED else "MKL"
        return f"{super().extra_repr()}, {backend}"


def route(model: nn.Module, placement: Placement) -> int:
    """Make the float32 or bfloat16 layer projections of a CPU model PackedLinear, in place (their
    class only: nothing copied, no name changed), their RowBucketed wrappers (engine/precision/rows.py)
    on ROW_STEP; the number made. Done wherever the model is built, the compile worker's included, so
    that the graph it exports has the operator. After rows.bucket() and int8.quantize(): they find
    plain nn.Linear layers only."""
    if placement.device.type != "cpu" or placement.dtype not in PACKABLE or placement.int8:
        return 0
    found = {id(child): (parent, child) for parent, _, child in layer_projections(model)}  # a stack in a stack: once
    for parent, linear in found.values():
        linear.__class__ = PackedLinear  # a subclass adding no state: the module stays as it was built
        if isinstance(parent, RowBucketed):
            parent.step = ROW_STEP  # a multiple of FLOAT32_STEP: MKL's rows keep their bits too
    return len(found)


def record_key(precision: str) -> str:
    """The record's name: what the compile cache's key holds of the machine (engine/compiling/package.py)."""
    facts = {"torch": torch.__version__, "isa": cpu_class(), "precision": precision}
    return hashlib.sha256(json.dumps(facts, sort_keys=True).encode()).hexdigest()[:32]


def choose(
    shapes: set[tuple[int, int]], precision: str, cache: Path, dtype: torch.dtype = torch.float32
) -> dict[str, str]:
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
    choice = {**known, **{f"{k}x{n}": measure(k, n, dtype) for k, n in sorted(shapes)}}
    record = {"choice": choice, "threads": torch.get_num_threads(), "cpu": cpu_class()[:2]}
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        partial = path.with_suffix(f".{os.getpid()}.partial")
        partial.write_text(json.dumps(record, sort_keys=True))
        partial.replace(path)  # whole or not at all, whichever engine writes last
    except OSError:
        pass
    return {s: choice[s] for s in wanted}


def measure(k: int, n: int, dtype: torch.dtype = torch.float32) -> str:
    """The faster backend for an [M x k] x [k x n] product with bias, summed over PROBE_ROWS."""
    gen = torch.Generator().manual_seed(0)
    weight = (torch.randn(n, k, generator=gen) / k**0.5).to(dtype)
    bias = torch.randn(n, generator=gen).to(dtype)
    packed = torch.ops.mkldnn._reorder_linear_weight(weight, PACK_ROWS)
    spent = dict.fromkeys(BACKENDS, 0.0)
    with torch.inference_mode():
        for m in PROBE_ROWS:
            x = torch.randn(m, k, generator=gen).to(dtype)
            calls = {"mkl": lambda x=x: F.linear(x, weight, bias), "onednn": lambda x=x: onednn(x, packed, bias)}
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
    """Pack the weights of `model`'s PackedLinear projections whose shape the choice puts on oneDNN;
    the number packed (none in another precision: int8's run on _int_mm)."""
    dtype = {name: dtype for dtype, name in PACKABLE.items()}.get(precision)
    if dtype is None or not torch.backends.mkldnn.is_available():  # a torch built without oneDNN: MKL
        return 0
    found = [m for m in model.modules() if isinstance(m, PackedLinear) and m.weight.data_ptr() not in PACKED]
    if not found:
        return 0
    cap_kernel_caches()  # before oneDNN's first use in this process, which measuring may be
    choice = choose({(m.in_features, m.out_features) for m in found}, precision, cache, dtype)
    chosen = [m for m in found if choice[f"{m.in_features}x{m.out_features}"] == "onednn"]
    for linear in chosen:
        pack(linear)
    return len(chosen)


def pack(linear: PackedLinear) -> None:
    """Put `linear`'s product on oneDNN: its weight packed, the plain one let go (see the module's text)."""
    weight = linear.weight.detach()
    packed = torch.ops.mkldnn._reorder_linear_weight(weight, PACK_ROWS)
    stand_in = torch.zeros(1, dtype=weight.dtype).expand(weight.shape)
    PACKED[stand_in.data_ptr()] = (stand_in, packed)
    weakref.finalize(linear, PACKED.pop, stand_in.data_ptr(), None)  # a model let go lets its copies go
    linear.weight = nn.Parameter(stand_in, requires_grad=False)


def describe(model: nn.Module) -> dict[str, Any]:
    """How many layer projections run on oneDNN's packed weights, for the engine phase; {} for none."""
    packed = [m for m in model.modules() if isinstance(m, PackedLinear) and m.weight.data_ptr() in PACKED]
    if not packed:
        return {}
    precision = PACKABLE[packed[0].weight.dtype]
    return {"gemm": f"oneDNN packed: {len(packed)} projections ({precision}, chosen for this CPU)"}
