"""structlog set-up: JSON lines when stdout is not a TTY (containers, CI, a log collector), one short
line a person reads per event when it is (`make serve` at a terminal); WARMPOOL_LOG_FORMAT chooses."""

from __future__ import annotations

import logging
import sys
from collections.abc import MutableMapping
from typing import Any

import structlog

# Said by the line's own columns, or too long for one: left to the JSON format (and /health/startup).
_COLUMNS = ("event", "level", "timestamp", "phase", "state", "duration_s", "started_s")
_LONGEST_VALUE = 60


class Lines:
    """One line an event: the time, the level past info, the event (a startup phase: its name, state and
    duration), then its scalar details as key=value; nested details (memory tables, per-engine maps)
    are left out. An exception's traceback follows on the lines after."""

    def __call__(self, _: Any, __: str, event: MutableMapping[str, Any]) -> str:
        time = str(event.get("timestamp", ""))[11:23]
        level = str(event.get("level", "info"))
        head = [time, level.upper()] if level != "info" else [time]
        if event.get("event") == "phase":
            head += [f"{event.get('phase', '')}:", str(event.get("state", ""))]
            if event.get("state") != "running" and event.get("duration_s") is not None:
                head.append(f"in {event['duration_s']:.2f} s")
        else:
            head.append(str(event.get("event", "")))
        exception = event.pop("exception", None)
        details = [f"{key}={_short(value)}" for key, value in event.items() if key not in _COLUMNS and _scalar(value)]
        line = "  ".join(part for part in (" ".join(head), " ".join(details)) if part)
        return f"{line}\n{exception}" if exception else line


def _scalar(value: Any) -> bool:
    return value is not None and not isinstance(value, dict | list | tuple | set)


def _short(value: Any) -> str:
    text = str(value)
    return text if len(text) <= _LONGEST_VALUE else text[: _LONGEST_VALUE - 1] + "…"


def configure(level: str = "info", fmt: str = "auto") -> None:
    use_json = fmt == "json" or (fmt == "auto" and not sys.stdout.isatty())
    renderer: structlog.typing.Processor = structlog.processors.JSONRenderer() if use_json else Lines()
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.format_exc_info,
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(logging.getLevelName(level.upper())),
        logger_factory=structlog.PrintLoggerFactory(sys.stdout),
        cache_logger_on_first_use=True,
    )
    logging.basicConfig(
        level=max(logging.WARNING, logging.getLevelName(level.upper())),
        stream=sys.stderr,
        format="%(levelname)s %(name)s: %(message)s",
    )
