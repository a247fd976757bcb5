"""One engine's end of the channel: its own sender and reader threads, its load, its progress.

Each engine has a sender thread of its own, so an engine that stops reading (SIGSTOP, a hang)
fills only its own pipe: the blocked send holds up nothing sent to the other engines.
"""

from __future__ import annotations

import contextlib
import queue
import threading
import time
from collections.abc import Callable
from multiprocessing.connection import Connection
from typing import Any

from common.wire import send


class EnginePipe:
    """Load and progress are read and written under the engine client's lock."""

    def __init__(
        self,
        slot: int,
        conn: Connection,
        on_message: Callable[[EnginePipe, str, Any], None],
        on_closed: Callable[[EnginePipe], None],
    ) -> None:
        self.slot = slot
        self.conn = conn
        self.load = 0  # tokens sent and not yet answered, cancelled ones included until it next answers
        self.interactive = 0  # of which inputs at priority 0 or lower, not answered nor cancelled
        self.cancelled = 0  # of which tokens were cancelled: the engine may be running them still
        self.last_progress = time.monotonic()
        self._on_message = on_message
        self._on_closed = on_closed
        self._outbox: queue.SimpleQueue[tuple[str, Any] | None] = queue.SimpleQueue()
        self._threads = 2
        self._threads_lock = threading.Lock()
        threading.Thread(target=self._send_loop, name=f"engine-sender-{slot}", daemon=True).start()
        threading.Thread(target=self._read_loop, name=f"engine-reader-{slot}", daemon=True).start()

    def send(self, message: tuple[str, Any]) -> None:
        self._outbox.put(message)

    def close_sender(self) -> None:
        """The sender thread ends once what is queued has been sent."""
        self._outbox.put(None)

    def add(self, tokens: int, interactive: int) -> None:
        """`tokens` sent, `interactive` of them at priority 0 or lower."""
        if self.load == 0:  # idle until now: the stall clock starts with this work
            self.last_progress = time.monotonic()
        self.load += tokens
        self.interactive += interactive

    def answered(self, tokens: int, interactive: int) -> None:
        self.load -= tokens
        self.interactive -= interactive

    def cancel(self, tokens: int, interactive: int) -> None:
        """Cancelled tokens keep counting as load until the engine next answers, so least-load
        routing does not pick an engine that is still busy with (or stuck on) them; as interactive
        tokens they stop at once (those only break ties between equal loads)."""
        self.cancelled += tokens
        self.interactive -= interactive

    def progressed(self) -> None:
        """The engine sent something: a result, an error, or CANCELLED once it has dropped the inputs
        of a CANCEL. Cancelled tokens stop counting then: whatever of them it still runs is brief."""
        self.last_progress = time.monotonic()
        self.load -= self.cancelled
        self.cancelled = 0

    def stalled_for(self, now: float) -> float:
        """Seconds with work outstanding and no answer (0 when idle)."""
        return now - self.last_progress if self.load > 0 else 0.0

    def _send_loop(self) -> None:
        while (message := self._outbox.get()) is not None:
            # A broken pipe is the reader's to notice: it runs the engine-lost path.
            with contextlib.suppress(OSError, ValueError):
                send(self.conn, message)
        self._thread_done()

    def _read_loop(self) -> None:
        while True:
            try:
                kind, body = self.conn.recv()
            except (EOFError, OSError):
                break
            self._on_message(self, kind, body)
        self.close_sender()
        self._thread_done()
        self._on_closed(self)

    def _thread_done(self) -> None:
        """The pipe closes once both its threads are done with it: closed under a send or a recv,
        its fd number could be reused by a new pipe or socket while that call still used it."""
        with self._threads_lock:
            self._threads -= 1
            last = self._threads == 0
        if last:
            self.conn.close()
