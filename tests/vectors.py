"""Texts and arithmetic the precision tests share: how close one dtype's vectors are to float32's."""

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
