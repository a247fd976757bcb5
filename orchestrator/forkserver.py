"""Start the forkserver at t≈0 so its preload (torch, transformers, the engine) overlaps the rest.

Started in the background, never on the critical path: in vLLM a synchronous forkserver start
made start-up slower (+6.8 s), a background one saved 7.6 s on a 32B model.
"""

from __future__ import annotations

import contextlib
import json
import multiprocessing
import os
import signal
from dataclasses import dataclass, field
from multiprocessing.context import BaseContext
from pathlib import Path

import structlog

from common.devices import DeviceError
from common.folderjson import ModelError
from common.modelfolder import read_model_folder
from common.settings import Settings
from common.startup import StartupState
from common.wire import FORKSERVER_MODELS_ENV, FORKSERVER_PLAN_ENV
from orchestrator.forkserver_early import EarlyForkserver, write_plan
from orchestrator.pidfd import ProcessRef

# engine.process imports torch and the engine; engine.transformers_preload adds transformers and the
# modules its model-loading path would import lazily.
ENGINE = "engine.process"
TRANSFORMERS = "engine.transformers_preload"
WEIGHTS = "engine.forkserver_preload"
STOP_TIMEOUT_S = 5.0  # for the forkserver to exit once asked, before it is killed


def preload_for(model_path: Path) -> list[str]:
    """What the forkserver imports ahead of the engine: torch and the engine for models served
    natively (engine.families), plus transformers and the architecture's module for the rest."""
    try:
        info = read_model_folder(model_path)
    except ModelError:
        return [ENGINE, TRANSFORMERS]  # the engine phase will report the broken folder
    if info.native:
        return [ENGINE]
    name = str(info.config.get("model_type", "")).replace("-", "_")
    modeling = [f"transformers.models.{name}.modeling_{name}"] if name.isidentifier() else []
    return [ENGINE, TRANSFORMERS, *modeling]


def preload_weights(models: list[Settings]) -> list[str]:
    """The forkserver also builds the native models of CPU engines before forking any, so that every
    engine and every re-fork shares one copy of their weights (engine/runtime/preloaded.py): [WEIGHTS] to add
    to the preload, with [folder, dtype, GEMM records' folder] in its environment; [] when no model
    qualifies. The models get their GEMM backend chosen there (engine/precision/gemm.py: records kept
    in the compile cache's folder), for eager and compiled engines alike."""
    # the dtype by engine.runtime.device.place's rule for the CPU
    entries = [
        [str(m.model_path), "float32" if m.dtype == "auto" else m.dtype, str(m.compile_cache)]
        for m in models
        if _builds(m)
    ]
    if not entries:
        return []
    os.environ[FORKSERVER_MODELS_ENV] = json.dumps(entries)  # the forkserver inherits this process's environment
    return [WEIGHTS]


def _builds(m: Settings) -> bool:
    """A native model for CPU engines forked from the forkserver; not a resident=auto one: its copy
    would stay in the forkserver while the model is unloaded (its engines load it, from the page cache)."""
    if m.resident == "auto":
        return False
    try:
        return m.start_method == "forkserver" and m.resolved_device == "cpu" and read_model_folder(m.model_path).native
    except (ModelError, DeviceError):  # the engine phase reports the folder or the device
        return False


log = structlog.get_logger("warmpool.forkserver")


@dataclass
class StartMethod:
    ctx: BaseContext
    fallback_reason: str | None = None
    preload: list[str] = field(default_factory=list)

    @property
    def name(self) -> str:
        return "spawn" if self.fallback_reason else "forkserver"


def start(method: str, startup: StartupState, preload: list[str], early: EarlyForkserver | None = None) -> StartMethod:
    """Launch the forkserver now (returns at once), or hand the one spawned `early` the rest of its
    preload; fall back to spawn and say why (an early one then stopped)."""
    chosen = _choose(method, preload)
    if early is not None:
        _follow_up(early, chosen, preload)
    if chosen.fallback_reason is None:
        try:
            from multiprocessing import forkserver

            forkserver.ensure_running()
        except Exception as exc:
            chosen = StartMethod(multiprocessing.get_context("spawn"), f"forkserver failed: {exc}")
    startup.start("forkserver", method=chosen.name, at=early.spawned if early and not chosen.fallback_reason else None)
    if chosen.fallback_reason:
        log.warning("forkserver_unavailable", reason=chosen.fallback_reason)
        startup.update("forkserver", fallback_reason=chosen.fallback_reason)
    return chosen


