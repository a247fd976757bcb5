"""`python -m orchestrator`: settings from WARMPOOL_* and flags, bind, then run until drained.

The port is bound and answering probes before the web stack and server modules are imported.
"""

from __future__ import annotations

import sys

from orchestrator.phases import Phases, uptime  # noqa: F401  (starts the process clock first)
from orchestrator.settings import Settings


def main(argv: list[str] | None = None) -> int:
    settings = Settings(_cli_parse_args=sys.argv[1:] if argv is None else argv)  # type: ignore[call-arg]
    from orchestrator import binding, forkserver, logs

    logs.configure(settings.log_level, settings.log_format)
    phases = Phases()
    phases.start("bind")
    try:
        sock = binding.bind(settings.host, settings.port)
    except OSError as exc:
        phases.fail("bind", f"cannot listen on {settings.host}:{settings.port}: {exc}")
        return 2
    phases.done("bind", host=settings.host, port=sock.getsockname()[1])
    early = binding.EarlyResponder(sock, phases).start()
    method = forkserver.start(settings.start_method, phases, forkserver.preload_for(settings.model_path))
    start_prefetch(settings, phases)

    from orchestrator.lifecycle import (
        run,
    )  # fastapi, uvicorn, server.*: imported while probes answer

    return run(settings, phases, sock, early, method)


def start_prefetch(settings: Settings, phases: Phases) -> None:
    from orchestrator import prefetch

    phases.start("prefetch", threads=settings.prefetch_threads)
    prefetch.start(
        settings.model_path,
        settings.prefetch_threads,
        settings.prefetch == "on",
        on_progress=lambda d: phases.update("prefetch", **d),
        on_done=lambda d: phases.done("prefetch", **d),
        on_skip=lambda reason: phases.skip("prefetch", reason),
    )


if __name__ == "__main__":
    sys.exit(main())
