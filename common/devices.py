"""Which device each engine runs on, decided without torch: the HTTP process never imports it, and
a CUDA context created before the fork would be unusable in the forked engines anyway."""

from __future__ import annotations

import os
from pathlib import Path

NVIDIA_GPUS = Path("/proc/driver/nvidia/gpus")


class DeviceError(ValueError):
    """WARMPOOL_DEVICE asks for something this machine does not have."""


def visible_gpus() -> int:
    """GPUs this process may use: CUDA_VISIBLE_DEVICES where set, else those the NVIDIA driver lists."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        return len([d for d in visible.split(",") if d.strip() and d.strip() != "-1"])
    try:
        return sum(1 for _ in NVIDIA_GPUS.iterdir())
    except OSError:
        return 0


def resolve(device: str, gpus: int) -> str:
    """'auto' -> 'cuda' with a GPU, else 'cpu'; 'cuda' or 'cuda:N' only where that GPU is visible."""
    if device == "auto":
        return "cuda" if gpus else "cpu"
    if device.startswith("cuda"):
        index = int(device.partition(":")[2] or 0)
        if index >= gpus:
            seen = f"{gpus} GPU{'s' if gpus != 1 else ''} visible" if gpus else "no GPU is visible"
            raise DeviceError(f"WARMPOOL_DEVICE={device} but {seen} (CUDA_VISIBLE_DEVICES, /proc/driver/nvidia)")
    return device


def engine_device(device: str, slot: int, gpus: int) -> str:
    """The device of the engine in `slot`: engines spread one per GPU over 'cuda'; 'cuda:N' pins all."""
    if device == "cuda":
        return f"cuda:{slot % max(gpus, 1)}"
    return device
