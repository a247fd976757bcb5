"""float32 to vLLM's fp8 `embed_dtype`s (e4m3fn, e5m2) as torch converts them, in numpy: the HTTP
process never imports torch. Each format's 256 codes are decoded once into a table; a value takes the
nearest code, ties to the even one; past the largest value e4m3fn saturates (torch 2.13 does) and
e5m2 is infinite."""

from __future__ import annotations

import functools
from typing import NamedTuple

import numpy as np


class Format(NamedTuple):
    exponent_bits: int
    mantissa_bits: int
    has_infinity: bool  # e5m2 is IEEE-like; e4m3fn spends its top code on NaN and has no infinity


FORMATS = {"fp8_e4m3": Format(4, 3, False), "fp8_e5m2": Format(5, 2, True)}


@functools.cache
def _positive(name: str) -> tuple[np.ndarray, int, int]:
    """The format's finite non-negative values (index = code), its overflow code, and its NaN code."""
    fmt = FORMATS[name]
    bias = 2 ** (fmt.exponent_bits - 1) - 1
    values = []
    for code in range(128):
        exponent, mantissa = code >> fmt.mantissa_bits, code & (2**fmt.mantissa_bits - 1)
        top = exponent == 2**fmt.exponent_bits - 1
        if (fmt.has_infinity and top) or (not fmt.has_infinity and code == 127):
            break  # infinity and NaN (e5m2), NaN (e4m3fn)
        fraction = mantissa / 2**fmt.mantissa_bits
        values.append(fraction * 2.0 ** (1 - bias) if exponent == 0 else (1 + fraction) * 2.0 ** (exponent - bias))
    finite = np.array(values, dtype=np.float64)
    overflow = len(values) if fmt.has_infinity else len(values) - 1  # e5m2's infinity follows its largest
    nan = 127
    return finite, overflow, nan


def codes(values: np.ndarray, name: str) -> np.ndarray:
    """Each float32 value's fp8 code (uint8), round to nearest even."""
    finite, overflow, nan = _positive(name)
    x = np.asarray(values, dtype=np.float32).astype(np.float64).ravel()
    magnitude = np.abs(x)
    above = np.clip(np.searchsorted(finite, magnitude), 1, len(finite) - 1)
    below = above - 1
    low_gap, high_gap = magnitude - finite[below], finite[above] - magnitude
    take_high = (high_gap < low_gap) | ((high_gap == low_gap) & (above % 2 == 0))
    code = np.where(take_high, above, below)
    step = finite[-1] - finite[-2]  # past the largest value by half a step: no code is nearer
    code = np.where(magnitude >= finite[-1] + step / 2, overflow, code)
    code = np.where(np.isnan(x), nan, code)
    sign = np.signbit(x).astype(np.int64) << 7
    return (code | sign).astype(np.uint8).reshape(np.shape(values))
