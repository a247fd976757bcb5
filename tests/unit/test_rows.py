"""Reduced-precision projections on the CPU run on row counts rounded up to a step, so oneDNN's
per-shape kernels stay few: the padding changes no output, only the layers' projections are
wrapped, only for bfloat16 and float16, and the kernel caches are capped (what that saves, in fresh
engine processes: tests/test_row_buckets.py)."""

from __future__ import annotations

import os

import pytest
import torch
from torch import nn

from engine.precision import rows
from engine.precision.rows import ROW_STEP, RowBucketed, bucket


class Recording(nn.Linear):
    """A projection that remembers the row counts it was called on."""

    def __init__(self) -> None:
        super().__init__(8, 4)
        self.calls: list[int] = []

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.calls.append(x.shape[0])
        return super().forward(x)


def test_a_projection_is_called_on_a_multiple_of_the_step_and_answers_its_own_rows() -> None:
    """17 rows reach the projection as 32 (zero rows added) and 17 come back, each the projection of
    its own row; a count already on the step gets no padding."""
    inner = Recording()
    wrapped = RowBucketed(inner)
    x = torch.randn(17, 8)
    with torch.no_grad():
        out = wrapped(x)
        wrapped(torch.randn(ROW_STEP, 8))
    assert inner.calls == [2 * ROW_STEP, ROW_STEP]
    assert out.shape == (17, 4)
    torch.testing.assert_close(out, x @ inner.weight.T + inner.bias, atol=1e-6, rtol=1e-6)


def test_leading_dimensions_are_kept() -> None:
    """A padded model's [batch, length, hidden] input comes back [batch, length, out]."""
    wrapped = RowBucketed(nn.Linear(8, 4))
    with torch.no_grad():
        assert wrapped(torch.randn(3, 5, 8)).shape == (3, 5, 4)


def model() -> nn.Module:
    """Two layers of two projections in a ModuleList, and a head outside it."""
    layer = lambda: nn.ModuleDict({"a": nn.Linear(8, 8), "b": nn.Linear(8, 8)})  # noqa: E731
    return nn.ModuleDict({"layers": nn.ModuleList([layer(), layer()]), "head": nn.Linear(8, 2)})


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_the_layers_projections_are_wrapped_in_half_precision_on_the_cpu(
    monkeypatch: pytest.MonkeyPatch, dtype: torch.dtype
) -> None:
    """bfloat16 and float16 on the CPU: the four projections in the layer stack, not the head."""
    monkeypatch.setattr(rows, "cap_kernel_caches", lambda: None)
    m = model()
    assert bucket(m, torch.device("cpu"), dtype) == 4
    assert isinstance(m["layers"][0]["a"], RowBucketed) and type(m["head"]) is nn.Linear


@pytest.mark.parametrize(
    ("device", "dtype"), [("cuda", torch.float32), ("cuda", torch.bfloat16), ("cuda", torch.float16)]
)
def test_gpus_are_left_as_they_are(device: str, dtype: torch.dtype) -> None:
    """A GPU's products are neither oneDNN's nor MKL's: nothing wrapped."""
    m = model()
    assert bucket(m, torch.device(device), dtype) == 0
    assert type(m["layers"][0]["a"]) is nn.Linear


def test_every_float32_projection_on_the_cpu_runs_on_a_multiple_of_4_rows() -> None:
    """float32: the head too (its rows are the inputs), at step 4; wrapping twice wraps nothing more."""
    m = model()
    assert bucket(m, torch.device("cpu"), torch.float32) == 5
    assert bucket(m, torch.device("cpu"), torch.float32) == 0
    assert isinstance(m["head"], RowBucketed) and m["head"].step == rows.FLOAT32_STEP == 4
    inner = Recording()
    with torch.no_grad():
        RowBucketed(inner, rows.FLOAT32_STEP)(torch.randn(5, 8))
    assert inner.calls == [8]


def test_the_kernel_caches_are_capped_unless_the_operator_sized_them(monkeypatch: pytest.MonkeyPatch) -> None:
    """Wrapping sets both caches' capacity, keeping a value already in the environment."""
    monkeypatch.delenv("LRU_CACHE_CAPACITY", raising=False)
    monkeypatch.setenv("ONEDNN_PRIMITIVE_CACHE_CAPACITY", "32")
    bucket(model(), torch.device("cpu"), torch.bfloat16)
    assert os.environ["LRU_CACHE_CAPACITY"] == rows.CACHE_ENTRIES
    assert os.environ["ONEDNN_PRIMITIVE_CACHE_CAPACITY"] == "32"
