"""Admission: one permit per input, taken before any tokenizing; past capacity the answer is 429 at once.

TEI takes one permit per input from a semaphore and rejects when it is empty; vLLM counts a
request only after tokenizing it, so its overload answers arrive seconds late.
"""

from __future__ import annotations

import threading


class Admission:
    """`reserve`: the share of the permits only urgent work (priority 0 or lower) may take, so a bulk
    flood at a lower priority (a higher number) cannot leave interactive requests a 429."""

    def __init__(self, capacity: int, reserve: float = 0.0) -> None:
        self.capacity = capacity
        self.bulk_capacity = max(1, capacity - int(capacity * reserve))
        self._used = 0
        self._lock = threading.Lock()

    @property
    def used(self) -> int:
        return self._used

    def try_acquire(self, inputs: int, held: int = 0, bulk: bool = False) -> int | None:
        """Permits newly taken so that `inputs` are covered (a request larger than the capacity
        takes all of it; a bulk one, all the bulk capacity), counting the `held` ones already
        taken; None when they do not fit."""
        capacity = self.bulk_capacity if bulk else self.capacity
        wanted = min(max(inputs, 1), capacity) - held
        if wanted <= 0:
            return 0
        with self._lock:
            if self._used + wanted > capacity:
                return None
            self._used += wanted
            return wanted

    def full(self) -> bool:
        """No permit left for any request, whatever its priority (read without the lock: a stale
        answer only moves one refusal from before the body to after it)."""
        return self._used >= self.capacity

    def bulk_fits(self) -> bool:
        """Whether bulk work may go on now: the permits in use are within the bulk share."""
        return self._used <= self.bulk_capacity

    def release(self, permits: int) -> None:
        with self._lock:
            self._used -= permits
