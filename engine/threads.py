"""torch threads for an engine that shares the machine with other engines.

Engines that each keep to their share of the cores run faster together than one engine on
all of them: fewer barriers per operator, and a core taken by the HTTP process stalls one
engine's thread instead of every thread of a single engine (two engines served 1.13-1.23x one
on 2 cores, bench.paired). An engine alone at work still uses every core, so one client's
latency keeps it.
"""

from __future__ import annotations

import time
from collections.abc import MutableSequence

import torch


class ThreadShare:
    """Marks this engine busy or idle in the shared flags and sizes torch's pool to match."""

    def __init__(self, busy: MutableSequence[int], slot: int, shared: int, solo: int) -> None:
        self.busy = busy
        self.slot = slot
        self.shared = shared
        self.solo = solo
        self.current = torch.get_num_threads()

    def working(self) -> None:
        """Called before each forward pass: re-read who else is busy."""
        self.busy[self.slot] = 1
        wanted = self.solo if sum(self.busy) == 1 else self.shared
        if wanted != self.current:
            torch.set_num_threads(wanted)
            self.current = wanted

    def idle(self) -> None:
        self.busy[self.slot] = 0

    def wait_quiet(self, timeout: float) -> None:
        """Until no other engine is at work, or `timeout` seconds: a CPU engine that follows the first
        at start-up warms up between the first requests rather than beside them (on 2 cores its
        warm-up beside the first request made that request 2-3x slower)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and any(flag for i, flag in enumerate(self.busy) if i != self.slot):
            time.sleep(0.002)  # a shared flag, not an event: polled, briefly, at most once per start
