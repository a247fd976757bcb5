"""How many engine restarts are allowed: at most `limit` within any sliding window of `window_s`."""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable


class RestartBudget:
    def __init__(self, limit: int, window_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.limit = limit
        self.window_s = window_s
        self._clock = clock
        self._spent: deque[float] = deque()
        self._lock = threading.Lock()

    def spend(self) -> bool:
        """Take one restart now if the window still has one; False once the budget is spent."""
        with self._lock:
            now = self._clock()
            self._expire(now)
            if len(self._spent) >= self.limit:
                return False
            self._spent.append(now)
            return True

    @property
    def used(self) -> int:
        """Restarts within the current window."""
        with self._lock:
            self._expire(self._clock())
            return len(self._spent)

    def _expire(self, now: float) -> None:
        while self._spent and now - self._spent[0] > self.window_s:
            self._spent.popleft()
