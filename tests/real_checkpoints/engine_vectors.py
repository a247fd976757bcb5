"""What the real-checkpoint tests share: a folder's vectors as the engine serves them (eager, or
compiled as the compile worker builds it), each query's ranking of the passages, and how much of a
reference's top passages a ranking keeps."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from common.modelfolder import read_model_folder
from common.wire import Tokens
from engine.compiling.package import CompiledForward, build_package
from engine.layers.packed import Packed
from engine.runtime.device import cpu_has, cpu_has_int8, place
from engine.runtime.model import PoolingModel
from server.core.outputs import normalize
from server.tokenizing.tokenizer import TokenizerPool


def served(folder: Path, texts: list[str], precision: str, compiled_in: Path | None = None) -> np.ndarray:
    """The engine's vectors for `texts` (cut at the folder's length), normalised as the server
    normalises them; with `compiled_in`, from a package built there as the compile worker builds it."""
    info = read_model_folder(folder)
    tokens = TokenizerPool(folder).encode_batch(texts, truncate=info.max_model_len)
    model = PoolingModel(info, threads=torch.get_num_threads(), placement=place("cpu", precision, []))
    if compiled_in is not None:
        build_package(model.model, Packed.of([Tokens([5] * n) for n in (3, 5, 9)]), compiled_in / "artifact")
        model.compiled = CompiledForward(compiled_in / "artifact", model.model, compiled_in / "unpacked")
    return normalize(model.forward(tokens))


def ranking(vectors: np.ndarray, queries: int) -> np.ndarray:
    """Each of the first `queries` rows' ranking of the rows after them, best first."""
    return np.argsort(-(vectors[:queries] @ vectors[queries:].T), axis=1, kind="stable")


def top_overlap(got: np.ndarray, expected: np.ndarray, top: int) -> float:
    """The mean share of each query's expected top `top` that `got` keeps in its own."""
    return float(np.mean([len(set(g[:top]) & set(e[:top])) / top for g, e in zip(got, expected, strict=True)]))


def cpu_computes(precision: str) -> bool:
    """Whether this CPU has the precision's instructions (else the engine refuses it)."""
    return cpu_has(torch.bfloat16) if precision == "bfloat16" else cpu_has_int8()
