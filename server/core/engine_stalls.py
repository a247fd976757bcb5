"""Which engines are stalled: the engine client's watchdog's judgement, kept apart from its dispatch.

An engine with work outstanding that answers nothing for STALLED_SHARE of the stall timeout (and at
least two groups' time) is taken for stalled: the client sends it no new work while another engine
answers, and moves what it holds to those. Past the whole stall timeout it is reported, once per pipe,
so the supervisor can kill and replace it.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass

from server.core.engine_pipe import EnginePipe

# Of the stall timeout, how long an engine with work may answer nothing before it is taken for
# stalled: routed around and its inputs moved, well before it is killed. A healthy engine answers
# each group of a batch in a fraction of a second; the stall timeout is 8 such groups or more.
STALLED_SHARE = 0.25


@dataclass(frozen=True)
class StallReport:
    changed: bool  # the engines taken for stalled are not those of the last look
    every: bool  # every engine is taken for stalled
    past_timeout: list[tuple[EnginePipe, float]]  # newly past the whole timeout, and how long each has waited


class EngineStalls:
    def __init__(self, timeout_s: float | None = None) -> None:
        self.timeout_s = timeout_s  # None until known: nothing is judged before then
        self.group_s = 0.0  # one group's forward as warm-up measured: none is taken for stalled sooner than two
        self.slots: set[int] = set()  # taken for stalled: routed around
        self._reported: set[EnginePipe] = set()  # past the whole timeout already, once per pipe

    def judge(self, pipes: Collection[EnginePipe], now: float) -> StallReport | None:
        """A look at the engines at monotonic time `now` (None while the timeout is unknown); the caller
        holds the engine client's lock."""
        timeout = self.timeout_s
        if timeout is None:
            return None
        waited = {pipe: pipe.stalled_for(now) for pipe in pipes}
        after = min(max(STALLED_SHARE * timeout, 2 * self.group_s), timeout)
        was, self.slots = self.slots, {pipe.slot for pipe, seconds in waited.items() if seconds > after}
        past = [(pipe, seconds) for pipe, seconds in waited.items() if seconds > timeout and pipe not in self._reported]
        self._reported.update(pipe for pipe, _ in past)
        every = bool(self.slots) and self.slots == {pipe.slot for pipe in pipes}
        return StallReport(was != self.slots, every, past)

    def forget(self, pipe: EnginePipe) -> None:
        """A pipe whose engine is gone: nothing more is remembered of it."""
        self._reported.discard(pipe)
