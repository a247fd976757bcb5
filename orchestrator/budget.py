"""What a model counts for in WARMPOOL_MEMORY_BUDGET before it loads, which models start within it,
and which goes first to make room (orchestrator/ondemand.py's ModelPool applies them)."""

from __future__ import annotations

import math

from common.folderjson import ModelError
from common.modelfiles import files_to_load
from common.settings import Settings
from orchestrator import readorder

# An allowance for what an engine holds beside the model's weights (its heap, its share of torch's
# pages, fused projections). Not calibrated: on all-MiniLM-L6-v2 an engine's measured PSS stayed
# below weights + this, so the estimate is what counted there.
ENGINE_BYTES = 150 * 10**6


def estimate(settings: Settings) -> int:
    """A model's memory before it loads: its weight files (mapped, shared by its engines), the
    copies a CPU engine converts to its dtype, ENGINE_BYTES per engine, and what each CPU engine
    may hold for LoRA adapters (adapters(): every engine holds its own copy of every adapter)."""
    try:
        files = [f for f in files_to_load(settings.model_path) if f.suffix in (".safetensors", ".bin")]
        weights = sum(f.stat().st_size for f in files)
        cpu = settings.resolved_device == "cpu"
        compute = readorder.CPU_COMPUTE[settings.dtype] if cpu else None
        converted = readorder.converted_bytes([f for f in files if f.suffix == ".safetensors"], compute)
    except (ModelError, OSError, ValueError):  # its engine phase will say what is wrong with the folder
        weights = converted = 0
    return weights + converted + settings.engine_count * (ENGINE_BYTES + adapters(settings))


def adapters(settings: Settings) -> int:
    """What one CPU engine may hold for LoRA adapters: WARMPOOL_ADAPTERS' tensors in its compute dtype
    (engine/layers/lora.py converts them: its file's size for float32), and WARMPOOL_ADAPTER_BYTES, the
    cap on the run-time ones, where run-time loading is on (WARMPOOL_ADAPTER_ROOT). Run-time adapters
    without a cap are unbounded: nothing can be set aside for them, measuring the engines' PSS counts them.
    0 on a GPU, where they are held in its memory, which the budget leaves out."""
    try:
        if settings.resolved_device != "cpu":
            return 0
    except ValueError:  # no such device: the engine phase will say so
        return 0
    item = readorder.ITEM_BYTES[readorder.CPU_COMPUTE[settings.dtype]]
    at_start = 0
    for _, folder in settings.adapter_folders:
        try:
            found = readorder.tensors(folder / "adapter_model.safetensors")[1]
        except (OSError, ValueError):  # the engine's start will say what is wrong with the folder
            continue
        at_start += sum(item * math.prod(shape) for _, _, shape, _, _ in found)
    run_time = settings.adapter_cap if settings.adapter_root is not None else None
    return at_start + (run_time or 0)


def first_resident(models: list[Settings], estimates: list[int], budget: int | None) -> list[bool]:
    """Which models start: every `always` one, and the `auto` ones in the order listed while they
    fit in what the `always` ones leave of the budget."""
    used = sum(size for m, size in zip(models, estimates, strict=True) if m.resident == "always")
    chosen = []
    for m, size in zip(models, estimates, strict=True):
        fits = m.resident == "always" or budget is None or used + size <= budget
        used += size if fits and m.resident == "auto" else 0
        chosen.append(fits)
    return chosen


def least_recently_used(candidates: list[str], last_used: dict[str, float]) -> str | None:
    """The model to unload first: the one answered longest ago (never answered: first of all)."""
    return min(candidates, key=lambda name: last_used.get(name, 0.0), default=None)
