"""What a model counts for in WARMPOOL_MEMORY_BUDGET before it loads, which models start within it,
and which goes first to make room (orchestrator/ondemand.py's ModelPool applies them)."""

from __future__ import annotations

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
    copies a CPU engine converts to its dtype, and ENGINE_BYTES per engine."""
    try:
        files = [f for f in files_to_load(settings.model_path) if f.suffix in (".safetensors", ".bin")]
        weights = sum(f.stat().st_size for f in files)
        cpu = settings.resolved_device == "cpu"
        compute = readorder.CPU_COMPUTE[settings.dtype] if cpu else None
        converted = readorder.converted_bytes([f for f in files if f.suffix == ".safetensors"], compute)
    except (ModelError, OSError, ValueError):  # its engine phase will say what is wrong with the folder
        weights = converted = 0
    return weights + converted + settings.engine_count * ENGINE_BYTES


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
