"""Whose requests reach a model's engines first: a tenant pressing past its quota lets the others go.

Demoted (server.tenants.guard.TenantPass.demoted), its inputs run as bulk work: behind the others'
inputs queued at an engine, between groups. But an engine cannot stop a forward it has begun, and
requests that arrive together (clients in step, every 50 ms) reach the engines a millisecond apart:
when the demoted one came first, an engine was already running it as the others arrived, and they
waited for it. So its request waits here first: HOLD_MIN_S for those arriving in the same moment
to be submitted, then while any other interactive request (priority 0 or lower) is at the engines,
HOLD_MAX_S at most (never starved: its quota still admits it). A Batch API job's lines are bulk
work without being demoted: they never wait here (bulk groups kept waiting while another engine ran
interactive work ran at 70 % of their rate).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator

# Requests that arrive in the same moment are tokenized and submitted within a few milliseconds.
HOLD_MIN_S = 0.005
# The longest a demoted request waits for the others: a few of their requests' time on a busy engine.
HOLD_MAX_S = 0.25


class Turns:
    """One model's interactive requests at its engines (counted on the event loop), and the wait of a
    demoted request for them."""

    def __init__(self) -> None:
        self.running = 0
        self._clear = asyncio.Event()
        self._clear.set()

    @contextlib.contextmanager
    def counted(self, interactive: bool) -> Iterator[None]:
        """Around a request's time at the engines: counted when `interactive`."""
        if not interactive:
            yield
            return
        self.running += 1
        self._clear.clear()
        try:
            yield
        finally:
            self.running -= 1
            if not self.running:
                self._clear.set()

    async def wait(self, deadline: float) -> None:
        """A demoted request's turn: HOLD_MIN_S, then until no interactive request is counted, HOLD_MAX_S
        in all at most, and never past `deadline` (the loop's time)."""
        loop = asyncio.get_running_loop()
        until = min(loop.time() + HOLD_MAX_S, deadline)
        await asyncio.sleep(max(0.0, min(HOLD_MIN_S, until - loop.time())))
        left = until - loop.time()
        if left > 0 and not self._clear.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._clear.wait(), left)
