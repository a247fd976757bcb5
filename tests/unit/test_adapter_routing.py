"""EngineClient routing a LoRA adapter's inputs around the engines that refused it (NO_ADAPTER: a
re-forked engine whose adapter folder is gone), over real pipes (tests/unit/engine_rig.py)."""

from __future__ import annotations

import pytest

from server.core.engine_adapters import AdapterUnavailable
from tests.unit.engine_rig import FakeEngine, Rig, result, run, tok, until


async def refused_by_the_first(rig: Rig) -> tuple[FakeEngine, FakeEngine, list[int]]:
    """Two engines, the second answering at once; the first refuses adapter "b" for the input it is
    sent (which the second then answers): the two engines and that input's keys."""
    a, b = rig.attach(0), rig.attach(1, auto=True)
    first, keys = rig.client.submit([tok(2, 3)._replace(adapter="b")])
    await until(lambda: a.keys == keys, "the first input at the first engine")
    a.no_adapter(keys, "b")
    await result(first)
    return a, b, keys


def test_inputs_an_engine_refuses_go_to_an_engine_that_holds_the_adapter() -> None:
    """NO_ADAPTER with another engine attached: those inputs are sent there and answered from it."""

    async def scenario(rig: Rig) -> None:
        a = rig.attach(0)
        future, keys = rig.client.submit([tok(2, 3)._replace(adapter="b")])
        await until(lambda: a.keys == keys, "the input at the first engine")
        other = rig.attach(1, auto=True)
        a.no_adapter(keys, "b")
        assert (await result(future)).vectors.tolist() == [[2, 3, 1]]
        assert other.keys == keys
        assert rig.client.queued_inputs == 0

    run(scenario)


def test_an_adapter_refused_by_an_engine_is_sent_only_to_the_others() -> None:
    """Once an engine refused an adapter, that adapter's inputs go to the others though it is the
    least loaded; the base's still go to it."""

    async def scenario(rig: Rig) -> None:
        a, b, keys = await refused_by_the_first(rig)
        adapter, adapter_keys = rig.client.submit([tok(4, 3)._replace(adapter="b")])
        assert (await result(adapter)).vectors.tolist() == [[4, 3, 1]]
        base, base_keys = rig.client.submit([tok(5, 3)])
        await until(lambda: a.keys == [*keys, *base_keys], "the base's input at the first engine")
        a.answer(base_keys)
        assert (await result(base)).vectors.tolist() == [[5, 3, 0]]
        assert b.keys == [*keys, *adapter_keys]

    run(scenario)


def test_an_adapter_every_engine_refuses_fails_its_request() -> None:
    """Refused by each engine in turn: the request fails naming the adapter, nothing stays queued."""

    async def scenario(rig: Rig) -> None:
        a, b = rig.attach(0), rig.attach(1)
        future, keys = rig.client.submit([tok(2, 3)._replace(adapter="b")])
        await until(lambda: a.keys == keys, "the input at the first engine")
        a.no_adapter(keys, "b")
        await until(lambda: b.keys == keys, "the input at the second engine")
        b.no_adapter(keys, "b")
        with pytest.raises(AdapterUnavailable, match="adapter 'b'"):
            await result(future)
        assert rig.client.queued_inputs == 0

    run(scenario)


def test_a_lost_engines_refusals_are_forgotten() -> None:
    """The engine re-forked into a refusing engine's slot starts afresh: it is sent the adapter's inputs."""

    async def scenario(rig: Rig) -> None:
        a, b, _ = await refused_by_the_first(rig)
        a.die()
        b.die()
        await until(lambda: rig.client.attached == 0, "both engines lost")
        again = rig.attach(0, auto=True)
        future, keys = rig.client.submit([tok(4, 3)._replace(adapter="b")])
        assert (await result(future)).vectors.tolist() == [[4, 3, 0]]
        assert again.keys == keys

    run(scenario)


def test_an_adapter_held_only_by_a_stalled_engine_fails_its_request() -> None:
    """The engine that holds it taken for stalled (no new work goes there): the refused inputs fail
    at once instead of going back to the engine that refused them."""

    async def scenario(rig: Rig) -> None:
        a, b = rig.attach(0), rig.attach(1)
        rig.client.stalls.slots = {1}  # as the watchdog marks an engine that answers nothing
        future, keys = rig.client.submit([tok(2, 3)._replace(adapter="b")])
        await until(lambda: a.keys == keys, "the input at the answering engine")
        a.no_adapter(keys, "b")
        with pytest.raises(AdapterUnavailable, match="adapter 'b'"):
            await result(future)
        assert a.keys == keys and b.keys == []

    run(scenario)
