"""Native models built in the forkserver before it forks any engine: one copy of the weights for all.

An engine forked from the forkserver inherits its memory copy-on-write, and inference never writes
a weight, so a model built there is one copy for every engine and every re-fork, which then reads
and copies nothing. Weights that are views on the mapped checkpoint (engine/layers/checkpoint.py) are
shared through the page cache wherever they are loaded; what building here adds is that the tensors
*not* on the file are shared too: fused projections (BERT's QKV, Qwen3's) and weights converted to
the compute dtype (a bfloat16/float16 checkpoint served in float32) and int8 projections. Built in each engine instead,
each of those is a private copy per engine: measured on a BERT-large-shaped checkpoint, 300 MB of
fused QKV per engine from float32 and the whole 1.34 GB model per engine from bfloat16 (README,
Memory). A shared-memory file the first engine fills would share them too, but needs a cleanup owner
and /dev/shm room (64 MB in a default container); the forkserver lives exactly as long as the
engines it forks.

CPU engines only (a GPU engine's weights live in its GPU's memory) and safetensors only (nothing is
unpickled here): orchestrator.forkserver.preload_weights decides which, engine.forkserver_preload
builds them.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from common.modelfolder import ModelFolder, read_model_folder
from engine import families
from engine.heads import dense, multivector, sparse
from engine.layers.checkpoint import release_unused_pages
from engine.precision import gemm, int8, rows
from engine.runtime.device import Placement, place
from engine.runtime.heap import HeapTrim


@dataclass(frozen=True)
class Built:
    """One model the forkserver built, or why it could not."""

    model: nn.Module | None
    seconds: float
    error: str | None = None


# (model folder, precision: a dtype's name or int8) -> what the forkserver built; empty in any other process
BUILT: dict[tuple[str, str], Built] = {}


def build(info: ModelFolder, placement: Placement) -> nn.Module:
    """The folder's model on its native family's module (engine.families), its projections in int8
    if asked, holding no more of the mapped checkpoint than its weights lie on."""
    labels = None if info.kind in ("embedding", "sparse", "multi-vector") else len(info.id2label)
    # without autograd: a fused copy made with it keeps the tensors it was made of alive in its graph
    with torch.no_grad():
        model = families.load(info.path, info.config, labels, placement.device, placement.dtype, info.score_tokens)
        if info.splade is not None:
            model = sparse.SparseModel(
                model, sparse.load_head(info.path, info.config, model, placement.device, placement.dtype), info.splade
            )
        if info.late is not None:
            model = multivector.MultiVectorModel(model, dense.load(info.dense, placement.device, placement.dtype))
        if placement.int8:
            int8.quantize(model)
        rows.bucket(model, placement.device, placement.dtype)
        gemm.route(model, placement)
    release_unused_pages(model, info.path)
    return model


def build_all(entries: list[tuple[str, str, Path | None]]) -> None:
    """Build each (folder, precision, GEMM records' folder or None) on the CPU, keeping the model or
    the error. On one torch thread: a forked child cannot use GNU OpenMP's pool if its parent started
    one, and at one thread torch never starts it (a GEMM backend measured here is measured on one)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        for folder, precision, records in entries:
            started = time.monotonic()
            try:
                info = read_model_folder(Path(folder))
                folder = str(info.path)  # a Router folder's model is its document encoder: looked up by it
                model = built_with_gemm(info, place("cpu", precision, []), records) if info.native else None
                BUILT[(folder, precision)] = Built(model, time.monotonic() - started)
            except Exception as exc:  # kept for the engine, which loads the model itself and reports it
                BUILT[(folder, precision)] = Built(None, time.monotonic() - started, f"{type(exc).__name__}: {exc}")
    finally:
        torch.set_num_threads(threads)
        HeapTrim().release()  # what building freed (converted copies), not every engine's to inherit


def built_with_gemm(info: ModelFolder, placement: Placement, records: Path | None) -> nn.Module:
    """build(), then, with a GEMM records' folder, the layers' float32 or bfloat16 projections on the
    backend chosen for this CPU (engine/precision/gemm.py): the packed weights replace the plain ones
    before any engine is forked, the checkpoint's pages they came from released."""
    model = build(info, placement)
    if records is not None and not placement.cuda and gemm.select(model, placement.precision, records):
        release_unused_pages(model, info.path)
    return model


def native_model(
    info: ModelFolder, placement: Placement, records: Path | None = None
) -> tuple[nn.Module, dict[str, Any]]:
    """The folder's native model and, for the engine phase, where its weights came from: `forkserver`
    (built there, inherited: nothing read or copied here) or `engine` (loaded here, its GEMM backend
    chosen with `records`)."""
    built = BUILT.get((str(info.path), placement.precision)) if not placement.cuda else None
    if built is not None and built.model is not None:
        return built.model, {"weights": "forkserver", "forkserver_build_s": round(built.seconds, 3)}
    detail: dict[str, Any] = {"weights": "engine"}
    if built is not None and built.error:
        detail["forkserver_error"] = built.error
    return built_with_gemm(info, placement, records), detail
