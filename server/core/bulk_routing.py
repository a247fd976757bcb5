"""Which engines a bulk input may go to. While interactive inputs are about (one at priority 0 or
lower within URGENT_WINDOW_S), bulk inputs (above 0) keep off one engine of several: an interactive
input then finds an engine with no bulk group running, instead of waiting for one and sharing the
cores with it. Bulk work (a Batch API job) runs on the others meanwhile, on all of them again once
interactive traffic stops. With one engine there is nothing to keep: bulk yields between its groups
(the engine's priority order).

On 2 Zen 5 cores, one interactive client beside a Batch API job (all-MiniLM-L6-v2, compiled): with
every engine taking bulk work p50 17-18 ms, p99 28-30 ms (2.2-2.6x alone), ~7 ms of it waiting for
an engine whatever the bulk groups' size (16 to 64 tokens); with one kept, p50 9.3-9.5 ms, p99
20.5-20.8 ms (1.55x alone), the job's lines/s meanwhile as before.
"""

from __future__ import annotations

import time
from collections.abc import Iterable

from common.wire import Keyed

# As long as an engine keeps bulk groups small after an urgent input (engine.runtime.batching's
# URGENT_WINDOW_S): interactive requests seconds apart still find an engine kept for them.
URGENT_WINDOW_S = 10.0


class BulkRouting:
    def __init__(self) -> None:
        self.urgent_at = -URGENT_WINDOW_S  # when an interactive input was last submitted (monotonic)

    def saw(self, items: Iterable[Keyed]) -> None:
        if any(tokens.priority <= 0 for _, tokens in items):
            self.urgent_at = time.monotonic()

    def targets(self, slots: list[int], priority: int) -> list[int]:
        """The engines an input at `priority` may go to: all but the lowest slot for bulk work while
        interactive inputs are about and there are several, else all."""
        if priority <= 0 or len(slots) < 2 or time.monotonic() - self.urgent_at >= URGENT_WINDOW_S:
            return slots
        kept = min(slots)
        return [slot for slot in slots if slot != kept]
