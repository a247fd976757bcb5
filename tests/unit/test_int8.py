"""int8 inference (engine/precision/int8.py) and the CPU's choice of compute dtype (engine/runtime/device.py)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from common.folderjson import ModelError
from common.modelfolder import read_model_folder
from common.wire import Tokens
from engine.precision.int8 import Int8Linear, quantize
from engine.runtime import device
from engine.runtime.device import Placement, place
from engine.runtime.model import PoolingModel
from tests.tiny_models import TINY, TinyFolders
from tests.vectors import TEXTS, cosines

# An int8 CPU placement as place() makes it where the CPU has VNNI: the arithmetic is the same
# without (only far slower), so these tests run on any CPU.
INT8 = Placement(torch.device("cpu"), torch.float32, {"device": "cpu", "dtype": "int8"}, int8=True)


def test_int8_linear_is_the_linear_within_its_rounding() -> None:
    """An Int8Linear computes x W^T + b to within the rounding of int8 weights (per output channel)
    and activations (per token): about 1% of the output's size, and not exactly."""
    torch.manual_seed(0)
    linear = nn.Linear(96, 40)
    x = torch.randn(3, 7, 96)
    expected, got = linear(x).detach(), Int8Linear(linear)(x)
    assert got.shape == expected.shape and got.dtype == torch.float32
    error = ((got - expected).norm() / expected.norm()).item()
    assert 0 < error < 0.02


def test_a_token_with_large_values_does_not_coarsen_its_neighbours() -> None:
    """Activations get one scale per token: a token 1000x larger than the others leaves their outputs
    as accurate as without it."""
    torch.manual_seed(0)
    linear, x = nn.Linear(64, 32), torch.randn(4, 64)
    loud = torch.cat([x, 1000 * torch.randn(1, 64)])
    alone, beside = Int8Linear(linear)(x), Int8Linear(linear)(loud)[:4]
    torch.testing.assert_close(beside, alone, rtol=0, atol=0)


def test_quantize_replaces_the_layers_projections_only() -> None:
    """quantize() turns every nn.Linear inside the model's layer stacks into an Int8Linear (a BERT
    layer has four: query, key, value, output... here on transformers' own model) and leaves the
    pooler and embeddings float32."""
    from transformers import BertConfig, BertModel

    config = BertConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=37)
    model = BertModel(config).eval()
    assert quantize(model) == 2 * 6  # query, key, value, attention output, intermediate, output
    assert isinstance(model.pooler.dense, nn.Linear)
    assert model.embeddings.word_embeddings.weight.dtype == torch.float32
    assert all(not isinstance(m, nn.Linear) for m in model.encoder.modules())


@pytest.mark.parametrize("name", sorted(TINY))
def test_every_family_runs_in_int8(tiny: TinyFolders, name: str) -> None:
    """Each native family's model, and DistilBERT on the transformers fallback, built with dtype int8
    has int8 projections, says so in its weights detail, and gives vectors (or scores) close to
    float32's."""
    info = read_model_folder(tiny[name])
    assert info.native is (TINY[name].family != "distilbert")
    fp32 = PoolingModel(info, threads=1, placement=place("cpu", "float32", []))
    int8 = PoolingModel(info, threads=1, placement=INT8)
    assert "int8" in int8.weights["quantization"] and "quantization" not in fp32.weights
    assert any(isinstance(m, Int8Linear) for m in int8.model.modules())
    items = [Tokens([5 + i for i in range(n)]) for n in (3, 9, 17)]
    expected, got = fp32.forward(items), int8.forward(items)
    assert np.linalg.norm(got - expected) <= 0.05 * np.linalg.norm(expected)


