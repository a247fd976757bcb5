"""Device selection without torch (that CUDA is touched only in the engine, after the fork: tests/test_imports.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from common.devices import DeviceError, engine_device, resolve, visible_gpus
from common.settings import Settings


def test_auto_is_the_gpu_when_there_is_one_else_the_cpu() -> None:
    """WARMPOOL_DEVICE=auto picks cuda where a GPU is visible, the CPU otherwise."""
    assert resolve("auto", 2) == "cuda" and resolve("auto", 0) == "cpu"


@pytest.mark.parametrize("device", ["cuda", "cuda:0", "cuda:3"])
def test_a_gpu_that_is_not_there_is_refused_with_the_reason(device: str) -> None:
    """cuda (or cuda:N past the visible GPUs) is a DeviceError that says what is visible."""
    with pytest.raises(DeviceError, match="visible"):
        resolve(device, 0 if device != "cuda:3" else 2)


def test_cuda_spreads_engines_one_per_gpu_and_cuda_n_pins_them() -> None:
    """Engines on 'cuda' take the visible GPUs in turn; 'cuda:N' keeps every engine on GPU N."""
    assert [engine_device("cuda", slot, 2) for slot in range(3)] == ["cuda:0", "cuda:1", "cuda:0"]
    assert engine_device("cuda:1", 0, 2) == engine_device("cuda:1", 1, 2) == "cuda:1"
    assert engine_device("cpu", 5, 0) == "cpu"


def test_cuda_visible_devices_decides_how_many_gpus_are_visible(monkeypatch: pytest.MonkeyPatch) -> None:
    """CUDA_VISIBLE_DEVICES, where set, is what the engines will see ('' or -1: none)."""
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,2")
    assert visible_gpus() == 2
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "-1")
    assert visible_gpus() == 0


def test_one_engine_per_gpu_by_default_on_cuda(monkeypatch: pytest.MonkeyPatch) -> None:
    """On cuda the default engine count is the number of visible GPUs; an explicit count wins."""
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1,2")
    assert Settings(device="cuda").engine_count == 3
    assert Settings(device="cuda", engines=1).engine_count == 1
    assert Settings(device="cuda:2").engine_count == 1


def test_a_gpu_engine_takes_one_cpu_thread_unless_told(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")
    assert Settings(device="cuda").solo_engine_threads == Settings(device="cuda").shared_engine_threads == 1
    assert Settings(device="cuda", engine_threads=4).solo_engine_threads == 4
    assert Settings(device="cpu", engine_threads=4).solo_engine_threads == 4


def test_the_cpu_keeps_two_engines_by_default(monkeypatch: pytest.MonkeyPatch) -> None:
    """Without a GPU, auto is the CPU with its usual engine count."""
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    settings = Settings()
    assert settings.resolved_device == "cpu" and 1 <= settings.engine_count <= 2


def test_weight_files_are_known_without_torch(model_dir: Path) -> None:
    """The engine reads ahead exactly the weights the loader reads (here one safetensors file)."""
    from common.modelfiles import weight_files

    assert [p.name for p in weight_files(model_dir)] == ["model.safetensors"]


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_a_half_precision_engine_gives_float32_vectors_close_to_full_precision(model_dir: Path, dtype: str) -> None:
    """A placement's dtype reaches the weights and the compute; rows still come back as float32,
    within a cosine of 0.999 of the float32 engine's. (The placement is made directly: place()
    refuses a dtype this CPU has no instructions for, tests/unit/test_int8.py, but the engine's
    arithmetic in it is what a GPU runs.)"""
    import numpy as np
    import torch

    from common.modelfolder import read_model_folder
    from engine.runtime.device import DTYPES, Placement, place
    from engine.runtime.model import PoolingModel
    from server.tokenizing.tokenizer import TokenizerPool

    info, tokenizer = read_model_folder(model_dir), TokenizerPool(model_dir)
    tokens = [tokenizer.encode(t) for t in ["hello world", "warm pools start fast " * 20, "ünïcödé 🚀", ""]]
    full = PoolingModel(info, 1, place("cpu", "float32", [])).forward(tokens)
    half_model = PoolingModel(info, 1, Placement(torch.device("cpu"), DTYPES[dtype]))
    assert next(half_model.model.parameters()).dtype == DTYPES[dtype]
    half = half_model.forward(tokens)
    assert half.dtype == np.float32
    cosine = (full * half).sum(1) / np.linalg.norm(full, axis=1) / np.linalg.norm(half, axis=1)
    assert cosine.min() >= 0.999
