"""A process watched and signalled through a pidfd, whoever its parent is.

An engine is the forkserver's child, not ours: multiprocessing learns of its exit from the
forkserver, so once a hung forkserver is killed and replaced, every engine it forked looks dead
(exit code 255) to its `Process` object while it still runs, and could be neither killed nor
waited for. A pidfd refers to that one process (never to a later one given the same pid) and
tells its exit whoever reaps it.

Each one holds a descriptor until closed: whoever stops watching a process (an unload, a re-fork)
closes its ref, or every load would leave one open in the HTTP process.
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import threading
import time
from pathlib import Path


class ProcessRef:
    def __init__(self, pid: int) -> None:
        self.pid = pid
        # kill() and close() come from different threads: the signal is sent under the lock, so never
        # through a closed descriptor's number, which a new pidfd (another process) may have taken.
        self._lock = threading.Lock()
        self._closed = False
        try:
            self._fd: int | None = os.pidfd_open(pid)
        except (OSError, AttributeError):  # gone already, or a kernel without pidfds: poll /proc
            self._fd = None

    def exited(self, timeout_s: float = 0.0) -> bool:
        """Whether it has exited (a zombie counts: it runs no more), waiting up to `timeout_s`.
        Reaps nothing: its parent's waitpid still sees it. Once closed: True (see close)."""
        fd = self._fd
        if self._closed:
            return True
        if fd is None:
            deadline = time.monotonic() + timeout_s
            while not (gone := _gone(self.pid)) and time.monotonic() < deadline:
                time.sleep(0.02)
            return gone
        try:
            return bool(select.select([fd], [], [], timeout_s)[0]) or self._closed
        except (OSError, ValueError):  # closed under the wait
            return self._closed

    def kill(self) -> None:
        """SIGKILL (works on a stopped process too); nothing if it has exited or the ref is closed."""
        with self._lock, contextlib.suppress(ProcessLookupError):
            if self._closed:
                return
            if self._fd is None:
                if not _gone(self.pid):
                    os.kill(self.pid, signal.SIGKILL)
            else:
                signal.pidfd_send_signal(self._fd, signal.SIGKILL)

    def close(self) -> None:
        """Stop watching it, its descriptor closed: for a process that has exited (or one given up
        on), so that exited() answers True from now on and kill() does nothing."""
        with self._lock:
            self._closed = True
            if self._fd is not None:
                os.close(self._fd)
                self._fd = None


def _gone(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(") ", 1)[1].startswith(("Z", "X"))
    except (OSError, IndexError):
        return True
