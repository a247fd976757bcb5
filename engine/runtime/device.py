"""Where an engine computes and in which dtype; CUDA is initialised here, in the engine, after the fork.

A forked child of a process that has initialised CUDA cannot use CUDA, so neither the forkserver
nor the HTTP process may touch it: importing torch does not initialise CUDA, and nothing before
this module's `place` asks for a device.
"""

from __future__ import annotations

import platform
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from common.folderjson import ModelError

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
INT8 = "int8"  # float32 compute with the layers' projections in int8 (engine/precision/int8.py); CPU only
INT8_FLAGS = ("avx512_vnni", "avx_vnni", "amx_int8")  # /proc/cpuinfo's names for them


@dataclass(frozen=True)
class Placement:
    device: torch.device
    dtype: torch.dtype
    detail: dict[str, Any] = field(default_factory=dict)  # for the engine phase
    int8: bool = False

    @property
    def precision(self) -> str:
        """What the engine computes in: a dtype's name, or int8."""
        return INT8 if self.int8 else str(self.dtype).removeprefix("torch.")

    @property
    def cuda(self) -> bool:
        return self.device.type == "cuda"


def place(device: str, dtype: str, weights: list[Path]) -> Placement:
    """The engine's device and dtype. On CUDA the weight files are read into the page cache on a
    thread while CUDA initialises, so the one overlaps the other."""
    if not device.startswith("cuda"):
        chosen = cpu_dtype(dtype)
        return Placement(torch.device("cpu"), chosen, {"device": "cpu", "dtype": dtype_label(dtype)}, dtype == INT8)
    if dtype == INT8:
        raise ModelError("dtype int8 runs on the CPU only; on a GPU use bfloat16 or float16 (or auto)")
    reader = threading.Thread(target=_read_ahead, args=(weights,), name="weights-read-ahead", daemon=True)
    reader.start()
    started = time.monotonic()
    if not torch.cuda.is_available():
        raise ModelError(f"WARMPOOL_DEVICE={device}, but CUDA is not available to torch in the engine")
    target = torch.device(device)
    torch.cuda.set_device(target)
    torch.cuda.init()
    torch.zeros(1, device=target)  # the context itself, not only the driver
    # cuDNN's attention builds a plan for each new (inputs, longest) shape, ~5 ms of CPU each, and a
    # served batch is nearly always a new shape: flash and memory-efficient attention need no plan.
    torch.backends.cuda.enable_cudnn_sdp(False)
    init_s = time.monotonic() - started
    best = torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
    chosen = best if dtype == "auto" else DTYPES[dtype]
    reader.join()
    detail = {
        "device": str(target),
        "gpu": torch.cuda.get_device_name(target),
        "dtype": str(chosen).removeprefix("torch."),
        "cuda_init_s": round(init_s, 3),
    }
    return Placement(target, chosen, detail)


def cpu_dtype(dtype: str) -> torch.dtype:
    """The compute dtype on the CPU for a WARMPOOL_DTYPE value. bfloat16 and float16 only where the
    CPU has instructions for them (oneDNN's own test: AVX512-BF16 or AMX for bfloat16, AVX512-FP16 or
    AMX-FP16 for float16): elsewhere torch emulates them, slower than float32 and no smaller in
    activations, so a user asking for them would get the opposite of what they asked for."""
    if dtype == INT8 and not cpu_has_int8():
        raise ModelError(
            "dtype int8: this CPU has no int8 dot-product instructions (AVX512-VNNI, AVX-VNNI or AMX-INT8), "
            "without which int8 products run ~30x slower than float32's; use float32"
        )
    if dtype in ("auto", "float32", INT8):
        return torch.float32
    chosen = DTYPES[dtype]
    if not cpu_has(chosen):
        hint = "AVX512-BF16 or AMX" if chosen == torch.bfloat16 else "AVX512-FP16 or AMX-FP16"
        raise ModelError(
            f"dtype {dtype}: this CPU has no {dtype} instructions ({hint}); use float32, or int8 for speed"
        )
    return chosen


def cpu_has(dtype: torch.dtype) -> bool:
    """Whether the CPU computes `dtype` in its own instructions (oneDNN's check)."""
    checks = {torch.bfloat16: "_is_mkldnn_bf16_supported", torch.float16: "_is_mkldnn_fp16_supported"}
    check = getattr(torch.ops.mkldnn, checks[dtype], None) if dtype in checks else None
    return dtype == torch.float32 or (check is not None and torch.backends.mkldnn.is_available() and bool(check()))


def cpu_has_int8() -> bool:
    """Whether the CPU has the int8 dot-product instructions oneDNN's int8 products use (the Linux CPU
    flags; True where they cannot be read). Without them torch._int_mm falls back to a kernel that ran
    a 384 x 384 x 1536 product in 131 ms against float32's 4.6 ms on 2 AVX2 cores, and an int8 engine
    served 0.05x float32's inputs/s (bench.peers)."""
    flags = cpu_flags()
    return flags is None or any(flag in flags for flag in INT8_FLAGS)


def cpu_class() -> list[Any]:
    """What tells one CPU class from another for code and choices made for it: the architecture,
    torch's capability level and every instruction-set flag (the compile cache's key holds it)."""
    return [platform.machine(), torch.backends.cpu.get_cpu_capability(), sorted(cpu_flags() or [])]


def cpu_flags() -> list[str] | None:
    """The CPU's instruction-set flags (Linux's /proc/cpuinfo), None where they cannot be read."""
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        return None
    return next((line.split(":", 1)[1].split() for line in lines if line.startswith("flags")), None)


def dtype_label(dtype: str) -> str:
    """The phase's name for what a CPU engine computes in."""
    return dtype if dtype in (INT8, *DTYPES) else "float32"


def memory_detail(placement: Placement) -> dict[str, Any]:
    """GPU memory the engine holds (weights and what the allocator keeps), for the engine phase."""
    if not placement.cuda:
        return {}
    return {
        "gpu_memory_mb": round(torch.cuda.memory_allocated(placement.device) / 1e6, 1),
        "gpu_reserved_mb": round(torch.cuda.memory_reserved(placement.device) / 1e6, 1),
    }


def _read_ahead(paths: list[Path]) -> None:
    """Read the weight files once, so loading them onto the GPU finds them in the page cache."""
    for path in paths:
        try:
            with path.open("rb", buffering=0) as handle:
                while handle.read(16 << 20):
                    pass
        except OSError:
            return