def test_int8_vectors_of_the_default_model_are_close_to_float32(model_dir) -> None:  # type: ignore[no-untyped-def]
    """On all-MiniLM-L6-v2 the int8 vectors of the test texts have cosine >= 0.98 to float32's each,
    >= 0.995 on average."""
    from server.tokenizing.tokenizer import TokenizerPool

    info, pool = read_model_folder(model_dir), TokenizerPool(model_dir)
    items = [pool.encode(text) for text in TEXTS]
    fp32 = PoolingModel(info, threads=1, placement=place("cpu", "float32", [])).forward(items)
    int8 = PoolingModel(info, threads=1, placement=INT8).forward(items)
    cosine = cosines(fp32, int8)
    assert cosine.min() >= 0.98 and cosine.mean() >= 0.995
    assert not np.allclose(fp32, int8, atol=1e-5)  # int8 really ran


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_a_half_dtype_the_cpu_lacks_is_refused_by_name(monkeypatch: pytest.MonkeyPatch, dtype: str) -> None:
    """Where the CPU has no instructions for bfloat16 or float16, placing an engine in it fails with
    a message that names the dtype and what to use instead."""
    monkeypatch.setattr(device, "cpu_has", lambda _dtype: False)
    with pytest.raises(ModelError, match=f"dtype {dtype}: this CPU has no {dtype} instructions.*float32"):
        place("cpu", dtype, [])


def test_int8_is_refused_on_a_cpu_without_int8_dot_products(monkeypatch: pytest.MonkeyPatch) -> None:
    """Where the CPU has no VNNI or AMX-INT8, placing an int8 engine fails naming what it lacks and
    what to use instead."""
    monkeypatch.setattr(device, "cpu_has_int8", lambda: False)
    with pytest.raises(ModelError, match=r"dtype int8: this CPU has no int8 dot-product instructions.*float32"):
        place("cpu", "int8", [])


def test_the_int8_instructions_are_read_from_the_cpu_flags(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """cpu_has_int8 looks for avx512_vnni, avx_vnni or amx_int8 among the flags /proc/cpuinfo lists."""
    real_path = device.Path

    def cpuinfo(flags: str) -> None:
        (tmp_path / "cpuinfo").write_text(f"processor\t: 0\nflags\t\t: fpu sse2 avx2 {flags}\n")
        monkeypatch.setattr(
            device, "Path", lambda p: real_path(tmp_path / "cpuinfo") if p == "/proc/cpuinfo" else real_path(p)
        )

    cpuinfo("fma")
    assert not device.cpu_has_int8()
    cpuinfo("avx512f avx512_vnni")
    assert device.cpu_has_int8()
    cpuinfo("avx_vnni")
    assert device.cpu_has_int8()


def test_int8_is_refused_on_a_gpu() -> None:
    """int8 is a CPU precision: asking for it on cuda fails before CUDA is touched."""
    with pytest.raises(ModelError, match="int8 runs on the CPU only"):
        place("cuda", "int8", [])


def test_int8_computes_in_float32_and_says_int8(monkeypatch: pytest.MonkeyPatch) -> None:
    """An int8 placement computes its non-quantized parts in float32 and reports dtype int8."""
    monkeypatch.setattr(device, "cpu_has_int8", lambda: True)
    placement = place("cpu", "int8", [])
    assert placement.dtype == torch.float32 and placement.int8
    assert placement.precision == placement.detail["dtype"] == "int8"


def test_int8_with_a_gpu_is_refused_before_any_engine_starts(monkeypatch: pytest.MonkeyPatch, model_dir) -> None:  # type: ignore[no-untyped-def]
    """Settings asking for int8 where the device is a GPU fail the engine phase at start-up, before any
    engine is forked; on the CPU they start."""
    from common.settings import Settings
    from orchestrator.__main__ import _refusal

    monkeypatch.setattr(Settings, "resolved_device", property(lambda self: "cuda"))
    phase, reason = _refusal(Settings(model=str(model_dir), dtype="int8")) or ("", "")
    assert phase == "engine" and "int8 runs on the CPU only" in reason
    monkeypatch.setattr(Settings, "resolved_device", property(lambda self: "cpu"))
    assert _refusal(Settings(model=str(model_dir), dtype="int8")) is None
