"""Which forward each of a model's engines runs, eager or compiled, as its pipe last said.

A compiled forward's bits differ from eager's (every row, by up to ~1e-6 in float32: its kernels add
in another order), so the result cache (server/core/cached_run.py) keys an answer by the mode that
computed it, and keeps none while engines differ (WARMPOOL_COMPILE=auto's switch, one engine at a
time). An engine says it switched on its pipe before its first compiled answer, so the reader has
counted the change before it hands over any row computed after it.
"""

from __future__ import annotations

import threading

EAGER = "eager"


class EngineModes:
    """Engine slot -> its mode, and a count of changes (a cache entry is kept only if none came between
    its lookup and its answer)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._modes: dict[int, str] = {}
        self._changes = 0

    def set(self, slot: int, mode: str) -> None:
        with self._lock:
            if self._modes.get(slot) != mode:
                self._modes[slot] = mode
                self._changes += 1

    def drop(self, slot: int) -> None:
        with self._lock:
            if self._modes.pop(slot, None) is not None:
                self._changes += 1

    @property
    def slots(self) -> list[int]:
        with self._lock:
            return list(self._modes)

    def serving(self) -> tuple[str | None, int]:
        """The one mode every attached engine runs (None while they differ, or none is attached), and
        the count of changes so far."""
        with self._lock:
            modes = set(self._modes.values())
            return (next(iter(modes)) if len(modes) == 1 else None), self._changes
