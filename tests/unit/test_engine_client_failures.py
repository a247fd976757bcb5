"""EngineClient over real pipes (tests/unit/engine_rig.py) when engines fail: a lost engine's inputs
moved or failed, a hung or stalled engine worked around."""

from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor

import pytest

from common.settings import Settings
from common.startup import StartupState
from server.core.engine_adapters import AdapterUnavailable
from server.core.engine_client import EngineFailed, EngineUnavailable
from server.core.engine_events import BatchStats
from server.core.engine_wait import run_on_engine
from server.core.services import ServedModel, Services
from server.core.timings import Timings
from server.http.errors import APIError
from tests.unit.engine_rig import Rig, result, run, tok, until


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


def test_inputs_an_engine_has_no_adapter_for_fail_their_request_alone() -> None:
    """NO_ADAPTER for one request's inputs fails that request with AdapterUnavailable, naming the adapter;
    the request beside it in the engine's group is answered; nothing stays queued."""

    async def scenario(rig: Rig) -> None:
        engine = rig.attach(0)
        base, base_keys = rig.client.submit([tok(1, 3)])
        lacking, lacking_keys = rig.client.submit([tok(2, 3)._replace(adapter="b"), tok(3, 2)._replace(adapter="b")])
        await until(lambda: len(engine.keys) == 3, "the inputs at the engine")
        engine.no_adapter(lacking_keys, "b")
        engine.answer(base_keys)
        with pytest.raises(AdapterUnavailable, match="adapter 'b'"):
            await result(lacking)
        assert (await result(base)).vectors.tolist() == [[1, 3, 0]]
        assert rig.client.queued_inputs == 0

    run(scenario)


def test_an_engine_without_the_requests_adapter_is_a_503_naming_it() -> None:
    """run_on_engine answers AdapterUnavailable with a 503 and Retry-After (a retry may reach an engine that
    holds it), never the 500 of a failed batch."""

    async def scenario(rig: Rig) -> None:
        engine = rig.attach(0)
        with ThreadPoolExecutor(1) as executor:
            svc = Services(settings=Settings(), startup=StartupState(), executor=executor)
            model = ServedModel("base", None, None, rig.client)  # type: ignore[arg-type]  (the engine alone)
            running = asyncio.ensure_future(run_on_engine(svc, model, [tok(1, 3)._replace(adapter="b")], Timings()))
            await until(lambda: engine.keys, "the input at the engine")
            engine.no_adapter(engine.keys, "b")
            with pytest.raises(APIError) as raised:
                await asyncio.wait_for(running, 2.0)
        error = raised.value
        assert (error.status, error.code, error.headers) == (503, "adapter_unavailable", {"Retry-After": "1"})
        assert "adapter 'b'" in error.message and "model 'base'" in error.message

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
        rig.client.stalls.timeout_s = 0.3
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
        rig.client.stalls.timeout_s = 0.3
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
        rig.client.stalls.timeout_s = 2.0  # taken for stalled after 0.5 s, reported after 2 s
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
        rig.client.stalls.timeout_s = 0.4  # taken for stalled after 0.1 s
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
