"""The GEMM backend of float32 engines on the CPU (engine/precision/gemm.py): chosen per CPU class and
kept in a record keyed as the compile cache keys its artifacts, oneDNN's packed products equal to
MKL's within 1e-5, the plain weight let go, and oneDNN's kernels bounded over every row count a
group can have."""

from __future__ import annotations

import copy
import random
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

from common.modelfolder import read_model_folder
from common.wire import Tokens
from engine.heads import answer
from engine.precision import gemm
from engine.precision.rows import ROW_STEP, RowBucketed
from engine.runtime.device import place
from engine.runtime.model import PoolingModel

SHAPES = {(384, 1152), (384, 384), (384, 1536), (1536, 384)}  # all-MiniLM-L6-v2's projections


@pytest.fixture
def measured(monkeypatch: pytest.MonkeyPatch) -> list[tuple[int, int]]:
    """The shapes measured, each choosing oneDNN (so that the tests see it whatever this CPU prefers)."""
    calls: list[tuple[int, int]] = []

    def fake(k: int, n: int, dtype: torch.dtype = torch.float32) -> str:
        calls.append((k, n))
        return "onednn"

    monkeypatch.setattr(gemm, "measure", fake)
    return calls


def test_a_record_is_read_back_on_the_same_cpu_class(tmp_path: Path, measured: list[tuple[int, int]]) -> None:
    """The first choice measures every shape and writes the record; the next start reads it."""
    first = gemm.choose(SHAPES, "float32", tmp_path)
    assert sorted(measured) == sorted(SHAPES)
    assert gemm.choose(SHAPES, "float32", tmp_path) == first and len(measured) == len(SHAPES)


def test_another_cpu_class_misses_and_measures_again(
    tmp_path: Path, measured: list[tuple[int, int]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The record's key holds the compile cache's CPU facts: another instruction set misses it."""
    gemm.choose(SHAPES, "float32", tmp_path)
    monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda: "an ISA no CPU has")
    gemm.choose(SHAPES, "float32", tmp_path)
    assert len(measured) == 2 * len(SHAPES)
    assert len(list((tmp_path / gemm.RECORDS).glob("*.json"))) == 2


def test_onednn_products_equal_mkls_within_1e_5() -> None:
    """Each of the model's projection shapes, at row counts from 1 to a packed group's, on oneDNN's
    packed weight against nn.Linear (MKL) on the same weight."""
    gen = torch.Generator().manual_seed(0)
    for k, n in sorted(SHAPES):
        linear = nn.Linear(k, n)
        with torch.no_grad():
            linear.weight.copy_(torch.randn(n, k, generator=gen) / k**0.5)
            linear.bias.copy_(torch.randn(n, generator=gen))
        packed = _on_onednn(linear)
        with torch.inference_mode():
            for m in (1, 3, 16, 17, 100, 300, 384):
                x = torch.randn(m, k, generator=gen)
                torch.testing.assert_close(packed(x), linear(x), rtol=0, atol=1e-5)


def test_an_engine_on_onednn_answers_as_on_mkl_within_1e_5(
    model_dir: Path, tmp_path: Path, measured: list[tuple[int, int]]
) -> None:
    """The whole model's vectors with its layers on oneDNN against the same model on MKL."""
    info = read_model_folder(model_dir)
    mkl = PoolingModel(info, threads=2, placement=place("cpu", "float32", []))
    onednn = PoolingModel(info, threads=2, placement=place("cpu", "float32", []), gemm_records=tmp_path)
    assert "oneDNN packed: 24 projections" in onednn.weights["gemm"]  # 6 layers: qkv, out, up, down
    rng = random.Random(3)
    group = [Tokens([101, *(rng.randrange(1000, 30000) for _ in range(n)), 102]) for n in (1, 9, 30, 120)]
    np.testing.assert_allclose(answer(onednn, group), answer(mkl, group), rtol=0, atol=1e-5)


def test_onednn_kernels_stay_bounded_over_every_length_1_to_512(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every row count reaches oneDNN as a multiple of ROW_STEP (32 counts for 1..512), and past one
    pass over every count (its kernel caches capped) a second pass adds no resident memory: it does
    not grow with the lengths seen."""
    wrapped = _on_onednn(nn.Linear(384, 1536))
    counts: set[int] = set()
    onednn = gemm.onednn

    def counted(rows: torch.Tensor, packed: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        counts.add(rows.shape[0])
        return onednn(rows, packed, bias)

    monkeypatch.setattr(gemm, "onednn", counted)
    x = torch.randn(512, 384)
    with torch.inference_mode():
        for m in range(1, 513):
            wrapped(x[:m])
        before = _resident_mb()
        for m in range(1, 513):
            wrapped(x[:m])
    assert counts == set(range(ROW_STEP, 513, ROW_STEP))
    assert _resident_mb() - before < 16  # a kernel of this shape holds ~0.5 MB: no growth per count


def test_a_float32_models_layer_projections_are_one_operator_on_multiples_of_16(model_dir: Path) -> None:
    """Every layer projection is a PackedLinear (the operator a compiled graph calls) whose wrapper
    rounds its rows to ROW_STEP: in a graph that padding is fused, and the operator copies nothing."""
    model = PoolingModel(read_model_folder(model_dir), threads=2)
    wrappers = [m for m in model.model.modules() if isinstance(m, RowBucketed)]
    wrapped = [w for w in wrappers if isinstance(w.inner, gemm.PackedLinear)]
    assert len(wrapped) == 24 and {w.step for w in wrapped} == {ROW_STEP}


def test_a_packed_projection_holds_no_plain_weight() -> None:
    """The packed copy replaces the weight: what stands in its place keeps its name, shape and dtype
    (a compiled package is handed it by name) and holds one element."""
    linear = _on_onednn(nn.Linear(384, 1536))
    assert dict(linear.named_parameters()).keys() == {"weight", "bias"}
    assert linear.weight.shape == (1536, 384) and linear.weight.dtype == torch.float32
    assert linear.weight.untyped_storage().nbytes() == 4


def test_a_projection_let_go_takes_its_packed_copy_with_it() -> None:
    """The registry of packed copies does not outlive the model: a later tensor at the same address is
    never taken for a packed one."""
    linear = _on_onednn(nn.Linear(384, 384))
    address = linear.weight.data_ptr()
    assert address in gemm.PACKED
    del linear
    assert address not in gemm.PACKED


def _on_onednn(linear: nn.Linear) -> gemm.PackedLinear:
    """A copy of `linear` as an engine runs it where oneDNN is chosen."""
    packed = copy.deepcopy(linear)
    packed.__class__ = gemm.PackedLinear
    gemm.pack(packed)
    return packed  # type: ignore[return-value]


def _resident_mb() -> float:
    with open("/proc/self/statm") as handle:
        return int(handle.read().split()[1]) * 4096 / 1e6