def _follow_up(early: EarlyForkserver, chosen: StartMethod, preload: list[str]) -> None:
    """The early forkserver's plan: the preload modules it has not imported and the models it builds
    (or, where the settings chose spawn, it is stopped). A forkserver started after this (a
    replacement) takes the whole list, and the models from its environment, as if never early."""
    os.environ.pop(FORKSERVER_PLAN_ENV, None)
    if chosen.fallback_reason is not None:
        discard(early)
        return
    models = json.loads(os.environ.get(FORKSERVER_MODELS_ENV, "[]"))
    write_plan(early, [m for m in preload if m not in (ENGINE, WEIGHTS)], models)


def discard(early: EarlyForkserver) -> None:
    """Stop a forkserver spawned early that will not serve (spawn chosen, settings refused): it forked
    nothing yet, so it is killed at once rather than asked."""
    os.environ.pop(FORKSERVER_PLAN_ENV, None)
    stop(StartMethod(multiprocessing.get_context("forkserver")), timeout_s=0.0)
    early.cleanup()
    early.settled = True


def _choose(method: str, preload: list[str]) -> StartMethod:
    if method == "spawn":
        return StartMethod(multiprocessing.get_context("spawn"), "spawn requested (WARMPOOL_START_METHOD)")
    if "forkserver" not in multiprocessing.get_all_start_methods():
        return StartMethod(multiprocessing.get_context("spawn"), "forkserver is not available here")
    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload(preload)
    return StartMethod(ctx, preload=preload)


def stop(method: StartMethod, timeout_s: float = STOP_TIMEOUT_S) -> None:
    """Stop the forkserver once no engine holds it: asked to exit (its alive pipe closed), then
    killed if it has not within `timeout_s`. The stdlib's own stop (there is no public one) waits
    for its exit without a bound: a stopped or hung forkserver held SIGTERM's exit for good."""
    if method.fallback_reason is not None:
        return
    from multiprocessing import forkserver, util

    server = forkserver._forkserver
    with server._lock:  # type: ignore[attr-defined]
        pid, alive = server._forkserver_pid, server._forkserver_alive_fd  # type: ignore[attr-defined]
        if pid is None:
            return
        os.close(alive)
        server._forkserver_alive_fd = server._forkserver_pid = None  # type: ignore[attr-defined]
        if not exited(pid, timeout_s):
            if timeout_s:  # 0: asked not to wait
                log.warning("forkserver_stop_timeout", pid=pid, timeout_s=timeout_s)
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)  # killed: it is gone at once
        address = server._forkserver_address  # type: ignore[attr-defined]
        if address and not util.is_abstract_socket_namespace(address):
            with contextlib.suppress(OSError):
                os.unlink(address)
        server._forkserver_address = None  # type: ignore[attr-defined]


def exited(pid: int, timeout_s: float) -> bool:
    """Wait up to `timeout_s` for child `pid` to exit, and reap it; False if it is still running."""
    ref = ProcessRef(pid)
    try:
        if not ref.exited(timeout_s):
            return False
    finally:
        ref.close()
    os.waitpid(pid, 0)
    return True


def pid(method: StartMethod) -> int | None:
    """The running forkserver's pid (None under spawn, or before it is started)."""
    if method.fallback_reason is not None:
        return None
    from multiprocessing import forkserver

    return forkserver._forkserver._forkserver_pid  # type: ignore[attr-defined,no-any-return]


def replace(method: StartMethod, reason: str) -> bool:
    """Kill a forkserver that stopped forking (SIGKILL, then its exit awaited without reaping it):
    the next fork finds it dead and the stdlib starts a new one, preload included. A fork blocked
    on it reads EOF and fails. Engines it forked keep running (the supervisor watches them by pidfd).
    False when there was none to kill (spawn, or not started)."""
    hung = pid(method)
    if hung is None:
        return False
    log.error("forkserver_replaced", pid=hung, reason=reason)
    ref = ProcessRef(hung)
    try:
        ref.kill()
        # Left a zombie for ensure_running's waitpid, which then starts the new one; returning
        # before it is one, that waitpid would still see it alive and fork from it again.
        ref.exited(STOP_TIMEOUT_S)
    finally:
        ref.close()
    return True
