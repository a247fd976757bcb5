"""One compile wrapper around any native family: the packed forward exported with a dynamic token
count and compiled ahead of time by AOTInductor into a package, then run from that package.

Eager, a forward is dozens of operators dispatched from Python, each element-wise one a pass over
memory of its own; the compiled graph fuses the element-wise work (bias + activation, residual +
norm) and dispatches nothing from Python. Attention stays the per-input loop (engine/layers/encoder.py),
one opaque operator in the graph over the lengths tensor, so one artifact serves every batch.

The package holds code, not weights: it runs on the model's own tensors (the forkserver's shared
copies), given by name when it is loaded, so a compiled engine holds no second copy of the model.
Tensors the graph needs that are not the model's parameters or buffers (rotary tables, MPNet's
bias) are saved beside it. Building a package takes tens of seconds (engine/compiling/worker.py does
it in its own process); loading one, a fraction of a second (engine/compiling/compilation.py).
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

import torch
from torch import nn

from engine.compiling.artifacts import CorruptArtifact, verify, write_manifest
from engine.layers.packed import Packed
from engine.precision import gemm
from engine.runtime.device import cpu_class

PACKAGE = "model.pt2"
CONSTANTS = "constants.pt"
# The engine's own code is part of the key: the graph is traced from it (and from the model folder's reading).
SOURCES = [
    *sorted(Path(__file__).parents[1].rglob("*.py")),  # every module of the engine package
    *(
        Path(__file__).parents[2] / "common" / name
        for name in ("modelfolder.py", "folderjson.py", "st_modules.py", "modelfiles.py", "splade.py")
    ),
]


_FAKE_REGISTERED = False


class CompileError(Exception):
    """An artifact that cannot serve this model: the engine stays eager, and says why."""


class _Exported(nn.Module):
    """The model over the Packed's tensors alone: no Python lists, so nothing in the graph depends
    on how many inputs or tokens a batch has."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(
        self,
        ids: torch.Tensor,
        types: torch.Tensor,
        positions: torch.Tensor,
        seq: torch.Tensor,
        starts: torch.Tensor,
        lengths: torch.Tensor,
    ) -> torch.Tensor:
        return self.model(Packed(ids, types, positions, seq, starts, lengths, spans=[]))  # type: ignore[no-any-return]


def _inputs(p: Packed) -> list[torch.Tensor]:
    return [p.ids, p.types, p.positions, p.seq, p.starts, p.lengths]


def cache_key(folder: Path, precision: str) -> str:
    """The artifact's name in the cache: the model's files (name, size, modification time), the
    precision, torch's version, the CPU's instruction set and the engine's source. Another model,
    dtype, torch or CPU misses; a copy of the same files with their times kept hits. The instruction
    set is every CPU flag, not torch's capability level: the C++ is compiled for this CPU
    (-march=native), and code for one AVX-512 CPU can be an illegal instruction on another."""
    files = sorted(f for f in folder.rglob("*") if f.is_file())
    facts: dict[str, Any] = {
        "files": [[str(f.relative_to(folder)), f.stat().st_size, f.stat().st_mtime_ns] for f in files],
        "precision": precision,
        "torch": torch.__version__,
        "isa": cpu_class(),
        "engine": hashlib.sha256(b"".join(f.read_bytes() for f in SOURCES)).hexdigest(),
    }
    return hashlib.sha256(json.dumps(facts, sort_keys=True).encode()).hexdigest()[:32]


def _attend_shape(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *rest: object) -> torch.Tensor:
    """warmpool::attend's output for the exporter, which traces shapes, not values."""
    return q.new_empty((q.shape[0], q.shape[1] * q.shape[2]))


# Inductor's precompiled headers: two of ~150 MB, 10.4 s to build on a 2-core Zen 4, then 3.0 s off
# each compile. The worker builds one package a process, in a scratch folder: never worth it there
# (kept in the cache, 300 MB of its volume and a first compile 10 s longer). A process that builds
# many (the compile tests) turns them on.
PRECOMPILED_HEADERS = False


