"""The engine returns the heap memory its batches freed, when it is idle (glibc's malloc_trim); the
forkserver returns what building the models freed, before it forks an engine (release()).

glibc serves an allocation above its mmap threshold with a mapping of its own, unmapped when freed;
below it, from the heap, which keeps what is freed for reuse. The threshold rises to the size of
every larger block freed (up to 32 MiB), so after one big batch the activations of every later one
come from the heap, and batches of ever new sizes leave it fragmented: an all-MiniLM-L6-v2 engine
that ran one input of every length from 3 to 511 tokens grew from 358 MB to 953 MB resident and
stayed there. A threshold fixed at 128 KiB kept it at 327 MB but served 32 clients 1.28x slower
(bench.paired: a mapping and its page faults for every activation). Trimming instead, when the
queue is empty and the heap holds more than TRIM_ABOVE free, kept it at 336 MB; a trim takes 5-10 ms
of that idle time, at most once per CHECK_EVERY_S. Not glibc (musl): nothing is done.
"""

from __future__ import annotations

import ctypes
import time
from collections.abc import Callable

TRIM_ABOVE = 32 << 20  # free bytes inside the heap worth handing back
CHECK_EVERY_S = 1.0


class _Mallinfo2(ctypes.Structure):
    _fields_ = [
        (name, ctypes.c_size_t)
        for name in (
            "arena",
            "ordblks",
            "smblks",
            "hblks",
            "hblkhd",
            "usmblks",
            "fsmblks",
            "uordblks",
            "fordblks",
            "keepcost",
        )
    ]


class HeapTrim:
    """idle(), called when the engine's queue is empty, hands the heap's free memory back to the system
    (at most once per `every_s`, above `trim_above` free); release() at once."""

    def __init__(self, trim_above: int = TRIM_ABOVE, every_s: float = CHECK_EVERY_S) -> None:
        self.trim_above, self.every_s = trim_above, every_s
        self.last = time.monotonic()
        self.trims = 0  # trims done
        self._trim: Callable[[int], int] | None = None
        self._info: Callable[[], _Mallinfo2] | None = None
        try:
            libc = ctypes.CDLL(None)
            trim, info = libc.malloc_trim, libc.mallinfo2
            info.restype = _Mallinfo2
            self._trim, self._info = trim, info
        except (OSError, AttributeError):  # not glibc, or one older than 2.33 (no mallinfo2): left alone
            pass

    @property
    def detail(self) -> str:
        if self._trim is None:
            return "allocator left as it is (not glibc 2.33 or newer)"
        return f"glibc heap trimmed when idle above {self.trim_above >> 20} MiB free"

    def free_bytes(self) -> int:
        """Bytes free inside the heap (glibc's fordblks); 0 where that cannot be read."""
        return int(self._info().fordblks) if self._info is not None else 0

    def idle(self) -> None:
        now = time.monotonic()
        if self._trim is None or now - self.last < self.every_s:
            return
        self.last = now
        if self.free_bytes() >= self.trim_above:
            self.release()

    def release(self) -> None:
        """Hand the heap's free memory back now (nothing where the allocator is not glibc's)."""
        if self._trim is not None:
            self._trim(0)
            self.trims += 1
