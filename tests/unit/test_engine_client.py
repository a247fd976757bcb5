"""EngineClient over real pipes, against fake engines that are threads of the test process.

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
import pytest

from common.wire import Keyed, Msg, Tokens, send
from server.core.engine_client import EngineClient, EngineFailed, EngineUnavailable, Outcome
from server.core.engine_events import BatchStats

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


def test_input_goes_to_the_engine_with_fewest_tokens_outstanding() -> None:
    """Each input is sent to the engine with the fewest tokens sent and not yet answered."""

    async def scenario(rig: Rig) -> None:
        a, b = rig.attach(0), rig.attach(1)
        _, (long_key,) = rig.client.submit([tok(1, 50)])
        _, (short1,) = rig.client.submit([tok(2, 3)])
        _, (short2,) = rig.client.submit([tok(3, 3)])
        await until(lambda: len(a.keys) + len(b.keys) == 3, "all three inputs at the engines")
        busy, other = (a, b) if long_key in a.keys else (b, a)
        assert busy.keys == [long_key]
        assert other.keys == [short1, short2]  # 3 then 6 tokens outstanding there, against 50

    run(scenario)


def test_answered_tokens_stop_counting_as_load() -> None:
    """A RESULT takes its inputs' tokens off their engine's load, so new work can go back to it."""

    async def scenario(rig: Rig) -> None:
        a, b = rig.attach(0), rig.attach(1)
        long_future, (long_key,) = rig.client.submit([tok(1, 50)])
        _, (medium_key,) = rig.client.submit([tok(2, 10)])
        await until(lambda: len(a.keys) + len(b.keys) == 2, "both inputs at the engines")
        first, second = (a, b) if long_key in a.keys else (b, a)
        assert second.keys == [medium_key]
        first.answer([long_key])
        await result(long_future)
        _, (short_key,) = rig.client.submit([tok(3, 3)])  # loads now: first 0, second 10
        await until(lambda: short_key in a.keys + b.keys, "the short input at an engine")
        assert first.keys == [long_key, short_key]

    run(scenario)


def test_rows_come_back_one_per_input_in_input_order() -> None:
    """The future resolves with one row per input, in the request's order, however the engine answers."""

    async def scenario(rig: Rig) -> None:
        engine = rig.attach(0)
        future, keys = rig.client.submit([tok(7, 3), tok(8, 1), tok(9, 2)])
        await until(lambda: len(engine.keys) == 3, "the inputs at the engine")
        engine.answer([keys[2]])
        engine.answer([keys[1], keys[0]])
        outcome = await result(future)
        assert outcome.vectors.dtype == np.float32
        assert outcome.vectors.tolist() == [[7, 3, 0], [8, 1, 0], [9, 2, 0]]

    run(scenario)


def test_outcome_times_split_queue_and_inference() -> None:
    """inference_ms is the request's share of each batch's time (split evenly among the batch's
    inputs); queue_ms is the rest of the time from submit to the last row."""

    async def scenario(rig: Rig) -> None:
        engine = rig.attach(0)
        started = time.perf_counter()
        future, keys = rig.client.submit([tok(1, 2), tok(2, 2)])
        _, (other_key,) = rig.client.submit([tok(3, 2)])
        await until(lambda: len(engine.keys) == 3, "the inputs at the engine")
        # Times far below the test's own latency, so none is clipped to the request's wall time.
        engine.answer([keys[0]], inference_ms=0.002)
        engine.answer([keys[1], other_key], inference_ms=0.004)  # half of this batch is the other request's
        outcome = await result(future)
        elapsed_ms = (time.perf_counter() - started) * 1000
        assert outcome.inference_ms == pytest.approx(0.004)
        assert outcome.queue_ms > 0
        assert outcome.queue_ms + outcome.inference_ms <= elapsed_ms

    run(scenario)


def test_then_runs_on_the_executor_and_its_result_is_rendered() -> None:
    """A request's `then` runs once, on the executor, on the finished outcome; its result is `outcome.rendered`."""

    async def scenario(rig: Rig) -> None:
        rig.attach(0, auto=True)
        calls: list[tuple[str, list[list[float]]]] = []

        def then(outcome: Outcome) -> str:
            calls.append((threading.current_thread().name, outcome.vectors.tolist()))
            return "rendered"

        future, _ = rig.client.submit([tok(4, 2), tok(5, 1)], then=then)
        outcome = await result(future)
        assert outcome.rendered == "rendered"
        assert len(calls) == 1
        thread_name, rows = calls[0]
        assert thread_name.startswith(EXECUTOR_PREFIX)
        assert rows == [[4, 2, 0], [5, 1, 0]]

    run(scenario)


