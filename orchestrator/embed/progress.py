"""Progress on stderr: tqdm's bar (rate and ETA) at a terminal, a plain line every few seconds
otherwise (a pod's log)."""

from __future__ import annotations

import sys
import time
from typing import Protocol, TextIO

PLAIN_EVERY_S = 10.0


class Progress(Protocol):
    def update(self, rows: int) -> None: ...
    def close(self) -> None: ...


def progress(total: int, done: int, stream: TextIO = sys.stderr) -> Progress:
    if stream.isatty():
        from tqdm import tqdm

        return tqdm(total=total, initial=done, unit="row", unit_scale=True, file=stream, dynamic_ncols=True)
    return PlainProgress(total, done, stream)


class PlainProgress:
    def __init__(self, total: int, done: int, stream: TextIO, every_s: float = PLAIN_EVERY_S) -> None:
        self.total, self.done, self.stream, self.every_s = total, done, stream, every_s
        self.started = self.last = time.monotonic()
        self.first = done  # rows an earlier run wrote: not this run's rate

    def update(self, rows: int) -> None:
        self.done += rows
        now = time.monotonic()
        if now - self.last >= self.every_s:
            self.last = now
            self._line(now)

    def close(self) -> None:
        self._line(time.monotonic())

    def _line(self, now: float) -> None:
        rate = (self.done - self.first) / max(now - self.started, 1e-9)
        eta = f"{(self.total - self.done) / rate:.0f}s" if rate > 0 else "?"
        print(f"embed: {self.done}/{self.total} rows, {rate:.1f} rows/s, ETA {eta}", file=self.stream, flush=True)
