"""A rig for EngineClient over real pipes, against fake engines that are threads of the test process.

Each fake engine serves the far end of a `multiprocessing.Pipe`: it records what the client sends
and answers only when the test tells it to (or at once, when made `auto`), so every step is
deterministic. Its rows are `[first token id, input length, engine slot]`, which tells a test which
input and which engine each row came from. Waits poll a condition under a deadline.
"""

from __future__ import annotations

import asyncio
import multiprocessing
import queue
import threading
import time
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from multiprocessing.connection import Connection
from typing import Any

import numpy as np

from common.wire import Keyed, Msg, Tokens, send
from server.core.engine_client import EngineClient
from server.core.engine_events import BatchStats
from server.core.outcome import Outcome

DEADLINE_S = 2.0  # any single wait; everything here takes milliseconds
SCENARIO_S = 4.0  # a whole test, so a hang fails instead of stalling the run
POLL_S = 0.002
EXECUTOR_PREFIX = "test-executor"


def tok(first: int, length: int) -> Tokens:
    """An input whose row from a fake engine starts with `first` and `length`."""
    return Tokens([first] + [1] * (length - 1))


class FakeEngine:
    """The engine end of a pipe, served by a thread: records messages, answers when told."""

    def __init__(self, slot: int, conn: Connection, auto: bool = False) -> None:
        self.slot = slot
        self.auto = auto
        self._conn = conn
        self._lock = threading.Lock()
        self._received: list[tuple[str, Any]] = []
        self._tokens: dict[int, Tokens] = {}
        self._outbox: queue.SimpleQueue[tuple[str, Any] | None] = queue.SimpleQueue()  # None: die
        self._thread = threading.Thread(target=self._serve, name=f"fake-engine-{slot}", daemon=True)
        self._thread.start()

    # What it received
    def messages(self, kind: str) -> list[Any]:
        with self._lock:
            return [body for k, body in self._received if k == kind]

    @property
    def submits(self) -> list[list[Keyed]]:
        return self.messages(Msg.SUBMIT)

    @property
    def keys(self) -> list[int]:
        """Every key submitted to this engine, in arrival order."""
        return [key for batch in self.submits for key, _ in batch]

    @property
    def cancels(self) -> list[list[int]]:
        return self.messages(Msg.CANCEL)

    @property
    def stops(self) -> int:
        return len(self.messages(Msg.STOP))

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    # What the test makes it do
    def answer(self, keys: list[int], inference_ms: float = 1.0, batch_tokens: int | None = None) -> None:
        """One RESULT for these keys, in this order, as a real engine sends it."""
        with self._lock:
            tokens = [self._tokens[key] for key in keys]
        vectors = np.array([[t.input_ids[0], len(t.input_ids), self.slot] for t in tokens], dtype=np.float32)
        if batch_tokens is None:
            batch_tokens = sum(len(t.input_ids) for t in tokens)
        stats = {"batch_size": len(keys), "batch_tokens": batch_tokens, "inference_ms": inference_ms}
        self._outbox.put((Msg.RESULT, (keys, vectors, stats)))

    def fail(self, keys: list[int], reason: str) -> None:
        self._outbox.put((Msg.ERROR, (keys, reason)))

    def no_adapter(self, keys: list[int], name: str) -> None:
        """What a real engine sends for inputs naming a LoRA adapter it does not hold."""
        self._outbox.put((Msg.NO_ADAPTER, (keys, name)))

    def ack_cancel(self) -> None:
        """What a real engine sends once it has dropped the inputs of a CANCEL."""
        self._outbox.put((Msg.CANCELLED, None))

    def die(self) -> None:
        """Close this end of the pipe, as a crashed engine process would, and wait for it to be closed."""
        self._outbox.put(None)
        self._thread.join(DEADLINE_S)
        assert not self._thread.is_alive(), f"fake engine {self.slot} did not stop"

    def _serve(self) -> None:
        # Polls instead of blocking in recv(): closing a socket that another thread is blocked on
        # would not show the client an EOF.
        try:
            while True:
                while True:
                    try:
                        message = self._outbox.get_nowait()
                    except queue.Empty:
                        break
                    if message is None:
                        return
                    send(self._conn, message)
                if not self._conn.poll(POLL_S):
                    continue
                kind, body = self._conn.recv()
                with self._lock:
                    self._received.append((kind, body))
                    if kind == Msg.SUBMIT:
                        self._tokens.update(body)
                if kind == Msg.STOP:
                    return
                if kind == Msg.SUBMIT and self.auto:
                    self.answer([key for key, _ in body])
        except (EOFError, OSError):
            return
        finally:
            self._conn.close()


class RecordingEvents:
    """EngineEvents that remembers every call (made on the client's reader threads)."""

    def __init__(self) -> None:
        self.batches: list[BatchStats] = []
        self.lost: list[int] = []
        self.stalled: list[tuple[int, float]] = []
        self.stalled_sets: list[tuple[list[int], bool]] = []

    def batch_done(self, stats: BatchStats) -> None:
        self.batches.append(stats)

    def engine_lost(self, slot: int) -> None:
        self.lost.append(slot)

    def engine_stalled(self, slot: int, seconds: float) -> None:
        self.stalled.append((slot, seconds))

    def engines_stalled(self, slots: list[int], every: bool) -> None:
        self.stalled_sets.append((slots, every))


class Rig:
    """A client on the running loop, its recording events, and the fake engines attached to it."""

    def __init__(self, loop: asyncio.AbstractEventLoop, executor: ThreadPoolExecutor) -> None:
        self.events = RecordingEvents()
        self.client = EngineClient(loop, executor, self.events)
        self.engines: list[FakeEngine] = []
        self.hung: list[Connection] = []

    def attach_hung(self, slot: int) -> None:
        """An engine that never reads its pipe (stopped, or hung): its end is held, unread."""
        ours, theirs = multiprocessing.Pipe(duplex=True)
        self.hung.append(theirs)
        self.client.attach(slot, ours)

    def attach(self, slot: int, auto: bool = False) -> FakeEngine:
        ours, theirs = multiprocessing.Pipe(duplex=True)
        engine = FakeEngine(slot, theirs, auto)
        self.engines.append(engine)
        self.client.attach(slot, ours)
        return engine

    def close(self) -> None:
        self.client.stop("test over")
        for engine in self.engines:
            engine.die()
        for conn in self.hung:
            conn.close()


def run(scenario: Callable[[Rig], Awaitable[None]]) -> None:
    """Run an async test body on a fresh loop, with a rig torn down afterwards."""

    async def main() -> None:
        with ThreadPoolExecutor(max_workers=2, thread_name_prefix=EXECUTOR_PREFIX) as executor:
            rig = Rig(asyncio.get_running_loop(), executor)
            try:
                await asyncio.wait_for(scenario(rig), SCENARIO_S)
            finally:
                rig.close()

    asyncio.run(main())


async def until(condition: Callable[[], object], what: str) -> None:
    """Poll condition() until it is truthy, keeping the loop running; fail past the deadline."""
    deadline = time.monotonic() + DEADLINE_S
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(POLL_S)


async def result(future: asyncio.Future[Outcome]) -> Outcome:
    return await asyncio.wait_for(future, DEADLINE_S)
