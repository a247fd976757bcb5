"""Texts and arithmetic the precision and exactness tests share: how close vectors are to the reference."""

from __future__ import annotations

import numpy as np

TEXTS = [
    "A man is eating food.",
    "A man is riding a horse.",
    "The new movie is awesome, the best of the year.",
    "naïve café 日本語 🙂 Привет мир",
    "the warm pool engine keeps models loaded " * 12,
]


def cosines(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Row by row cosine similarity of two [n, d] arrays."""
    return (a * b).sum(1) / np.linalg.norm(a, axis=1) / np.linalg.norm(b, axis=1)  # type: ignore[no-any-return]


def same_entries(got: np.ndarray, expected: np.ndarray, noise: float = 1e-5) -> None:
    """Sparse weights with the same non-zero entries, except where a weight is within float32 noise
    of 0 on one side (its logit so near 0 that its sign is rounding: seen at 2.6e-7 against 0)."""
    differ = (got > 0) != (expected > 0)
    assert np.maximum(got, expected)[differ].max(initial=0.0) < noise, np.argwhere(differ)[:5]
    assert differ.sum() <= 0.0001 * differ.size
