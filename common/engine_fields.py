"""The engine processes' settings: how many, where, in what precision, with which threads, how they are
compiled, restarted and judged stalled (the rest: common/setting_fields.py, common/service_fields.py)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Literal

from pydantic import Field

from common.cpus import usable_cpus
from common.service_fields import ServiceFields
from common.wire import COMPILE_NICE


class EngineFields(ServiceFields):
    engines: int | None = Field(
        None,
        ge=1,
        le=64,
        description=(
            "Engine processes; on the CPU they share one copy of the weights ([Memory](../operations/memory.md))."
        ),
        json_schema_extra={"default_text": "2 on the CPU (1 on one CPU), one per visible GPU on cuda"},
    )
    device: str = Field(
        "auto",
        pattern=r"^(auto|cpu|cuda(:[0-9]+)?)$",
        description=(
            "`auto` (cuda when a GPU is visible, else cpu), `cpu`, `cuda` (engines spread one per GPU) or "
            "`cuda:N`; a GPU that is not there fails the start."
        ),
    )
    dtype: Literal["auto", "float32", "bfloat16", "float16", "int8"] = Field(
        "auto",
        description=(
            "`auto` (float32 on the CPU; bfloat16 on GPUs that have it, else float16), `float32`, `bfloat16`,"
            " `float16` (on the CPU only where it has instructions for them), `int8` (CPU only; see [CPU "
            "precision](../operations/precision.md))."
        ),
    )
    allow_bin_weights: Literal["on", "off"] = Field(
        "off",
        description=(
            "`on`: read `pytorch_model.bin` weights (pickles) where a folder has no safetensors, with "
            "`torch.load(weights_only=True)`; `off`: such a folder fails its `engine` phase saying so. "
            "bge-m3's `sparse_linear.pt` and `colbert_linear.pt` are read that way either way, tensors only."
        ),
    )
    engine_threads: int = Field(
        default_factory=lambda: usable_cpus(),  # looked up when built: tests replace it
        ge=1,
        description=(
            "torch threads of an engine working alone (every other engine idle for 0.2 s or more, and its last "
            "forward on them not slowed by a core another process took); engines "
            "busy together take `ENGINE_THREADS / ENGINES` each. Default: the CPUs in the process's affinity "
            "set, capped by a cgroup CPU quota (a pod's `limits.cpu`, rounded down), not the host's count; "
            "on a GPU 1, since the engine's CPU work there is launching kernels."
        ),
        json_schema_extra={"default_text": "usable CPUs (1 on a GPU)"},
    )
    engine_nice: int = Field(
        5, ge=0, le=19, description="Niceness of the engine process, so the HTTP process gets a core at once."
    )
    engine_keep_warm: float = Field(
        0.2,
        ge=0,
        le=10,
        description=(
            "Seconds an engine that last ran on every core keeps its threads awake after a forward while the other "
            "engines stay idle, so that a request after a short pause finds them ready: one core busy meanwhile; "
            "0: its threads sleep once OpenMP's own spin ends "
            "([Kubernetes](../operations/kubernetes.md#threads-kept-awake-between-requests))."
        ),
    )
    executor_threads: int = Field(4, ge=1, description="Threads for parsing, tokenizing and response building.")
    start_method: Literal["forkserver", "spawn"] = Field(
        "forkserver", description="How engines start; `spawn` is the fallback."
    )
    max_restarts: int = Field(5, ge=0, description="Engine restarts allowed within the restart window.")
    restart_window: float = Field(300.0, gt=0, description="Seconds over which restarts are counted.")
    engine_stall_timeout: float | None = Field(
        None,
        gt=0,
        description="Seconds an engine with work outstanding may answer nothing before it is killed and replaced.",
        json_schema_extra={
            "default_text": (
                "from warm-up: 8 x the time of the largest forward answered in one go (a 1,536-token group, "
                "or the longest input, on a native model; a full batch on the transformers fallback), at "
                "least 10 s, at most half of `WARMPOOL_REQUEST_TIMEOUT`"
            )
        },
    )
    compile: Literal["auto", "off", "required"] = Field(
        "auto",
        description=(
            "Compiled engines (native families on the CPU): `auto` serves at once, eager, and switches each "
            "engine to the compiled forward when it is built (with the artifact cached: before the first "
            "request); `required`: not ready until compiled; `off`: eager only "
            "([Compiled engines](../operations/compile.md))."
        ),
    )
    compile_cache: Path = Field(
        default_factory=lambda: (
            Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "warmpool" / "compile"
        ),
        description=(
            "Folder of compiled artifacts, one per model files, precision, torch version, CPU and warmpool version;"
            " also the engines' GEMM backend choices, one per torch version, CPU and precision"
            " ([GEMM backends](../operations/gemm.md))."
        ),
        json_schema_extra={
            "default_text": "`~/.cache/warmpool/compile` (`/var/cache/warmpool` in the image, a volume)"
        },
    )
    compile_timeout: float = Field(
        900.0, gt=0, description="Seconds a compile may take; past it the compile is killed and the engine stays eager."
    )
    compile_nice: int = Field(
        COMPILE_NICE,
        ge=0,
        le=19,
        description=(
            "Niceness of the compile worker (at least the engine's): at 19 it takes the cycles serving leaves,"
            " and other busy work on the machine can starve it; lower it for the compile to get a share."
        ),
    )
