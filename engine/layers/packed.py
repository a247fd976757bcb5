"""A packed batch: every input's tokens one after another, no padding, and where each input lies."""

from __future__ import annotations

from dataclasses import dataclass, field
from itertools import chain
from typing import Any

import numpy as np
import torch

from common.wire import Tokens


@dataclass(frozen=True)
class Packed:
    """Every token of every input, one after another, and which input each belongs to."""

    ids: torch.Tensor  # [T]
    types: torch.Tensor  # [T]
    positions: torch.Tensor  # [T]: the token's index within its input, from 0
    seq: torch.Tensor  # [T]: which input the token belongs to
    starts: torch.Tensor  # [B]
    lengths: torch.Tensor  # [B]
    spans: list[tuple[int, int]]  # (start, length) of each input, as Python ints
    keys: list[int] | None = None  # per input, how many of its first tokens are attended to; None: all
    adapters: tuple[str, ...] | None = None  # per input, the LoRA adapter it runs with ("": the base); None: all base
    memo: dict[Any, Any] = field(default_factory=dict, compare=False)  # what one forward computes once (attend)

    @property
    def batch(self) -> int:
        return self.lengths.shape[0]  # not int(): exported (engine/compiling/package.py), that would fix the batch size

    @staticmethod
    def of(inputs: list[Tokens]) -> Packed:
        # The index arithmetic in numpy: torch's CPU operators hand even a few hundred elements to an
        # OpenMP team, and waking one beside a busy HTTP process measured ~2 ms a batch on a GPU machine.
        sizes = np.fromiter((len(item.input_ids) for item in inputs), dtype=np.int64, count=len(inputs))
        offsets = np.cumsum(sizes) - sizes
        order = np.repeat(np.arange(len(inputs), dtype=np.int64), sizes)
        lengths, starts, seq = torch.from_numpy(sizes), torch.from_numpy(offsets), torch.from_numpy(order)
        positions = torch.from_numpy(np.arange(len(order), dtype=np.int64) - offsets[order])
        total = len(order)
        if any(t.token_type_ids is not None for t in inputs):
            rows = (t.token_type_ids if t.token_type_ids is not None else [0] * len(t.input_ids) for t in inputs)
            types = torch.from_numpy(np.fromiter(chain.from_iterable(rows), dtype=np.int64, count=total))
        else:
            types = torch.zeros(total, dtype=torch.long)
        return Packed(
            ids=torch.from_numpy(np.fromiter(chain.from_iterable(t.input_ids for t in inputs), np.int64, total)),
            types=types,
            positions=positions,
            seq=seq,
            starts=starts,
            lengths=lengths,
            spans=list(zip(starts.tolist(), lengths.tolist(), strict=True)),
            keys=[t.keys or len(t.input_ids) for t in inputs] if any(t.keys for t in inputs) else None,
            adapters=tuple(t.adapter for t in inputs) if any(t.adapter for t in inputs) else None,
        )

    def to(self, device: torch.device) -> Packed:
        """The index tensors on `device`; from pinned memory, asynchronously, when that is a GPU."""
        if device.type == "cpu":
            return self

        def move(t: torch.Tensor) -> torch.Tensor:
            return t.pin_memory().to(device, non_blocking=True)

        return Packed(
            ids=move(self.ids),
            types=move(self.types),
            positions=move(self.positions),
            seq=move(self.seq),
            starts=move(self.starts),
            lengths=move(self.lengths),
            spans=self.spans,
            keys=self.keys,
            adapters=self.adapters,
        )

    def grid(self, x: torch.Tensor, fill: float = 0.0) -> torch.Tensor:
        """[T, H] -> [B, longest, H], padding cells set to `fill` (max pooling needs the grid)."""
        longest = int(self.lengths.max())
        out = x.new_full((self.batch * longest, x.shape[-1]), fill)
        out[self.seq * longest + self.positions] = x
        return out.view(self.batch, longest, x.shape[-1])


def offset_positions(p: Packed, padding_idx: int) -> torch.Tensor:
    """RoBERTa's (and MPNet's) position ids on the packed layout: counting from padding_idx + 1 within
    each input, skipping tokens equal to the padding id, which themselves get padding_idx (what
    transformers' create_position_ids_from_input_ids gives; a literal "<pad>" in a text is one)."""
    real = p.ids != padding_idx
    counted = torch.cumsum(real, 0)
    before = counted[p.starts] - real[p.starts].long()  # real tokens of the inputs before this one
    return (counted - before[p.seq]) * real + padding_idx
