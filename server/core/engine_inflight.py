"""What the engine client holds while a request's inputs are at the engines (server.core.engine_client)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from common.wire import Keyed
from server.core.outcome import Outcome


@dataclass(eq=False)
class InFlight:
    """One request's inputs sent to the engines: its future, its rows as they arrive, its render."""

    future: asyncio.Future[Outcome]
    items: list[Keyed]
    rows: list[np.ndarray | None]
    then: Callable[[Outcome], Any] | None = None
    submitted: float = field(default_factory=time.perf_counter)
    inference_ms: float = 0.0
    attempts: int = 0
    tenant: str = ""  # whose request, where keys name tenants (engine routing weighs their shares)


@dataclass(eq=False)
class InFlightInput:
    """One input on its way: its request, its row there, and the engine it was sent to."""

    request: InFlight
    index: int
    slot: int | None

    @property
    def tokens(self) -> int:
        return len(self.request.items[self.index][1].input_ids)

    @property
    def interactive(self) -> int:
        """Its tokens if it is at priority 0 or lower, else 0."""
        tokens = self.request.items[self.index][1]
        return len(tokens.input_ids) if tokens.priority <= 0 else 0