def test_then_raising_fails_the_request() -> None:
    """An exception from `then` is what the request's future raises."""

    async def scenario(rig: Rig) -> None:
        rig.attach(0, auto=True)

        def then(outcome: Outcome) -> str:
            raise ValueError("cannot render")

        future, _ = rig.client.submit([tok(4, 2)], then=then)
        with pytest.raises(ValueError, match="cannot render"):
            await result(future)

    run(scenario)


def test_cancel_sends_cancel_to_the_engines_holding_the_keys() -> None:
    """cancel(keys) sends each engine a CANCEL with just the keys it holds, and forgets the inputs."""

    async def scenario(rig: Rig) -> None:
        a, b = rig.attach(0), rig.attach(1)
        future, keys = rig.client.submit([tok(1, 4), tok(2, 4)])
        await until(lambda: len(a.keys) == 1 and len(b.keys) == 1, "one input at each engine")
        assert rig.client.queued_inputs == 2
        rig.client.cancel(keys)
        assert rig.client.queued_inputs == 0
        await until(lambda: a.cancels and b.cancels, "a CANCEL at each engine")
        assert a.cancels == [a.keys]
        assert b.cancels == [b.keys]
        assert not future.done()  # the client left: nobody waits on it

    run(scenario)


def test_a_lost_engines_unanswered_inputs_go_to_a_live_engine() -> None:
    """When an engine's pipe closes, its unanswered inputs are sent once to a live engine and
    engine_lost(slot) is reported; the request completes from there."""

    async def scenario(rig: Rig) -> None:
        a = rig.attach(0)
        future, keys = rig.client.submit([tok(1, 4), tok(2, 2)])
        await until(lambda: len(a.keys) == 2, "both inputs at the first engine")
        b = rig.attach(1)
        a.answer([keys[0]])
        await until(lambda: len(rig.events.batches) == 1, "the first row taken in")
        a.die()
        await until(lambda: rig.events.lost == [0], "engine_lost(0)")
        await until(lambda: b.submits, "the unanswered input at the second engine")
        assert b.submits == [[(keys[1], tok(2, 2))]]
        b.answer([keys[1]])
        outcome = await result(future)
        assert outcome.vectors.tolist() == [[1, 4, 0], [2, 2, 1]]
        assert rig.client.attached == 1

    run(scenario)


def test_inputs_of_a_lost_engine_wait_for_the_next_one_attached() -> None:
    """With no live engine left, a lost engine's inputs wait and go to the next engine attached."""

    async def scenario(rig: Rig) -> None:
        a = rig.attach(0)
        future, (key,) = rig.client.submit([tok(6, 3)])
        await until(lambda: a.keys == [key], "the input at the first engine")
        a.die()
        await until(lambda: rig.events.lost == [0], "engine_lost(0)")
        assert rig.client.attached == 0
        assert rig.client.queued_inputs == 1
        b = rig.attach(0, auto=True)  # the same slot, restarted
        outcome = await result(future)
        assert b.keys == [key]
        assert outcome.vectors.tolist() == [[6, 3, 0]]

    run(scenario)


def test_a_second_loss_under_a_request_fails_it_with_engine_unavailable() -> None:
    """A request whose inputs were already moved once fails with EngineUnavailable when their
    engine is lost too, even with another engine alive: it is not sent a third time."""

    async def scenario(rig: Rig) -> None:
        a = rig.attach(0)
        future, (key,) = rig.client.submit([tok(1, 3)])
        await until(lambda: a.keys == [key], "the input at the first engine")
        b = rig.attach(1)
        a.die()
        await until(lambda: b.keys == [key], "the input moved to the second engine")
        c = rig.attach(2)
        b.die()
        with pytest.raises(EngineUnavailable):
            await result(future)
        await until(lambda: rig.events.lost == [0, 1], "engine_lost for both engines")
        assert rig.client.queued_inputs == 0
        assert c.submits == []

    run(scenario)


def test_stop_sends_stop_and_fails_pending_requests() -> None:
    """stop() sends STOP to every engine and fails every pending request with EngineUnavailable."""

    async def scenario(rig: Rig) -> None:
        a, b = rig.attach(0), rig.attach(1)
        first, _ = rig.client.submit([tok(1, 5)])
        second, _ = rig.client.submit([tok(2, 5)])
        await until(lambda: len(a.keys) + len(b.keys) == 2, "both requests at the engines")
        rig.client.stop()
        for future in (first, second):
            with pytest.raises(EngineUnavailable):
                await result(future)
        await until(lambda: a.stops and b.stops, "a STOP at each engine")
        assert (a.stops, b.stops) == (1, 1)
        assert rig.client.attached == 0
        assert rig.client.queued_inputs == 0
        await until(lambda: not a.alive and not b.alive, "both engines gone")
        assert rig.events.lost == []  # a stopped engine is not a lost one

    run(scenario)


