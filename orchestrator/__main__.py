"""`python -m orchestrator`: settings from WARMPOOL_* and flags, bind, then run until drained.

The port is bound and answering probes before the web stack and server modules are imported.
"""

from __future__ import annotations

import sys
import time

from common.devices import DeviceError
from common.settings import ApiKeyError, Settings
from common.startup import StartupState


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if "-h" in args or "--help" in args:
        from orchestrator.cli_help import render

        print(render(), end="")
        return 0
    settings = Settings(_cli_parse_args=args)  # type: ignore[call-arg]
    from orchestrator import binding, forkserver, logs

    logs.configure(settings.log_level, settings.log_format)
    startup = StartupState()
    startup.start("bind")
    try:
        sock = binding.bind(settings.host, settings.port)
    except OSError as exc:
        startup.fail("bind", f"cannot listen on {settings.host}:{settings.port}: {exc}")
        return 2
    startup.done("bind", host=settings.host, port=sock.getsockname()[1])
    early = binding.EarlyResponder(sock, startup).start()
    refusal = _refusal(settings)
    if refusal is not None:  # shown on /health/startup for fail_linger seconds, then exit 1
        startup.fail(*refusal)
        time.sleep(settings.fail_linger)
        return 1
    preload = forkserver.preload_for(settings.model_path)
    method = forkserver.start(settings.start_method, startup, preload)
    start_prefetch(settings, startup, preload)

    from orchestrator.lifecycle import run_server  # fastapi, uvicorn, server.*: imported while probes answer

    return run_server(settings, startup, sock, early, method)


def _refusal(settings: Settings) -> tuple[str, str] | None:
    """(phase, reason) for settings that must not start: an API key configured but empty (the
    server would serve open), a device that is not there (the engine could not start)."""
    try:
        settings.resolved_api_key()
    except ApiKeyError as exc:
        return "bind", str(exc)
    try:
        settings.resolved_device  # noqa: B018  (resolving is the check)
    except DeviceError as exc:
        return "engine", str(exc)
    return None


def start_prefetch(settings: Settings, startup: StartupState, preload: list[str]) -> None:
    from orchestrator import prefetch

    startup.start("prefetch", threads=settings.prefetch_threads)
    prefetch.start(
        settings.model_path,
        preload,
        settings.prefetch_threads,
        settings.prefetch == "on",
        settings.prefetch_environment == "on",
        on_progress=lambda d: startup.update("prefetch", **d),
        on_done=lambda d: startup.done("prefetch", **d),
        on_skip=lambda reason: startup.skip("prefetch", reason),
    )


if __name__ == "__main__":
    sys.exit(main())
