"""The keys file, reloaded on change without a restart. Requests poll it at most once a
WARMPOOL_API_KEYS_RELOAD_INTERVAL; the stat and read run on a thread, the swap on the event loop.
A change is seen through the path (stat follows symlinks: a Kubernetes Secret's `..data` swap gives
a new inode), then confirmed by the content's hash; a file that does not parse keeps the last good
keys, says so in the log and in /status, and is not parsed again until it changes."""

from __future__ import annotations

import asyncio
import hashlib
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import structlog

from server.tenants.buckets import Clock, LimitsTable
from server.tenants.keysfile import Keyring, KeysFileError, parse

log = structlog.get_logger("warmpool.keys")


@dataclass(frozen=True)
class Read:
    """What a check found: the file's identity and content hash, and a new keyring or an error
    (neither: unchanged)."""

    signature: tuple[int, ...]
    content: bytes
    ring: Keyring | None = None
    error: str | None = None


class KeysWatcher:
    def __init__(
        self, path: Path, interval: float, single_key: str | None = None, clock: Clock = time.monotonic
    ) -> None:
        self.path = path
        self.interval = interval
        self.single_key = single_key
        self.clock = clock
        self.limits = LimitsTable(clock)
        first = self._read((), b"")
        if first.error is not None:  # no last good keys to keep: the server must not start open
            raise KeysFileError(first.error)
        assert first.ring is not None
        self.ring: Keyring = first.ring
        self.limits.update(self.ring)
        self.signature, self.content = first.signature, first.content
        self.error: str | None = None
        self.reloads = 0
        self.next_check = clock() + interval
        self.checking = False

    def poll(self) -> None:
        """On the loop, per request: start a check on a thread when one is due; never waits for it."""
        now = self.clock()
        if self.checking or now < self.next_check:
            return
        self.checking = True
        self.next_check = now + self.interval
        future = asyncio.get_running_loop().run_in_executor(None, self._read, self.signature, self.content)
        future.add_done_callback(self._apply)

    def _read(self, signature: tuple[int, ...], content: bytes) -> Read:
        try:
            stat = os.stat(self.path)
            now = (stat.st_dev, stat.st_ino, stat.st_mtime_ns, stat.st_size)
            if now == signature:
                return Read(signature, content)
            text = self.path.read_bytes()
        except OSError as exc:
            return Read(signature, content, error=f"cannot read {self.path}: {exc.strerror}")
        digest = hashlib.sha256(text).digest()
        if digest == content:
            return Read(now, digest)
        try:
            return Read(now, digest, ring=parse(text, self.path, self.single_key))
        except KeysFileError as exc:
            return Read(now, digest, error=str(exc))

    def _apply(self, done: asyncio.Future[Read]) -> None:
        self.checking = False
        if done.cancelled() or done.exception() is not None:
            return
        found = done.result()
        self.signature, self.content = found.signature, found.content
        if found.error is not None:
            if found.error != self.error:
                log.error("keys_file_rejected", path=str(self.path), error=found.error, kept="the last good keys")
            self.error = found.error
        elif found.ring is not None:
            self.ring = found.ring
            self.limits.update(found.ring)
            self.error = None
            self.reloads += 1
            log.info("keys_file_reloaded", path=str(self.path), tenants=len(found.ring.tenants))

    def detail(self) -> dict[str, Any]:
        """/status's keys entry: how many tenants, reloads, and why the file on disk is not in use."""
        return {"tenants": len(self.ring.tenants), "reloads": self.reloads, "error": self.error}
