"""Models on demand without a server: the budget's syntax, which models start, which goes first;
two models that do not fit together take turns (the pool with a stand-in for the server's boot)."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import pytest

from common.settings import Settings, budget_bytes
from common.startup import StartupState
from orchestrator import ondemand
from orchestrator.ondemand import ModelPool, first_resident, least_recently_used
from server.core.admission import Admission
from server.core.services import ServedModel, Services
from server.http.errors import APIError


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("123456", 123456),
        ("800M", 800 * 10**6),
        ("2G", 2 * 10**9),
        ("1.5Gi", 3 * 2**29),
        ("512MiB", 512 * 2**20),
        ("64k", 64_000),
        (" 3 GB ", 3 * 10**9),
        ("80%", 8 * 10**9),
        ("12.5%", 1_250_000_000),
    ],
)
def test_budget_bytes_reads_suffixes_and_shares_of_the_limit(text: str, expected: int) -> None:
    """Powers of 1000 for k/M/G/T, of 1024 with an i, a share of the memory limit with %."""
    assert budget_bytes(text, 10 * 10**9) == expected


@pytest.mark.parametrize("text", ["", "lots", "-1G", "80%%", "1Q", "G"])
def test_budget_bytes_refuses_what_is_not_a_size(text: str) -> None:
    """A budget that is not a size fails the start, naming the variable."""
    with pytest.raises(ValueError, match="WARMPOOL_MEMORY_BUDGET"):
        budget_bytes(text, 10**9)


def test_a_share_needs_a_limit() -> None:
    with pytest.raises(ValueError, match="no memory limit"):
        budget_bytes("50%", None)


def test_the_setting_is_checked_when_read() -> None:
    """WARMPOOL_MEMORY_BUDGET=lots fails validation before anything starts."""
    with pytest.raises(ValueError):
        Settings(memory_budget="lots")  # type: ignore[call-arg]


def models(*entries: str) -> list[Settings]:
    return Settings(models=",".join(entries)).per_model()  # type: ignore[call-arg]


def test_resident_and_keep_alive_are_per_model_options() -> None:
    """`;resident=auto;keep_alive=300` sets them for that model alone; the default is always."""
    a, b = models("a=/m/a;resident=auto;keep_alive=300", "b=/m/b")
    assert (a.resident, a.keep_alive) == ("auto", 300.0)
    assert (b.resident, b.keep_alive) == ("always", None)


def test_resident_auto_needs_another_model() -> None:
    """One model alone is always loaded: auto would leave nothing to serve requests naming none."""
    with pytest.raises(ValueError, match="two or more models"):
        models("a=/m/a;resident=auto")


def test_models_start_in_order_while_they_fit() -> None:
    """auto models in the order listed while they fit beside the always ones; a later smaller one
    that fits still starts; always ones start whatever the budget."""
    listed = models("a=/m/a;resident=auto", "b=/m/b;resident=auto", "c=/m/c;resident=auto", "d=/m/d")
    assert first_resident(listed, [40, 50, 30, 20], 100) == [True, False, True, True]
    assert first_resident(listed, [40, 40, 30, 200], 100) == [False, False, False, True]
    assert first_resident(listed, [40, 40, 30, 20], None) == [True, True, True, True]


def test_the_least_recently_used_goes_first() -> None:
    """Oldest answer first; a model never answered before any answered one; none: None."""
    assert least_recently_used(["a", "b", "c"], {"a": 3.0, "b": 1.0, "c": 2.0}) == "b"
    assert least_recently_used(["a", "b"], {"a": 3.0}) == "b"
    assert least_recently_used([], {"a": 1.0}) is None


def test_an_on_demand_models_failure_is_its_own() -> None:
    """A load on demand that fails fails that model's phases, not the appliance; reset_model starts
    its phases over (skipped, with the reason) and drops it from readiness."""
    state = StartupState(["a", "b"])
    state.on_demand = {"b"}
    state.set_up("a", True)
    state.set_up("b", True)
    state.fail("engine:b", "boom")
    assert not state.failed and state.state("ready:b") == "skipped" and state.state("ready") == "pending"
    state.reset_model("b", "unloaded")
    assert state.state("engine:b") == "skipped" and state.engine_up
    state.fail("engine:a", "boom")
    assert state.failed


LOAD_S = 0.005  # a stand-in load's time: its residence is at least MIN_RESIDENCE_S, at most 10 x this


class Boots:
    """The server's side of a load, standing in for LifecycleServer: a model serves after LOAD_S (or
    what `slow` says for it)."""

    def __init__(self, services: Services, slow: dict[str, float]) -> None:
        self.services = services
        self.slow = slow
        self.count = 0

    async def boot_model(self, settings: Settings) -> bool:
        await asyncio.sleep(self.slow.get(settings.model_name, LOAD_S))
        self.count += 1
        name = settings.model_name
        self.services.models[name] = ServedModel(name, None, None, None, Admission(4))  # type: ignore[arg-type]
        self.services.startup.set_up(name, True)  # its engine is up (the supervisor says so)
        return True

    def wiring(self, name: str) -> None:
        return None

    def retire(self, name: str) -> None:
        return None


@pytest.fixture
def services(monkeypatch: pytest.MonkeyPatch) -> Iterator[Services]:
    monkeypatch.setattr(ondemand, "_prefetch", lambda settings, phases: None)  # no files to read
    with ThreadPoolExecutor(1) as executor:
        yield Services(settings=Settings(load_wait=10), startup=StartupState(["a", "b"]), executor=executor)


def turn_takers(services: Services, min_residence_s: float, **slow: float) -> tuple[ModelPool, Boots]:
    """a and b, both resident=auto, and a budget that holds one of them (their estimate: one engine's
    allowance, no weights found); a starts."""
    host = Boots(services, slow)
    pool = ModelPool(host, models("a=/m/a;resident=auto", "b=/m/b;resident=auto"), 200 * 10**6)
    pool.min_residence_s = min_residence_s
    services.loader = pool
    return pool, host


async def request(services: Services, name: str, work_s: float) -> None:
    """What the pipeline does with a model: wait for it, hold its permits while the work runs, mark it used."""
    assert services.loader is not None
    await services.loader.until_loaded(name)
    admission = services.models[name].admission
    assert admission is not None
    held = admission.try_acquire(1)
    assert held is not None
    try:
        await asyncio.sleep(work_s)
    finally:
        admission.release(held)
    services.last_used[name] = time.time()


def test_two_models_in_a_budget_for_one_take_turns(services: Services, monkeypatch: pytest.MonkeyPatch) -> None:
    """A client for each, back to back: every request is answered (none 503 no_room while the other
    loads), and each on-demand load stays its minimum residence, so loads are bounded by time."""
    min_residence_s = 0.2
    monkeypatch.setattr(ondemand, "RESIDENCE_PER_LOAD", 0)  # the residence whatever a busy machine makes a load take

    async def scenario() -> tuple[int, float]:
        pool, host = turn_takers(services, min_residence_s)
        await pool.boot()

        async def client(name: str) -> None:
            for _ in range(25):
                await request(services, name, 0.003)
                await asyncio.sleep(0.003)  # the client's own time between requests

        begun = time.monotonic()
        await asyncio.gather(client("a"), client("b"))
        return host.count - 1, time.monotonic() - begun

    loads, elapsed = asyncio.run(scenario())
    assert 1 <= loads <= elapsed / min_residence_s + 2


def test_a_request_whose_wait_for_room_runs_out_gets_503_no_room_naming_the_holder(services: Services) -> None:
    """b loads slowly (past WARMPOOL_LOAD_WAIT) after a was unloaded for it: a request for a waits for
    room its WARMPOOL_LOAD_WAIT, then is a 503 no_room with Retry-After naming b."""
    services.settings.load_wait = 0.1

    async def scenario() -> APIError:
        pool, _ = turn_takers(services, 0.0, b=0.3)
        await pool.boot()
        for_b = asyncio.ensure_future(pool.until_loaded("b"))
        while pool.describe("b")["state"] != "loading" or "a" in services.models:
            await asyncio.sleep(0.005)  # a condition with a deadline: the test's own timeout
        with pytest.raises(APIError) as refused:
            await request(services, "a", 0.0)
        with contextlib.suppress(APIError):  # b's own waiter may have run out of time too
            await for_b
        return refused.value

    error = asyncio.run(asyncio.wait_for(scenario(), 5))
    assert (error.status, error.code, error.headers) == (503, "no_room", {"Retry-After": "1"})
    assert (
        "'b'" in error.message and "WARMPOOL_LOAD_WAIT" in error.message and "WARMPOOL_MEMORY_BUDGET" in error.message
    )


def test_a_request_while_no_model_serves_during_a_switch_waits_for_the_one_loading(services: Services) -> None:
    """a was unloaded to make room for b, which loads: a request arriving then (before its model is
    known) waits for b to serve rather than a 503 at once."""

    async def scenario() -> ServedModel:
        pool, _ = turn_takers(services, 0.0, b=0.1)
        await pool.boot()
        for_b = asyncio.ensure_future(pool.until_loaded("b"))
        while pool.describe("b")["state"] != "loading" or "a" in services.models:
            await asyncio.sleep(0.005)
        served = await services.serving_model()
        await for_b
        return served

    assert asyncio.run(asyncio.wait_for(scenario(), 5)).name == "b"


def test_a_load_waiting_to_make_room_holds_none(services: Services) -> None:
    """b is unloaded for a, and b's next load starts the instant that unload ends (before a's load,
    which made room, looks again): b's load waits behind a's, holding no room meanwhile, so a's
    request is answered rather than both waiting on each other until a 503 no_room."""
    services.settings.load_wait = 1

    async def scenario() -> None:
        pool, _ = turn_takers(services, 0.0)
        await pool.boot()
        await request(services, "b", 0.0)  # a unloaded for b
        admission = services.models["b"].admission
        assert admission is not None
        held = admission.try_acquire(1)  # a request of b's in flight: b's unload waits for it to end
        for_a = asyncio.ensure_future(request(services, "a", 0.0))
        while (unloads := pool.slots["b"].unloads) is None:
            await asyncio.sleep(0.005)
        loads: list[asyncio.Task[bool]] = []
        unloads.add_done_callback(lambda _: loads.append(pool._start(pool.slots["b"])))  # b's load, at once
        admission.release(held or 0)
        await for_a  # raises no_room past WARMPOOL_LOAD_WAIT where b's waiting load held room
        await asyncio.gather(*loads, return_exceptions=True)

    asyncio.run(asyncio.wait_for(scenario(), 10))


def test_the_server_stays_ready_while_a_model_loads_in_place_of_the_one_unloaded_for_it(services: Services) -> None:
    """a was unloaded to make room for b, which loads: no engine serves, but /health/ready (Services.ready)
    stays 200, and warmpool_ready 1, since requests are held for b rather than refused; a probe would
    otherwise take the pod out of service at every turn two models take."""

    async def scenario() -> tuple[bool, bool, bool]:
        pool, _ = turn_takers(services, 0.0, b=0.1)
        await pool.boot()
        services.startup.start("ready")
        services.startup.done("ready")
        for_b = asyncio.ensure_future(pool.until_loaded("b"))
        while pool.describe("b")["state"] != "loading" or "a" in services.models:
            await asyncio.sleep(0.005)
        during = (services.ready(), services.startup.any_engine_up, b"warmpool_ready 1.0" in services.metrics.render())
        await for_b
        return during

    assert asyncio.run(asyncio.wait_for(scenario(), 5)) == (True, False, True)
