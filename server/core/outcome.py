"""What the engines answered for one request: its rows, how long it queued and ran, and (once its
route's render ran on the executor) what the response is made of."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np


@dataclass
class Outcome:
    vectors: np.ndarray  # one pooled row per input; for per-token inputs, each input's token vectors
    queue_ms: float
    inference_ms: float
    rendered: Any = None  # what the request's `then` made of it, on the executor

    @staticmethod
    def of(rows: list[np.ndarray], queue_ms: float, inference_ms: float) -> Outcome:
        """Pooled rows stacked into one array; per-token results (one 2-D array per input, of
        different lengths) and bge-m3's outputs (a dict per input) as an object array of them."""
        if isinstance(rows[0], np.ndarray) and rows[0].ndim == 1:
            return Outcome(np.stack(rows), queue_ms, inference_ms)
        ragged = np.empty(len(rows), dtype=object)
        ragged[:] = rows
        return Outcome(ragged, queue_ms, inference_ms)
