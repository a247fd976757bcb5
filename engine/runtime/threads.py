"""torch threads for an engine that shares the machine with other engines.

Engines that each keep to their share of the cores run faster together than one engine on
all of them: fewer barriers per operator, and a core taken by the HTTP process stalls one
engine's thread instead of every thread of a single engine (two engines served 1.13-1.23x one
on 2 cores, bench.paired). An engine alone at work still uses every core, so one client's
latency keeps it.

"Alone" means no other engine has worked within the last SOLO_AFTER_S, not merely none at this
instant. Under steady load two engines pass each other between groups all the time; one that took
every core in such a gap still held them when the other began its next group, three threads on two
cores, and GNU OpenMP's team then waits at each operator's barrier for a thread the kernel has
parked: that group ran several times slower. bfloat16 at 32 clients (bench.paired): p99 544 ms with
the instant rule, 99 ms with one thread each always, at 1.17x the inputs/s.
"""

from __future__ import annotations

import time
from collections.abc import MutableSequence

import torch

# An engine takes every core only when every other one has been idle at least this long: longer
# than the gap between two groups under load (a group is tens of ms), short beside a client's pause.
SOLO_AFTER_S = 0.2
BUSY = -1.0  # a slot's value while its engine works; otherwise the monotonic time it went idle (0: never busy)


class ThreadShare:
    """Marks this engine busy or idle in the shared slots and sizes torch's pool to match. Each slot
    is BUSY or when its engine went idle (CLOCK_MONOTONIC, one clock for every process)."""

    def __init__(self, busy: MutableSequence[float], slot: int, shared: int, solo: int) -> None:
        self.busy = busy
        self.slot = slot
        self.shared = shared
        self.solo = solo
        self.current = torch.get_num_threads()

    def working(self) -> None:
        """Called before each forward pass: re-read who else is busy."""
        self.busy[self.slot] = BUSY
        now = time.monotonic()
        others = [when for i, when in enumerate(self.busy) if i != self.slot]
        alone = all(when != BUSY and now - when >= SOLO_AFTER_S for when in others)
        wanted = self.solo if alone else self.shared
        if wanted != self.current:
            torch.set_num_threads(wanted)
            self.current = wanted

    def idle(self) -> None:
        if self.busy[self.slot] == BUSY:
            self.busy[self.slot] = time.monotonic()

    def wait_quiet(self, timeout: float) -> None:
        """Until no other engine is at work, or `timeout` seconds: a CPU engine that follows the first
        at start-up warms up between the first requests rather than beside them (on 2 cores its
        warm-up beside the first request made that request 2-3x slower)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and any(when == BUSY for i, when in enumerate(self.busy) if i != self.slot):
            time.sleep(0.002)  # a shared flag, not an event: polled, briefly, at most once per start
