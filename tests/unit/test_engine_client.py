"""EngineClient over real pipes (tests/unit/engine_rig.py): where inputs go, what comes back, and
how a request ends — answered, failed, cancelled or stopped."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest

from common.wire import BUSY, Tokens
from server.core.engine_routing import SPILL_TOKENS, URGENT_WINDOW_S
from server.core.outcome import Outcome
from tests.unit.engine_rig import EXECUTOR_PREFIX, Rig, result, run, tok, until


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


def test_the_engines_a_dispatch_gives_work_are_marked_busy() -> None:
    """A request split over two idle engines: both slots read BUSY (marked before the work is sent), so
    neither engine sizes its threads as if it were alone (engine/runtime/threads.py); others untouched."""

    async def scenario(rig: Rig) -> None:
        a, b = rig.attach(0), rig.attach(1)
        rig.client.busy = busy = [5.0, 5.0, 5.0]  # idle since 5.0; slot 2 attached to nothing
        rig.client.submit([tok(1, 4), tok(2, 4)])
        await until(lambda: len(a.keys) == 1 and len(b.keys) == 1, "one input at each engine")
        assert busy == [BUSY, BUSY, 5.0]

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


def bulk(first: int, length: int) -> Tokens:
    return tok(first, length)._replace(priority=1)


def test_bulk_inputs_spread_over_every_engine_while_no_interactive_input_is_about() -> None:
    async def scenario(rig: Rig) -> None:
        a, b = rig.attach(0), rig.attach(1)
        rig.client.submit([bulk(1, 3)])
        rig.client.submit([bulk(2, 3)])
        await until(lambda: len(a.keys) == len(b.keys) == 1, "one bulk input at each engine")

    run(scenario)


def test_a_tenant_over_its_share_keeps_off_the_engine_kept_for_the_others() -> None:
    """Tenants' interactive inputs: one sending eight times another's tokens has its next input sent to
    the other engine even when that one holds more; the other tenant's still goes to the least loaded."""

    async def scenario(rig: Rig) -> None:
        a, b = rig.attach(0), rig.attach(1)
        for _ in range(4):
            rig.client.submit([tok(1, 2)], tenant="search")
            rig.client.submit([tok(2, 16)], tenant="indexer")
        await until(lambda: len(a.keys) + len(b.keys) == 8, "the first inputs at the engines")
        a.answer(list(a.keys))
        await until(lambda: rig.client.queued_inputs == len(b.keys), "engine 0's answers back")
        _, (big,) = rig.client.submit([tok(3, 16)], tenant="indexer")
        _, (small,) = rig.client.submit([tok(4, 2)], tenant="search")
        await until(lambda: {big, small} <= set(a.keys + b.keys), "the later inputs at the engines")
        assert big in b.keys and small in a.keys
        sent = {key: tokens for batch in a.submits + b.submits for key, tokens in batch}
        assert sent[big].behind and not sent[small].behind  # queued behind the other tenant's there

    run(scenario)


def test_a_tenant_over_its_share_spills_onto_the_kept_engine_once_the_others_hold_a_group() -> None:
    """Kept off engine 0 while engine 1 has room; once engine 1 holds SPILL_TOKENS of its inputs, the
    next goes to engine 0 (still queued behind the others' there): it keeps its throughput."""

    async def scenario(rig: Rig) -> None:
        a, b = rig.attach(0), rig.attach(1)
        rig.client.submit([tok(1, 40)], tenant="search")  # about: a tenth of the tokens
        _, held = rig.client.submit([tok(2, 16) for _ in range(SPILL_TOKENS // 16)], tenant="indexer")
        await until(lambda: len(a.keys) + len(b.keys) == 1 + len(held), "the first inputs at the engines")
        assert set(held) <= set(b.keys)
        _, (spilled,) = rig.client.submit([tok(3, 16)], tenant="indexer")
        await until(lambda: spilled in a.keys + b.keys, "the spilled input at an engine")
        assert spilled in a.keys
        sent = {key: tokens for batch in a.submits for key, tokens in batch}
        assert sent[spilled].behind

    run(scenario)


def test_bulk_inputs_keep_off_one_engine_while_interactive_inputs_are_about() -> None:
    """After an interactive input, bulk inputs go to the other engines only, however loaded, for
    URGENT_WINDOW_S; then to every engine again."""

    async def scenario(rig: Rig) -> None:
        a, b = rig.attach(0), rig.attach(1)
        urgent_future, (urgent_key,) = rig.client.submit([tok(1, 3)])
        await until(lambda: urgent_key in a.keys + b.keys, "the interactive input at an engine")
        (a if urgent_key in a.keys else b).answer([urgent_key])
        await result(urgent_future)
        bulk_keys = [rig.client.submit([bulk(2 + i, 3)])[1][0] for i in range(3)]
        await until(lambda: len(a.keys) + len(b.keys) == 4, "the bulk inputs at the engines")
        assert set(bulk_keys) <= set(b.keys) and not set(bulk_keys) & set(a.keys)
        rig.client.routing.urgent_at -= URGENT_WINDOW_S  # the window over
        _, (later,) = rig.client.submit([bulk(9, 3)])
        await until(lambda: later in a.keys + b.keys, "the later bulk input at an engine")
        assert later in a.keys  # the least loaded again

    run(scenario)


def test_of_two_equal_loads_an_interactive_input_goes_where_the_load_is_bulk() -> None:
    """Engine 0 holds an interactive input, engine 1 a bulk one of the same size: the next interactive input
    goes to engine 1, which runs it before its bulk work, instead of waiting at engine 0 for the other's
    whole forward."""

    async def scenario(rig: Rig) -> None:
        a, b = rig.attach(0), rig.attach(1)
        _, (first,) = rig.client.submit([tok(1, 4)])
        await until(lambda: first in a.keys, "the first interactive input at engine 0")
        _, (bulk_key,) = rig.client.submit([bulk(2, 4)])
        await until(lambda: bulk_key in b.keys, "the bulk input at engine 1")
        _, (second,) = rig.client.submit([tok(3, 4)])
        await until(lambda: second in a.keys + b.keys, "the second interactive input at an engine")
        assert second in b.keys

    run(scenario)


def test_interactive_tokens_stop_counting_once_answered_or_cancelled() -> None:
    async def scenario(rig: Rig) -> None:
        a, b = rig.attach(0), rig.attach(1)
        answered, (kept,) = rig.client.submit([tok(1, 4)])
        _, (dropped,) = rig.client.submit([tok(2, 5)])
        await until(lambda: len(a.keys) + len(b.keys) == 2, "both inputs at the engines")
        (a if kept in a.keys else b).answer([kept])
        await result(answered)
        rig.client.cancel([dropped])
        assert [pipe.interactive for pipe in rig.client._slots.values()] == [0, 0]

    run(scenario)
