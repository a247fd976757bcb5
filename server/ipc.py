"""The HTTP <-> engine channel: one pipe per engine, a sender thread and a reader thread.

Pickling and pipe writes happen on the sender thread and result bookkeeping on the reader
thread, so the event loop only registers futures and receives finished requests.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import numpy as np

from server.tokenizer import Tokens


class Msg:
    SUBMIT = "submit"
    CANCEL = "cancel"
    STOP = "stop"
    LOADED = "loaded"
    READY = "ready"
    FAILED = "failed"
    RESULT = "result"
    ERROR = "error"


@dataclass(frozen=True)
class EngineSpec:
    model_path: Path
    threads: int
    max_batch_tokens: int
    max_batch_size: int
    nice: int = 0


class EngineUnavailable(Exception):
    """No engine can run this request now (none attached, or it died twice under it)."""


class EngineFailed(Exception):
    """The engine ran the batch and it raised."""


@dataclass
class Outcome:
    vectors: np.ndarray
    queue_ms: float
    inference_ms: float


@dataclass(eq=False)
class _Request:
    future: asyncio.Future[Outcome]
    items: list[tuple[int, list[int], list[int] | None]]
    rows: list[np.ndarray | None]
    submitted: float = field(default_factory=time.perf_counter)
    inference_ms: float = 0.0
    attempts: int = 0

    def missing(self) -> list[tuple[int, list[int], list[int] | None]]:
        return [item for item, row in zip(self.items, self.rows, strict=True) if row is None]


@dataclass
class BatchStats:
    batch_size: int
    batch_tokens: int
    inference_ms: float


class EngineClient:
    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._lock = threading.Lock()
        self._keys = itertools.count()
        self._requests: dict[int, tuple[_Request, int]] = {}
        self._conn: Connection | None = None
        self._outbox: queue.SimpleQueue[tuple[Connection, tuple[str, Any]] | None] = queue.SimpleQueue()
        self.on_lost: Callable[[], None] = lambda: None
        self.on_batch: Callable[[BatchStats], None] = lambda stats: None
        threading.Thread(target=self._send_loop, name="engine-sender", daemon=True).start()

    @property
    def attached(self) -> bool:
        return self._conn is not None

    @property
    def queued_inputs(self) -> int:
        with self._lock:
            return len(self._requests)

    def attach(self, conn: Connection) -> None:
        """A new engine is ready: resend what the last one left unfinished, then read its results."""
        with self._lock:
            self._conn = conn
            retry = [i for req in self._unique_requests() for i in req.missing()]
        if retry:
            self._outbox.put((conn, (Msg.SUBMIT, retry)))
        threading.Thread(target=self._read_loop, args=(conn,), name="engine-reader", daemon=True).start()

    def submit(self, tokens: list[Tokens]) -> tuple[asyncio.Future[Outcome], list[int]]:
        """Queue one request's inputs; the future resolves with one row per input, in order."""
        future: asyncio.Future[Outcome] = self._loop.create_future()
        with self._lock:
            conn = self._conn
            if conn is None:
                raise EngineUnavailable("no engine is running")
            keys = [next(self._keys) for _ in tokens]
            items = [(k, t.input_ids, t.token_type_ids) for k, t in zip(keys, tokens, strict=True)]
            request = _Request(future, items, [None] * len(items))
            for index, key in enumerate(keys):
                self._requests[key] = (request, index)
        self._outbox.put((conn, (Msg.SUBMIT, items)))
        return future, keys

    def cancel(self, keys: list[int]) -> None:
        """Forget a request (its client left); the engine drops those inputs if still queued."""
        with self._lock:
            for key in keys:
                self._requests.pop(key, None)
            conn = self._conn
        if conn is not None:
            self._outbox.put((conn, (Msg.CANCEL, keys)))

    def stop(self) -> None:
        with self._lock:
            conn, self._conn = self._conn, None
        if conn is not None:
            self._outbox.put((conn, (Msg.STOP, None)))
        self._outbox.put(None)

    def fail_all(self, reason: str) -> None:
        with self._lock:
            requests = self._unique_requests()
            self._requests.clear()
        for req in requests:
            self._settle(req, EngineUnavailable(reason))

    def _unique_requests(self) -> list[_Request]:
        return list({id(req): req for req, _ in self._requests.values()}.values())

    def _send_loop(self) -> None:
        while (job := self._outbox.get()) is not None:
            conn, message = job
            # A broken pipe is the reader's to notice: it runs the engine-lost path.
            with contextlib.suppress(OSError, ValueError):
                conn.send(message)

    def _read_loop(self, conn: Connection) -> None:
        while True:
            try:
                kind, body = conn.recv()
            except (EOFError, OSError):
                break
            if kind == Msg.RESULT:
                self._on_result(*body)
            elif kind == Msg.ERROR:
                self._on_error(*body)
        conn.close()
        self._on_lost(conn)

    def _on_result(self, keys: list[int], vectors: np.ndarray, stats: dict[str, Any]) -> None:
        done: list[_Request] = []
        with self._lock:
            for row, key in enumerate(keys):
                entry = self._requests.pop(key, None)
                if entry is None:
                    continue
                req, index = entry
                req.rows[index] = vectors[row]
                req.inference_ms += stats["inference_ms"] / len(keys)
                if all(r is not None for r in req.rows):
                    done.append(req)
        self.on_batch(BatchStats(stats["batch_size"], stats["batch_tokens"], stats["inference_ms"]))
        for req in done:
            total_ms = (time.perf_counter() - req.submitted) * 1000
            inference_ms = min(req.inference_ms, total_ms)
            outcome = Outcome(np.stack(req.rows), total_ms - inference_ms, inference_ms)  # type: ignore[arg-type]
            self._settle(req, outcome)

    def _on_error(self, keys: list[int], message: str) -> None:
        with self._lock:
            failed = {id(e[0]): e[0] for k in keys if (e := self._requests.pop(k, None))}
            for req in failed.values():
                for key, *_ in req.items:
                    self._requests.pop(key, None)
        for req in failed.values():
            self._settle(req, EngineFailed(message))

    def _on_lost(self, conn: Connection) -> None:
        """Requests the dead engine held are retried once on the next engine, else answered 503."""
        with self._lock:
            if self._conn is not conn:
                return  # stopped on purpose, or already replaced
            self._conn = None
            given_up = []
            for req in self._unique_requests():
                req.attempts += 1
                if req.attempts > 1:
                    given_up.append(req)
                    for key, *_ in req.items:
                        self._requests.pop(key, None)
        for req in given_up:
            self._settle(req, EngineUnavailable("the engine died twice while running this request"))
        self.on_lost()

    def _settle(self, req: _Request, result: Outcome | Exception) -> None:
        def settle() -> None:
            if req.future.done():
                return
            if isinstance(result, Exception):
                req.future.set_exception(result)
            else:
                req.future.set_result(result)

        self._loop.call_soon_threadsafe(settle)