def test_submit_without_an_engine_raises_engine_unavailable() -> None:
    """submit() with no engine attached raises EngineUnavailable and keeps nothing queued."""

    async def scenario(rig: Rig) -> None:
        with pytest.raises(EngineUnavailable):
            rig.client.submit([tok(1, 3)])
        assert rig.client.queued_inputs == 0

    run(scenario)


def test_engine_error_fails_the_request_with_engine_failed() -> None:
    """An ERROR for any of a request's inputs fails the request with EngineFailed and forgets it."""

    async def scenario(rig: Rig) -> None:
        engine = rig.attach(0)
        future, keys = rig.client.submit([tok(1, 3), tok(2, 3)])
        await until(lambda: len(engine.keys) == 2, "the inputs at the engine")
        engine.fail([keys[1]], "RuntimeError: out of memory")
        with pytest.raises(EngineFailed, match="out of memory"):
            await result(future)
        assert rig.client.queued_inputs == 0

    run(scenario)


def test_batch_done_is_reported_once_per_result_with_its_stats() -> None:
    """events.batch_done gets one BatchStats per RESULT message, carrying that message's stats."""

    async def scenario(rig: Rig) -> None:
        engine = rig.attach(0)
        future, keys = rig.client.submit([tok(1, 2), tok(2, 3), tok(3, 4)])
        await until(lambda: len(engine.keys) == 3, "the inputs at the engine")
        engine.answer([keys[0]], inference_ms=2.5, batch_tokens=5)
        engine.answer([keys[1], keys[2]], inference_ms=4.0, batch_tokens=8)
        await result(future)  # batch_done for the last RESULT comes before the request settles
        assert rig.events.batches == [BatchStats(1, 5, 2.5), BatchStats(2, 8, 4.0)]

    run(scenario)


def test_a_failed_request_cancels_its_inputs_on_the_other_engines() -> None:
    """When an ERROR fails a request, the engines still holding its other inputs get a CANCEL for
    them: nobody waits for those rows, and the engines must not count as idle while running them."""

    async def scenario(rig: Rig) -> None:
        a, b = rig.attach(0), rig.attach(1)
        future, _ = rig.client.submit([tok(1, 4), tok(2, 4)])
        await until(lambda: len(a.keys) == 1 and len(b.keys) == 1, "one input at each engine")
        a.fail(a.keys, "RuntimeError: boom")
        with pytest.raises(EngineFailed):
            await result(future)
        await until(lambda: b.cancels, "a CANCEL at the other engine")
        assert b.cancels == [b.keys] and a.cancels == []

    run(scenario)


def test_an_engine_attached_after_stop_gets_no_work() -> None:
    """A restart that finishes after stop() is not attached: its pipe is closed, so it exits, and
    submit still refuses new work."""

    async def scenario(rig: Rig) -> None:
        rig.client.stop("shutting down")
        late = rig.attach(0)
        await until(lambda: not late.alive, "the late engine to see its pipe closed")
        with pytest.raises(EngineUnavailable):
            rig.client.submit([tok(1, 2)])

    run(scenario)


def test_a_hung_engine_does_not_hold_up_sends_to_the_others() -> None:
    """Each engine has its own sender: once a hung engine's pipe is full, a live engine still gets
    (and answers) new work."""

    async def scenario(rig: Rig) -> None:
        rig.attach_hung(0)
        for i in range(300):  # ~2 MB of token ids: far more than a pipe buffers
            rig.client.submit([tok(i, 2000)])
        rig.attach(1, auto=True)
        future, _ = rig.client.submit([tok(7, 3)])
        assert (await result(future)).vectors.tolist() == [[7, 3, 1]]

    run(scenario)


def test_an_engine_with_work_and_no_answer_is_reported_stalled() -> None:
    """Past the stall timeout, an engine with work outstanding and no answer is reported once; an
    idle engine is not."""

    async def scenario(rig: Rig) -> None:
        rig.client.stall_timeout_s = 0.3
        rig.attach_hung(0)
        # it answers what is moved off the hung one: an engine that never answered would be reported
        # in its turn, a tenth of a second later, and a slow loop could see both reports at once
        rig.attach(1, auto=True)
        rig.client.submit([tok(1, 50)])  # to the hung engine: both are idle, the first wins the tie
        await until(lambda: rig.events.stalled, "a stall report")
        ((slot, seconds),) = rig.events.stalled
        assert slot == 0 and seconds > 0.3

    run(scenario)


