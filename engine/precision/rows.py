"""Projections on the CPU with their row count rounded up to a step: bfloat16 and float16 for
oneDNN's kernel caches, float32 for batch invariance.

Those products run in oneDNN (AMX or AVX512-BF16/FP16), which builds a kernel for each shape it is
given and keeps it: a primitive of its own and one in torch's ideep layer, each holding about a
weight's size. A packed batch's row count is its token count, new nearly every batch, so a
bfloat16 engine grew by a weight's size per new count: all-MiniLM-L6-v2 held 1.55 GB under 32
clients against float32's 0.44 GB. Rounded up to a multiple of ROW_STEP, a group of up to 384
tokens is one of 24 shapes per projection, and the same loop over every length from 3 to 400
tokens left the engine at 0.40 GB instead of 1.29 GB, as fast (18.0 ms a forward against 19.4 ms:
a kernel found is cheaper than one built). The padding rows are zeros and are cut off the output,
so no token sees them: each row of a product depends on its own input row alone.

The two caches are also capped (CACHE_ENTRIES each), for lengths past what the steps keep few:
a bound on memory whatever the inputs.
float32 products cache nothing per shape, but on this CPU (AMD Zen 4, torch 2.13's MKL/oneDNN sgemm)
a product of M rows where M % 4 is 1, 2 or 3 and M is small for the thread count (below 4 rows on 1
thread, 12 on 2, 28 on 16, 172 on 64) gives some rows other bits than the same rows inside a larger
product: an input's vector then depended on how many tokens shared its group (a 3-token text alone,
or an 11-token one on 2 threads). No multiple of 4 did, at any count or thread number measured, so
every float32 projection of the model (heads and Dense modules too: their rows are the inputs) runs
on a multiple of FLOAT32_STEP: at most 3 zero rows (the layers' own on ROW_STEP, which is one:
engine/precision/gemm.py route()). int8 products accumulate in int32, exactly:
their layers are left as they are (engine/precision/int8.py), their float32 heads wrapped.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import torch
import torch.nn.functional as F
from torch import nn

ROW_STEP = 16  # rows rounded up to a multiple of this: at most 15 zero rows a product
FLOAT32_STEP = 4  # float32's: the smallest row multiple whose rows keep their bits in any product
# float32 products of this many rows or more keep their rows' bits whatever M % 4 (measured: none past
# 171 rows, on 64 threads): left as they are, since a 32-client group's copy of each projection's input
# cost 7 % of its forward (bench.row_padding); the few-row products that differ are copied
FLOAT32_EXACT_FROM = 256
CACHE_ENTRIES = "256"  # oneDNN's and ideep's kernel caches, each (default 1024)
CACHE_SETTINGS = ("ONEDNN_PRIMITIVE_CACHE_CAPACITY", "LRU_CACHE_CAPACITY")
BUCKETED_DTYPES = (torch.bfloat16, torch.float16)


class RowBucketed(nn.Module):
    """A projection called on a multiple of `step` rows: zero rows added, their outputs cut off."""

    def __init__(self, inner: nn.Module, step: int = ROW_STEP, exact_from: int | None = None) -> None:
        super().__init__()
        self.inner = inner
        self.step = step
        self.exact_from = exact_from  # rows from which a product needs no padding (float32's), if any

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.reshape(-1, x.shape[-1])
        n = rows.shape[0]
        if not torch.compiler.is_compiling() and (
            n % self.step == 0 or (self.exact_from is not None and n >= self.exact_from)
        ):
            return self.inner(x)  # eager, needing no step: no copy (exported, n is symbolic: padded always)
        padded = F.pad(rows, (0, 0, 0, (-n) % self.step))  # traceable: a token count exported dynamic
        out = self.inner(padded)[:n]
        return out.view(*x.shape[:-1], out.shape[-1])


def layer_projections(model: nn.Module) -> Iterator[tuple[nn.Module, str, nn.Linear]]:
    """Every plain nn.Linear inside the model's layer stacks (its nn.ModuleLists), with its parent
    and name: the projections that do a forward's work. Embeddings, heads and Dense modules lie
    outside them. Native families and transformers' models alike keep their layers in ModuleLists."""
    for stack in [m for m in model.modules() if isinstance(m, nn.ModuleList)]:
        for parent in list(stack.modules()):
            for name, child in list(parent.named_children()):
                if type(child) is nn.Linear:
                    yield parent, name, child


def bucket(model: nn.Module, device: torch.device, dtype: torch.dtype) -> int:
    """Wrap projections in RowBucketed, in place; the number wrapped. The layers' projections where they
    run in oneDNN's reduced precision on the CPU (its caches capped); every float32 one on the CPU."""
    if device.type != "cpu":
        return 0
    if dtype == torch.float32:
        parents = [m for m in model.modules() if not isinstance(m, RowBucketed)]  # wrapped once, however called
        found = [(p, n, c) for p in parents for n, c in list(p.named_children()) if type(c) is nn.Linear]
        step, exact_from = FLOAT32_STEP, FLOAT32_EXACT_FROM
    elif dtype in BUCKETED_DTYPES:
        cap_kernel_caches()
        found, step, exact_from = list(layer_projections(model)), ROW_STEP, None
    else:
        return 0
    for parent, name, child in found:
        setattr(parent, name, RowBucketed(child, step, exact_from))
    return len(found)


def cap_kernel_caches() -> None:
    """Both caches read their size when first used, which is after this in any engine (the forkserver
    builds models but runs none); a size the operator set is kept."""
    for name in CACHE_SETTINGS:
        os.environ.setdefault(name, CACHE_ENTRIES)
