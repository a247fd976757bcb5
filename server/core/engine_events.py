"""What an engine client reports as it runs (EngineEvents), and a forward's figures (BatchStats)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol


@dataclass
class BatchStats:
    batch_size: int
    batch_tokens: int
    inference_ms: float


class EngineEvents(Protocol):
    """What the engine client reports; called on its reader and watchdog threads."""

    def batch_done(self, stats: BatchStats) -> None: ...

    def engine_lost(self, slot: int) -> None: ...

    def engine_stalled(self, slot: int, seconds: float) -> None:
        """Work outstanding and no answer for `seconds`: the engine should be replaced."""

    def engines_stalled(self, slots: list[int], every: bool) -> None:
        """The engines now taken for stalled changed to `slots`; `every`: all attached ones are."""

    def engine_compile(self, slot: int, detail: dict[str, Any]) -> None:
        """Engine `slot`'s compiled forward changed state (engine/compiling/compilation.py's detail)."""
