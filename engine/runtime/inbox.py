"""An engine's incoming messages, received by a thread of its own while the engine computes.

The engine reads its pipe between groups, and the socket under the pipe holds about 200 KB (the
kernel's default send buffer): past that the HTTP process's sender waits. Texts are a few hundred
bytes each, but an image is its pixels (3 x 224 x 224: 150 KB, 600 KB when they were float32), so
an engine reading only between groups found one image waiting after each, however many were queued
behind it: at 32 clients on bench.images' ViT-B/32 it ran groups of 1-3 images, each a pass over the
tower's weights.
Received here while torch computes (its operators release the GIL), they wait in the engine's queue
and the next batch takes them all: groups of ~5, 1.12x the images/s (bench.paired --images).

Only a model that takes images has the thread: texts fit the socket by the hundred, so the engine
of a text model reads its pipe itself, between groups, as it always has.
"""

from __future__ import annotations

import queue
import threading
from multiprocessing.connection import Connection
from typing import Any

from common.wire import Msg

Message = tuple[str, Any]


class Inbox:
    """`poll` and `recv` as a Connection has them, over what the reader thread has received (without
    `reader`, the connection's own); the pipe's end (EOFError, OSError) is raised by `recv` in its
    turn, and again on every later call."""

    def __init__(self, conn: Connection, reader: bool = True) -> None:
        self.conn = conn  # sends go straight to it
        self.reader = reader
        self._received: queue.SimpleQueue[Message | BaseException] = queue.SimpleQueue()
        self._next: list[Message | BaseException] = []  # what poll() took off the queue, not yet recv()'d
        if reader:
            threading.Thread(target=self._receive, name="engine-inbox", daemon=True).start()

    def _receive(self) -> None:
        while True:
            try:
                message: Message = self.conn.recv()
            except (EOFError, OSError) as exc:
                self._received.put(exc)
                return
            self._received.put(message)
            if message[0] == Msg.STOP:  # nothing is read after it
                return

    def poll(self, timeout: float = 0.0) -> bool:
        """Whether a message (or the pipe's end) is waiting, waiting up to `timeout` seconds for one."""
        if not self.reader:
            return self.conn.poll(timeout)
        if not self._next:
            try:
                self._next.append(self._received.get(timeout=timeout) if timeout > 0 else self._received.get_nowait())
            except queue.Empty:
                return False
        return True

    def recv(self) -> Message:
        if not self.reader:
            message: Message = self.conn.recv()
            return message
        item = self._next.pop() if self._next else self._received.get()
        if isinstance(item, BaseException):
            self._next.append(item)  # the end stays the end
            raise item
        return item
