"""bge-m3's heads after the encoder (common/m3.py): lexical weights and ColBERT vectors from the
same hidden states as the dense vector, so one forward answers any subset of the three."""

from __future__ import annotations

from pathlib import Path

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


def load(files: m3.M3Heads, hidden: int, device: torch.device, dtype: torch.dtype) -> M3Heads:
    """Both heads, from safetensors or (where allowed: the engine checked) torch.load(weights_only=True)."""
    try:
        sparse, colbert = _state(files.sparse, device), _state(files.colbert, device)
        with no_init():
            heads = M3Heads(hidden, int(colbert["weight"].shape[0]))
        heads.sparse_linear.load_state_dict(sparse, assign=True)
        heads.colbert_linear.load_state_dict(colbert, assign=True)
    except (OSError, RuntimeError, KeyError, ValueError) as exc:  # truncated, foreign or misshapen files
        raise ModelError(f"cannot load bge-m3's heads from {files.sparse.parent}: {type(exc).__name__}: {exc}") from exc
    return heads.to(dtype).eval()


def _state(path: Path, device: torch.device) -> dict[str, torch.Tensor]:
    if path.suffix == ".safetensors":
        return load_file(str(path), device=str(device))
    return torch.load(path, map_location=device, weights_only=True)  # type: ignore[no-any-return]


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
