"""oneDNN's prepacked projections on the CPU: every layer's nn.Linear as a weight reordered once,
when the model is built, into the blocked layout oneDNN's matrix kernel reads (what torch.compile's
CPU freezing pass does to a linear layer, without compiling anything).

A plain nn.Linear is an addmm through MKL, which re-reads the [out, in] weight in its stored layout
on every call. On 2 cores (AVX2) a [T x 384] x [384 x 1536] product ran 1.55x faster prepacked at
T = 20 tokens, 1.1-1.2x at 100-1,500; one all-MiniLM-L6-v2 forward of one 20-token input 1.40x
(bench.prepack). Outputs stay within 1e-6 of nn.Linear in float32.

The reordered weight is a new copy, built in the forkserver with the rest of the model
(engine/preloaded.py) so every engine shares it; the checkpoint's own pages it was read from are then
released (engine/checkpoint.release_unused_pages): the model holds one copy of each weight, as before.
Float32, and bfloat16 where oneDNN has the instructions for it; anything else keeps nn.Linear.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from engine.layers import layer_projections

DTYPES = (torch.float32, torch.bfloat16)


class PrepackedLinear(nn.Module):
    """y = x W^T + b with W in oneDNN's blocked layout."""

    bias: torch.Tensor | None

    def __init__(self, linear: nn.Linear) -> None:
        super().__init__()
        weight = linear.weight.detach()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        # An opaque tensor without storage: a plain attribute, not a buffer, so that nothing that walks
        # the model's tensors (.to(), release_unused_pages, state_dict) meets it.
        self.packed = torch.ops.mkldnn._reorder_linear_weight(weight)
        self.nbytes = weight.numel() * weight.element_size()
        self.register_buffer("bias", None if linear.bias is None else linear.bias.detach())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.ops.mkldnn._linear_pointwise(x, self.packed, self.bias, "none", [], "")  # type: ignore[no-any-return]

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, prepacked"


def available(dtype: torch.dtype) -> bool:
    return dtype in DTYPES and torch.backends.mkldnn.is_available()


def prepack(model: nn.Module, dtype: torch.dtype) -> int:
    """Replace every nn.Linear in the model's layer stacks with a PrepackedLinear, in place; the
    number replaced (0 where oneDNN cannot pack this dtype on this CPU: the model is left as it was)."""
    if not available(dtype):
        return 0
    replaced = 0
    for parent, name, linear in layer_projections(model):
        try:
            setattr(parent, name, PrepackedLinear(linear))
        except RuntimeError:  # oneDNN lacks this CPU's instructions for the dtype (bfloat16 without AVX-512)
            return replaced
        replaced += 1
    return replaced


def describe(model: nn.Module) -> dict[str, Any]:
    """What was prepacked, for the engine phase; {} for a model that was not."""
    layers = [m for m in model.modules() if isinstance(m, PrepackedLinear)]
    if not layers:
        return {}
    megabytes = sum(layer.nbytes for layer in layers) / 1e6
    return {"prepacked": f"{len(layers)} projections in oneDNN's blocked layout ({megabytes:.1f} MB)"}
