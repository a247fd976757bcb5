"""`python -m orchestrator`: settings from WARMPOOL_* and flags, then run until drained."""

from __future__ import annotations

import sys

from orchestrator.phases import uptime  # noqa: F401  (starts the process clock first)
from orchestrator.settings import Settings


def main(argv: list[str] | None = None) -> int:
    settings = Settings(_cli_parse_args=sys.argv[1:] if argv is None else argv)  # type: ignore[call-arg]
    from orchestrator.lifecycle import run

    return run(settings)


if __name__ == "__main__":
    sys.exit(main())
