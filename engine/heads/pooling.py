"""Pooling arithmetic: sentence-transformers' Pooling module, on padded and on packed batches."""

from __future__ import annotations

import torch

from common.st_modules import PoolingMode
from engine.layers.packed import Packed


def pool(hidden: torch.Tensor, mask: torch.Tensor, mode: PoolingMode) -> torch.Tensor:
    """Sentence-transformers' Pooling module arithmetic, so vectors match it."""
    if mode == "cls":
        return hidden[:, 0]
    if mode == "lasttoken":
        last = mask.sum(dim=1) - 1
        return hidden[torch.arange(hidden.shape[0]), last]
    expanded = mask.unsqueeze(-1).to(hidden.dtype)
    if mode == "max":
        return hidden.masked_fill(expanded == 0, -1e9).max(dim=1).values
    if mode == "weightedmean":  # the i-th token (from 1) weighs i; in float32, where half precision would overflow
        weights = mask.unsqueeze(-1) * torch.arange(1, hidden.shape[1] + 1, device=hidden.device)[:, None]
        return ((hidden.float() * weights).sum(dim=1) / weights.sum(dim=1)).to(hidden.dtype)
    summed = (hidden * expanded).sum(dim=1)
    count = expanded.sum(dim=1).clamp(min=1e-9)
    return summed / (count.sqrt() if mode == "mean_sqrt_len_tokens" else count)


def pool_packed(x: torch.Tensor, p: Packed, mode: PoolingMode) -> torch.Tensor:
    """pool() for a packed batch: the same arithmetic over each input's tokens."""
    if mode == "cls":
        return x[p.starts]
    if mode == "lasttoken":
        return x[p.starts + p.lengths - 1]
    if mode == "max":
        return p.grid(x, fill=-1e9).max(dim=1).values
    if mode == "weightedmean":  # the i-th token (from 1) weighs i, n(n+1)/2 in all; in float32, as above
        n = p.lengths[:, None].float()
        weighted = x.float() * (p.positions + 1)[:, None]
        sums = weighted.new_zeros((p.batch, x.shape[-1])).index_add_(0, p.seq, weighted)
        return (sums / (n * (n + 1) / 2)).to(x.dtype)
    lengths = p.lengths[:, None].to(x.dtype)
    sums = x.new_zeros((p.batch, x.shape[-1])).index_add_(0, p.seq, x)
    return sums / (lengths.sqrt() if mode == "mean_sqrt_len_tokens" else lengths.clamp(min=1e-9))
