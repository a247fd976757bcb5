"""bge-m3's heads after the encoder (common/m3.py): lexical weights and ColBERT vectors from the
same hidden states as the dense vector, so one forward answers any subset of the three."""

from __future__ import annotations

import pickle
import re
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from safetensors.torch import load_file
from torch import nn

from common import m3
from common.folderjson import ModelError
from engine.layers.encoder import no_init
from engine.layers.packed import Packed


class M3Heads(nn.Module):
    """FlagEmbedding's sparse_linear (hidden -> 1) and colbert_linear (hidden -> its dims)."""

    def __init__(self, hidden: int, colbert_dims: int) -> None:
        super().__init__()
        self.sparse_linear = nn.Linear(hidden, 1)
        self.colbert_linear = nn.Linear(hidden, colbert_dims)

    def lexical(self, hidden: torch.Tensor) -> torch.Tensor:
        """Each token's weight: relu of the sparse head, [T]."""
        return torch.relu(self.sparse_linear(hidden))[:, 0]

    def colbert(self, hidden: torch.Tensor) -> torch.Tensor:
        """Each token's ColBERT vector, normalised, [T, D]."""
        return F.normalize(self.colbert_linear(hidden), dim=-1)


class Refused(Exception):
    """A head file that is not a state dict of tensors of a head's shapes: left unread, the model
    answers its dense vector alone (the reason, naming the file, goes in the engine's load report)."""


def load(files: m3.M3Heads, hidden: int, device: torch.device, dtype: torch.dtype) -> M3Heads:
    """Both heads, from safetensors or, as BAAI ships them, torch pickles read by torch's
    weights-only unpickler: Refused where a file holds anything but {weight, bias} tensors of a
    head's shapes; ModelError where one cannot be read (truncated, not a checkpoint)."""
    try:
        sparse, colbert = _state(files.sparse, device), _state(files.colbert, device)
    except (OSError, RuntimeError, KeyError, ValueError) as exc:  # truncated or foreign files
        raise ModelError(f"cannot load bge-m3's heads from {files.sparse.parent}: {type(exc).__name__}: {exc}") from exc
    _check(files.sparse, sparse, hidden, rows=1)
    _check(files.colbert, colbert, hidden, rows=None)
    with no_init():
        heads = M3Heads(hidden, int(colbert["weight"].shape[0]))
    heads.sparse_linear.load_state_dict(sparse, assign=True)
    heads.colbert_linear.load_state_dict(colbert, assign=True)
    return heads.to(dtype).eval()


def _state(path: Path, device: torch.device) -> Any:
    if path.suffix == ".safetensors":
        return load_file(str(path), device=str(device))
    # weights_only=True, passed explicitly: no environment variable turns it off, and the unpickler
    # builds tensors and containers from torch's own allowlist, never calling what a file names.
    # That allowlist is process-wide (torch adds its own types to it): extended by another
    # library, the guarantee would no longer be torch's alone.
    if extra := _foreign_safe_globals():
        raise Refused(f"{path.name} not read: torch's weights-only allowlist was extended in this process ({extra})")
    try:
        return torch.load(path, map_location=device, weights_only=True)
    except pickle.UnpicklingError as exc:  # a global, a reduce or a build beyond tensors
        why = _why(exc)
        raise Refused(f"{path.name} is not tensors only, refused by torch's weights-only unpickler: {why}") from exc


def _foreign_safe_globals() -> list[str]:
    """What torch.serialization.add_safe_globals allowed beyond torch's own types."""
    found = []
    for entry in torch.serialization.get_safe_globals():
        target = entry[0] if isinstance(entry, tuple) else entry
        module = getattr(target, "__module__", None) or ""
        if module != "torch" and not module.startswith("torch."):
            found.append(f"{module}.{getattr(target, '__qualname__', target)}")
    return found


def _why(exc: Exception) -> str:
    """The unpickler's own finding, one sentence, out of torch's message (which goes on to suggest
    allowlisting the global or weights_only=False: what not to do with such a file)."""
    found = re.search(r"[^\n]*(?:GLOBAL|[Uu]nsupported)[^\n]*", str(exc))
    line = found.group(0) if found else str(exc).splitlines()[0]
    return line.strip().removeprefix("WeightsUnpickler error: ").split(" Please ")[0][:300]


def _check(path: Path, state: Any, hidden: int, rows: int | None) -> None:
    """Refused unless `state` is {weight: [rows, hidden], bias: [rows]}, floating tensors (`rows`
    None: any number of rows, the ColBERT head's dimensions)."""
    if not isinstance(state, dict) or set(state) != {"weight", "bias"}:
        keys = sorted(map(str, state)) if isinstance(state, dict) else type(state).__name__
        raise Refused(f"{path.name} is not a linear head's state dict (weight, bias): it holds {keys}")
    weight, bias = state["weight"], state["bias"]
    if not all(isinstance(t, torch.Tensor) and t.is_floating_point() for t in (weight, bias)):
        raise Refused(f"{path.name}: weight and bias are not floating-point tensors")
    n = rows or (weight.shape[0] if weight.dim() == 2 else 0)
    if n < 1 or tuple(weight.shape) != (n, hidden) or tuple(bias.shape) != (n,):
        want = f"[{rows or 'D'}, {hidden}] and [{rows or 'D'}]"
        raise Refused(f"{path.name}: weight {list(weight.shape)} and bias {list(bias.shape)}, not {want}")


def outputs(
    heads: M3Heads, hidden: torch.Tensor, dense: np.ndarray | None, p: Packed, wanted: list[tuple[str, ...]]
) -> list[dict[str, np.ndarray]]:
    """Per input the outputs it asked for: `dense` its pooled row, `sparse` each token's weight
    (the HTTP side keeps the largest per token id), `multi_vector` the vectors of every token but
    the first. Each head runs once over the tokens of the group, only if some input asked for it."""
    lexical = heads.lexical(hidden).float().cpu().numpy() if any("sparse" in w for w in wanted) else None
    vectors = heads.colbert(hidden).float().cpu().numpy() if any("multi_vector" in w for w in wanted) else None
    rows = []
    for i, ((start, n), asked) in enumerate(zip(p.spans, wanted, strict=True)):
        row = {}
        if "dense" in asked and dense is not None:
            row["dense"] = dense[i]
        if "sparse" in asked and lexical is not None:
            row["sparse"] = lexical[start : start + n]
        if "multi_vector" in asked and vectors is not None:
            row["multi_vector"] = vectors[start + 1 : start + n]
        rows.append(row)
    return rows
