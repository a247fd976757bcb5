"""`python -m orchestrator`: settings from WARMPOOL_* and flags, bind, then run until drained.

The port is bound and answering probes before the web stack and server modules are imported.
"""

from __future__ import annotations

import faulthandler
import os
import signal
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

from orchestrator import forkserver_early, platforms

if TYPE_CHECKING:  # the settings (pydantic) and the startup state (structlog) come after the forkserver's spawn
    from common.settings import Settings
    from common.startup import StartupState


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if args[:1] == ["embed"]:  # the corpus client: none of the serving path imported
        from orchestrator.embed.cli import main as embed

        return embed(args[1:])
    if "-h" in args or "--help" in args:
        from orchestrator.cli_help import render

        print(render(), end="")
        return 0
    spawned = forkserver_early.spawn()  # torch's import overlaps this process's own from here on
    try:
        return _serve(args, spawned)
    finally:
        if spawned is not None and not spawned.settled:  # refused before its plan: it would wait for none
            from orchestrator import forkserver

            forkserver.discard(spawned)
        if spawned is not None:
            spawned.cleanup()  # the plan's folder, where the forkserver never read it


def _serve(args: list[str], spawned: forkserver_early.EarlyForkserver | None) -> int:
    from common.settings import Settings, cache_bound
    from common.startup import StartupState
    from orchestrator import binding, forkserver, logs

    args, fixed = platforms.overrides(args, os.environ)
    settings = Settings(_cli_parse_args=args, **fixed)  # type: ignore[call-arg]
    # `kill -USR1 PID` writes every thread's stack to stderr: for a process that stops answering,
    # even one whose event loop is blocked (the handler runs in C, in whichever thread gets it)
    faulthandler.register(signal.SIGUSR1, all_threads=True)
    logs.configure(settings.log_level, settings.log_format)
    try:
        models = settings.per_model()
    except ValueError as exc:
        print(f"warmpool: {exc}", file=sys.stderr)
        return 2
    try:
        budget = _budget(settings)
        cache_bytes = cache_bound(settings.cache_bytes, budget)  # the result cache's share of the budget
    except ValueError as exc:
        print(f"warmpool: {exc}", file=sys.stderr)
        return 2
    several = [m.model_name for m in models] if settings.models else None
    startup = StartupState(several, tolerate_model_failures=settings.on_model_failure == "serve-others")
    startup.start("bind")
    try:
        sock = binding.bind(settings.host, settings.port)
    except OSError as exc:
        startup.fail("bind", f"cannot listen on {settings.host}:{settings.port}: {exc}")
        return 2
    startup.done("bind", host=settings.host, port=sock.getsockname()[1])
    if settings.port_file is not None:
        _write_port(settings.port_file, sock.getsockname()[1])
    hold = settings.load_wait if settings.hold_during_start == "on" else None
    early = binding.EarlyResponder(sock, startup, hold, settings.admission_permits).start()
    refusal = _refusal(settings)
    if refusal is not None:  # shown on /health/startup for fail_linger seconds, then exit 1
        if spawned is not None:
            forkserver.discard(spawned)
        startup.fail(*refusal)
        time.sleep(settings.fail_linger)
        return 1
    preload = list(dict.fromkeys(module for m in models for module in forkserver.preload_for(m.model_path)))
    preload += forkserver.preload_weights(models)
    method = forkserver.start(settings.start_method, startup, preload, spawned)
    start_prefetch(models, startup, preload)

    from orchestrator.lifecycle import run_server  # fastapi, uvicorn, server.*: imported while probes answer

    models_budget = None if budget is None else max(budget - cache_bytes, 0)
    return run_server(settings, models, startup, sock, early, method, models_budget, cache_bytes)


def _budget(settings: Settings) -> int | None:
    """WARMPOOL_MEMORY_BUDGET in bytes (a share of the cgroup's limit, or of the host's memory)."""
    if settings.memory_budget is None:
        return None
    from common.settings import budget_bytes
    from orchestrator.memory import limit_bytes

    return budget_bytes(settings.memory_budget, limit_bytes())


def _write_port(path: Path, port: int) -> None:
    """The bound port, for a health check that cannot know which one the platform chose; a file
    that cannot be written costs that check, not the start."""
    try:
        path.write_text(f"{port}\n")
    except OSError as exc:
        print(f"warmpool: cannot write the port to {path}: {exc}", file=sys.stderr)


def _refusal(settings: Settings) -> tuple[str, str] | None:
    """(phase, reason) for settings that must not start: an API key configured but empty (the
    server would serve open), a keys file that cannot be used, a device that is not there (the
    engine could not start)."""
    from common.devices import DeviceError
    from common.settings import ApiKeyError

    try:
        key = settings.resolved_api_key()
    except ApiKeyError as exc:
        return "bind", str(exc)
    if settings.api_keys_file is not None:
        from server.tenants.keysfile import KeysFileError
        from server.tenants.watcher import KeysWatcher

        try:  # a keys file that cannot be used at the start has no last good keys to fall back on
            KeysWatcher(settings.api_keys_file, settings.api_keys_reload_interval, key)
        except KeysFileError as exc:
            return "bind", str(exc)
    try:
        device = settings.resolved_device
    except DeviceError as exc:
        return "engine", str(exc)
    if any(m.dtype == "int8" for m in settings.per_model()) and device != "cpu":
        return "engine", f"dtype int8 runs on the CPU only, and the device is {device}: use bfloat16 or float16"
    return None


def start_prefetch(models: list[Settings], startup: StartupState, preload: list[str]) -> None:
    """Each model's files in turn, in the configured order (the environment with the first): the
    first model's bytes are not shared with the second's reads."""
    from orchestrator import prefetch, readorder

    def run(index: int) -> None:
        if index == len(models):
            return
        settings = models[index]
        phases = startup.for_model(settings.model_name)

        def done(detail: prefetch.Detail) -> None:
            phases.done("prefetch", **detail)
            run(index + 1)

        def skip(reason: str) -> None:
            phases.skip("prefetch", reason)
            run(index + 1)

        phases.start("prefetch", threads=settings.prefetch_threads)
        prefetch.start(
            settings.model_path,
            preload,
            settings.prefetch_threads,
            settings.prefetch == "on",
            index == 0 and settings.prefetch_environment == "on",
            on_progress=lambda d: phases.update("prefetch", **d),
            on_done=done,
            on_skip=skip,
            views=readorder.CPU_COMPUTE[settings.dtype] if settings.resolved_device == "cpu" else None,
        )

    run(0)


if __name__ == "__main__":
    sys.exit(main())