def test_cancelled_inputs_count_as_load_until_the_engine_answers() -> None:
    """Cancelling does not make a busy (or stuck) engine look idle: its cancelled tokens count until
    it next answers, so new work goes to the other engine."""

    async def scenario(rig: Rig) -> None:
        a, b = rig.attach(0), rig.attach(1)
        _, keys = rig.client.submit([tok(1, 50)])
        await until(lambda: a.keys, "the input at the first engine")
        rig.client.cancel(keys)
        _, (short,) = rig.client.submit([tok(2, 3)])
        await until(lambda: short in a.keys + b.keys, "the next input at an engine")
        assert b.keys == [short]

    run(scenario)


def test_an_engines_cancel_acknowledgement_frees_its_load() -> None:
    """Once the engine says CANCELLED, the cancelled tokens stop counting: it takes new work again
    (and an idle engine that only dropped inputs is never taken for a stalled one)."""

    async def scenario(rig: Rig) -> None:
        rig.client.stall_timeout_s = 0.3
        a, b = rig.attach(0), rig.attach(1)
        _, keys = rig.client.submit([tok(1, 50)])
        await until(lambda: a.keys, "the input at the first engine")
        rig.client.cancel(keys)
        await until(lambda: a.cancels, "the CANCEL at the first engine")
        a.ack_cancel()
        await until(lambda: rig.client._slots[0].load == 0, "the first engine's load freed")
        _, (short,) = rig.client.submit([tok(2, 3)])
        await until(lambda: short in a.keys + b.keys, "the next input at an engine")
        assert a.keys[-1] == short and b.keys == []
        assert rig.events.stalled == []

    run(scenario)


def test_a_stalled_engine_gets_no_new_work_and_its_inputs_move_to_one_that_answers() -> None:
    """An engine with work and no answer for a quarter of the stall timeout is taken for stalled (and
    said so) long before it is killed: new work goes to an engine that keeps answering even with far
    more load, and what the stalled one holds moves there (cancelled on the stalled one)."""

    async def scenario(rig: Rig) -> None:
        rig.client.stall_timeout_s = 2.0  # taken for stalled after 0.5 s, reported after 2 s
        b = rig.attach(1)
        rig.client.submit([tok(i, 50) for i in range(20)])  # 1,000 tokens at the answering engine

        async def answering() -> None:  # one input every 50 ms, as an engine streams groups back
            done = 0
            while True:
                if done < len(keys := b.keys):
                    b.answer([keys[done]])
                    done += 1
                await asyncio.sleep(0.05)

        answerer = asyncio.ensure_future(answering())
        rig.attach_hung(0)
        stuck_future, (stuck,) = rig.client.submit([tok(100, 3)])  # to the idle engine, which hangs
        await until(lambda: rig.events.stalled_sets, "an engine taken for stalled")
        assert rig.events.stalled_sets == [([0], False)]
        await until(lambda: stuck in b.keys, "the stalled engine's input moved")
        new_future, _ = rig.client.submit([tok(101, 3)])  # hung: 3 tokens; answering: hundreds
        assert (await result(stuck_future)).vectors.tolist() == [[100, 3, 1]]
        assert (await result(new_future)).vectors.tolist() == [[101, 3, 1]]
        assert rig.events.stalled == []  # not yet past the whole stall timeout
        answerer.cancel()

    run(scenario)


def test_an_input_a_stalled_engine_answers_after_it_moved_is_dropped_where_it_moved() -> None:
    """A stalled engine that wakes and answers an input moved off it fills the request; the engine
    it moved to is told to drop it, and counts it as load until that engine next answers."""

    async def scenario(rig: Rig) -> None:
        rig.client.stall_timeout_s = 0.4  # taken for stalled after 0.1 s
        a, b = rig.attach(0), rig.attach(1)
        future, (key,) = rig.client.submit([tok(5, 3)])  # both idle: the first wins the tie
        await until(lambda: key in b.keys, "the input moved off the silent engine")
        a.answer([key])
        assert (await result(future)).vectors.tolist() == [[5, 3, 0]]
        await until(lambda: [key] in b.cancels, "the engine it moved to told to drop it")
        assert rig.client._slots[1].load == 3
        b.ack_cancel()
        await until(lambda: rig.client._slots[1].load == 0, "its load freed once it answers")

    run(scenario)