def build_package(model: nn.Module, sample: Packed, out: Path) -> None:
    """Export `model` over `sample`'s shapes with the token and input counts dynamic, compile it
    into out/model.pt2 without its weights, and save the other tensors it reads to out/constants.pt."""
    import torch._inductor  # here only: the engine that runs a package never imports the compiler

    global _FAKE_REGISTERED
    if not _FAKE_REGISTERED:
        torch.library.register_fake("warmpool::attend", _attend_shape)
        torch.library.register_fake("warmpool::linear", gemm.linear_shape)
        _FAKE_REGISTERED = True
    tokens = torch.export.Dim("tokens", min=1, max=1 << 20)
    inputs = torch.export.Dim("inputs", min=1, max=1 << 16)
    shapes = ({0: tokens},) * 4 + ({0: inputs},) * 2
    with torch.no_grad():
        program = torch.export.export(_Exported(model).eval(), tuple(_inputs(sample)), dynamic_shapes=shapes)
    out.mkdir(parents=True, exist_ok=True)
    torch._inductor.aoti_compile_and_package(
        program,
        package_path=str(out / PACKAGE),
        inductor_configs={
            "aot_inductor.package_constants_in_so": False,
            "aot_inductor.precompile_headers": PRECOMPILED_HEADERS,
        },
    )
    named = dict(_named_tensors(model))
    extra = {name: t for name, t in program.constants.items() if name not in named}
    torch.save({name: t.detach().clone() for name, t in extra.items()}, out / CONSTANTS)
    write_manifest(out)  # last: checked before any engine maps the package (engine/compiling/artifacts.py)


def _named_tensors(model: nn.Module) -> list[tuple[str, torch.Tensor]]:
    owned = [*model.named_parameters(remove_duplicate=False), *model.named_buffers(remove_duplicate=False)]
    return [(f"model.{name}", tensor) for name, tensor in owned]


class CompiledForward:
    """A built package run on `model`'s own weights: called like the model, on a Packed. The loader
    unpacks the package's shared object into `unpack` (under TMPDIR, its only way to be told) and
    removes it when this object goes: not /tmp, which containers mount noexec."""

    def __init__(self, folder: Path, model: nn.Module, unpack: Path) -> None:
        try:
            verify(folder)  # before mapping: torn machine code is a crash, not an exception
        except CorruptArtifact as exc:
            raise CompileError(f"cannot load the compiled artifact in {folder}: {exc}") from exc
        saved = os.environ.get("TMPDIR")
        try:
            unpack.mkdir(parents=True, exist_ok=True)
            os.environ["TMPDIR"] = str(unpack)
            loader = torch._C._aoti.AOTIModelPackageLoader(str(folder / PACKAGE), "model", False, 1, -1)
            extra = torch.load(folder / CONSTANTS, weights_only=True)
        except Exception as exc:  # a torn or foreign file raises whatever its reader raises
            raise CompileError(f"cannot load the compiled artifact in {folder}: {type(exc).__name__}: {exc}") from exc
        finally:
            if saved is None:
                os.environ.pop("TMPDIR", None)
            else:
                os.environ["TMPDIR"] = saved
        have = {**dict(_named_tensors(model)), **extra}
        try:
            wanted = loader.get_constant_fqns()
            missing = [name for name in wanted if name not in have]
            if missing:
                raise CompileError(f"the compiled artifact in {folder} reads tensors this model has not: {missing[:3]}")
            # user-managed: the package keeps pointers to these tensors, copies nothing
            loader.load_constants({name: have[name] for name in wanted}, False, True, True)
        except RuntimeError as exc:  # shapes or dtypes that do not match the model's
            raise CompileError(f"the compiled artifact in {folder} does not fit this model: {exc}") from exc
        self._loader = loader
        self._keep = extra  # the saved tensors live as long as the package that points at them

    def __call__(self, p: Packed) -> torch.Tensor:
        return self._loader.run(_inputs(p))[0]  # type: ignore[no-any-return]
