"""An engine's way to its compiled forward: from the cache at start, or from a worker while it serves.

With the artifact in the cache the engine loads it before it is ready (a fraction of a second) and
serves compiled from its first request. Without, it starts engine/compiling/worker.py and serves
eager; between batches it looks whether the worker is done and switches then, so no batch is cut
in two. Before it switches it runs one small batch both ways and keeps the compiled forward only if
the two agree. Compiling never fails serving: an artifact that does not load or does not agree
leaves the engine eager, with the reason in its detail (a cached one is quarantined and built
again), and so does a worker that fails or runs past its deadline (it is killed, with its
compilers); a cached one that killed the engine before this one is quarantined unloaded
(engine/compiling/artifacts.py: checksums, and a marker while an engine loads one).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from common.folderjson import ModelError
from common.wire import COMPILE_NICE, Tokens
from engine.compiling.artifacts import crashed_loading, loading, quarantine
from engine.compiling.package import CompiledForward, CompileError, cache_key
from engine.layers.packed import Packed
from engine.runtime.model import PoolingModel

# how far a compiled answer may lie from the eager one, by precision (the order they add in differs)
AGREE = {"float32": 1e-4, "float16": 2e-2, "bfloat16": 1e-1, "int8": 1e-1}
CHECK_LENGTHS = (5, 11)
ROOT = str(Path(__file__).resolve().parents[2])  # where `engine` is importable from
UNPACKED = ".unpacked"  # in the cache: each engine's loaded packages, in a folder named by its pid


def begin(
    model: PoolingModel,
    mode: str,
    cache: Path | None,
    timeout_s: float,
    waiting: Callable[[dict[str, Any]], None] = lambda detail: None,
    nice: int = COMPILE_NICE,
) -> tuple[Compilation | None, dict[str, Any]]:
    """A model's compilation under a WARMPOOL_COMPILE `mode` (auto, off, required), started; where there is
    none, None and why not. Under `required`, finished (`waiting` told first when it must be built): the
    caller is not ready before. ModelError where `required` cannot be met."""
    if mode == "off":
        return None, {"mode": "eager", "reason": "WARMPOOL_COMPILE=off"}
    text_only = model.info.vision is None  # the compiled graph is a text forward: a CLIP's towers run eager
    if not model.packed or not text_only or model.placement.device.type != "cpu" or cache is None:
        reason = "compiled engines are for native text families on the CPU"
        if mode == "required":
            raise ModelError(f"WARMPOOL_COMPILE=required, but {reason} (this one: {_kind(model)})")
        return None, {"mode": "eager", "reason": reason}
    compilation = Compilation(model, cache, timeout_s, nice)
    compilation.start()
    if mode == "required" and compilation.pending:
        waiting(compilation.detail)
        compilation.wait()
    if mode == "required" and compilation.detail["mode"] != "compiled":
        raise ModelError(f"WARMPOOL_COMPILE=required, but {compilation.detail.get('reason')}")
    return compilation, compilation.detail


def _kind(model: PoolingModel) -> str:
    return f"{'native' if model.packed else 'transformers'} on {model.placement.device.type}"


class Compilation:
    """The compiled forward of one engine's model, on its way: `detail` says where it stands."""

    def __init__(self, model: PoolingModel, cache: Path, timeout_s: float, nice: int = COMPILE_NICE) -> None:
        self.model = model
        self.nice = nice
        self.cache = cache
        self.timeout_s = timeout_s
        self.worker: subprocess.Popen[bytes] | None = None
        self.log: Any = None
        self.started = time.monotonic()
        self.artifact: Path | None = None
        self.detail: dict[str, Any] = {"mode": "eager", "cache": "miss"}
        self.unpacked = cache / UNPACKED

    @property
    def pending(self) -> bool:
        return self.worker is not None

    def start(self) -> None:
        """Load the artifact if the cache has it, else start the worker that builds it. Whatever
        fails here leaves the engine eager, with the reason: compiling never fails serving. An
        artifact that is there but does not serve is quarantined and built again."""
        try:
            _clear_unpacked(self.unpacked)
            key = cache_key(self.model.info.path, self.model.placement.precision)
            self.artifact = self.cache / key
            self.detail["artifact"] = key
            crashed = crashed_loading(self.cache, key)
            if crashed and self.artifact.is_dir():  # it killed the engine before this one: never again
                self._set_aside(f"an engine (pid {crashed[0]}) died while loading or first running it")
            elif self.artifact.is_dir():
                self.detail["cache"] = "hit"
                if self._switch():
                    return
                self._set_aside(self.detail["reason"])
            self._spawn(self.artifact)
        except Exception as exc:  # an unwritable cache, a vanished model file, ...
            self._give_up(f"{type(exc).__name__}: {exc}")

    def _spawn(self, artifact: Path) -> None:
        artifact.parent.mkdir(parents=True, exist_ok=True)
        command = [
            sys.executable,
            "-m",
            "engine.compiling.worker",
            str(self.model.info.path),
            self.model.placement.precision,
            str(artifact),
            str(os.getpid()),
            str(self.nice),
        ]
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [ROOT, os.environ.get("PYTHONPATH")]))}
        # the worker's output, for the reason a failed compile gives: unnamed, gone with the engine
        self.log = tempfile.TemporaryFile(dir=artifact.parent)  # noqa: SIM115  (kept for _log_tail)
        # its own process group (killing it kills the compilers it runs too) in the engine's session:
        # a session of its own is an autogroup of its own where the kernel has them, which shares the
        # CPU with the server's as an equal whatever its niceness (beside a 1.3 GB model's compile an
        # engine got 1.0 of 2 cores and answered 22 requests in 10 s, against 118 without it)
        self.worker = subprocess.Popen(
            command,
            stdin=subprocess.DEVNULL,
            stdout=self.log,
            stderr=subprocess.STDOUT,
            env=env,
            process_group=0,
        )
        self.detail["compiling"] = True

    def poll(self) -> bool:
        """Between batches: True when the mode changed (compiled, or eager for good)."""
        worker = self.worker
        if worker is None:
            return False
        try:
            code = worker.poll()
            if code is None:
                if time.monotonic() - self.started <= self.timeout_s:
                    return False
                self.stop()
                self._give_up(f"the compile ran past WARMPOOL_COMPILE_TIMEOUT ({self.timeout_s:g} s); killed")
                return True
            if code != 0:
                self._give_up(f"the compile worker exited with {code}: {self._log_tail()}")
                return True
            self.worker = None
            self._switch()
        except Exception as exc:
            self._give_up(f"{type(exc).__name__}: {exc}")
        return True

    def wait(self) -> None:
        """Until the compiled forward is in use or given up (WARMPOOL_COMPILE=required)."""
        while self.pending and not self.poll():
            time.sleep(0.1)  # polling a child's exit: no condition to wait on but the exit itself

    def stop(self) -> None:
        """Kill the worker and the compilers it runs, if it still runs."""
        worker = self.worker
        if worker is not None and worker.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(worker.pid, signal.SIGKILL)
            worker.wait()

    def _switch(self) -> bool:
        """Load the artifact and use it if it agrees with eager; else say why (False)."""
        self.worker = None
        self.detail.pop("compiling", None)
        loaded = time.monotonic()
        assert self.artifact is not None
        try:
            # marked while mapped and first run: if this crashes the engine, the next one knows why
            with loading(self.cache, self.artifact.name):
                compiled = CompiledForward(self.artifact, self.model.model, self.unpacked / str(os.getpid()))
                self._check(compiled)
        except CompileError as exc:
            self.detail["reason"] = str(exc)
            return False
        self.model.compiled = compiled
        self.detail.pop("reason", None)
        self.detail.update(mode="compiled", load_s=round(time.monotonic() - loaded, 3))
        self.detail["seconds"] = round(time.monotonic() - self.started, 1)
        return True

    def _check(self, compiled: CompiledForward) -> None:
        token = self.model.pad_id + 1
        packed = Packed.of([Tokens([token] * n) for n in CHECK_LENGTHS]).to(self.model.placement.device)
        with torch.inference_mode():
            try:
                got = compiled(packed).float()
            except Exception as exc:  # whatever the package's runtime raises
                raise CompileError(f"the compiled forward failed: {type(exc).__name__}: {exc}") from exc
            want = self.model.model(packed).float()
        limit = AGREE.get(self.model.placement.precision, 1e-1)
        if got.shape != want.shape or not torch.allclose(got, want, atol=limit, rtol=limit):
            raise CompileError(f"the compiled forward disagrees with the eager one (beyond {limit:g})")

    def _set_aside(self, reason: str) -> None:
        """The cached artifact does not serve: quarantined (engine/compiling/artifacts.py), built again."""
        assert self.artifact is not None
        self.detail.update(cache="invalid", reason=reason)
        if (aside := quarantine(self.artifact, reason)) is not None:
            self.detail["quarantined"] = aside

    def _give_up(self, reason: str) -> None:
        self.worker = None
        self.detail.pop("compiling", None)
        self.detail.update(mode="eager", reason=reason)

    def _log_tail(self) -> str:
        if self.log is None:
            return "no output"
        self.log.seek(0)
        lines = self.log.read().decode(errors="replace").strip().splitlines()
        return lines[-1][-300:] if lines else "no output"


def _clear_unpacked(root: Path) -> None:
    """Remove what killed engines unpacked (their loaders never ran their cleanup): folders named
    by a pid no process has."""
    for folder in root.glob("*") if root.is_dir() else []:
        try:
            os.kill(int(folder.name), 0)
        except ProcessLookupError:
            shutil.rmtree(folder, ignore_errors=True)
        except (ValueError, PermissionError):
            continue  # not ours, or a live process of another user
