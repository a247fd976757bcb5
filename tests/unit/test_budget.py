"""A model's memory estimate before it loads (orchestrator/budget.py): its LoRA adapters count once per
engine, each engine holding its own copy: WARMPOOL_ADAPTERS' in the engine's dtype, and the room
WARMPOOL_ADAPTER_BYTES gives run-time ones where they can be loaded."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
from safetensors.numpy import save_file

from common.settings import Settings
from orchestrator.budget import estimate

ENGINES = 2
ELEMENTS = 2 * 4 * 32  # one projection's A [4, 32] and B [32, 4]


def settings(**values: Any) -> Settings:
    """No model files there: the estimate is the engines' allowance, plus what is asked of it here."""
    return Settings(model="/nonexistent/model", engines=ENGINES, **values)  # type: ignore[call-arg]


def adapter(folder: Path) -> str:
    """WARMPOOL_ADAPTERS naming one PEFT folder: A saved in float32, B in float16."""
    folder.mkdir()
    weights = {
        "base_model.model.encoder.layer.0.attention.self.query.lora_A.weight": np.ones((4, 32), np.float32),
        "base_model.model.encoder.layer.0.attention.self.query.lora_B.weight": np.ones((32, 4), np.float16),
    }
    save_file(weights, str(folder / "adapter_model.safetensors"))
    return f"legal={folder}"


@pytest.mark.parametrize(("dtype", "item_bytes"), [("auto", 4), ("bfloat16", 2)])
def test_adapters_loaded_at_start_count_per_engine_in_its_dtype(tmp_path: Path, dtype: str, item_bytes: int) -> None:
    """Converted to the engine's dtype as the engine places them (float16 B in a float32 engine: twice its file)."""
    with_them = estimate(settings(dtype=dtype, adapters=adapter(tmp_path / "legal")))
    assert with_them - estimate(settings(dtype=dtype)) == ENGINES * ELEMENTS * item_bytes


def test_the_run_time_adapters_cap_counts_per_engine_where_they_can_be_loaded(tmp_path: Path) -> None:
    """WARMPOOL_ADAPTER_BYTES with WARMPOOL_ADAPTER_ROOT; without a root no adapter is loaded at run time."""
    alone = estimate(settings())
    assert estimate(settings(adapter_root=tmp_path, adapter_bytes="64Mi")) - alone == ENGINES * 64 * 2**20
    assert estimate(settings(adapter_bytes="64Mi")) == alone


def test_a_missing_adapter_folder_counts_nothing_and_fails_nothing_here(tmp_path: Path) -> None:
    """The engine's start says what is wrong with the folder."""
    assert estimate(settings(adapters=f"legal={tmp_path / 'gone'}")) == estimate(settings())


def test_adapters_on_a_gpu_are_left_out_as_its_memory_is(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(Settings, "resolved_device", property(lambda self: "cuda:0"))
    named = adapter(tmp_path / "legal")
    with_them = estimate(settings(adapters=named, adapter_root=tmp_path, adapter_bytes="64Mi"))
    assert with_them == estimate(settings())
