"""The result cache shared through a real redis-server: one app answers another's inputs from it, a
Redis that dies or hangs costs a request at most the timeout and never fails one."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from server.core.shared_cache import SharedCache
from tests.app.inprocess import InProcessServer, serving
from tests.app.test_result_cache import embed, raw, sample, text
from tests.redis_server import RedisServer, SilentServer
from tests.server_process import wait_for

TIMEOUT_S = 0.5  # generous for a loaded 2-core machine; production's default is 5 ms


@pytest.fixture(scope="module")
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    server = RedisServer(tmp_path_factory.mktemp("redis")).start()
    yield server
    server.stop()


@pytest.fixture(scope="module")
def fleet(redis_server: RedisServer, model_dir: Path) -> Iterator[tuple[InProcessServer, InProcessServer]]:
    """Two apps on one Redis, as two replicas behind a load balancer."""
    with (
        serving(model_dir, cache_url=redis_server.url, cache_timeout=TIMEOUT_S) as first,
        serving(model_dir, cache_url=redis_server.url, cache_timeout=TIMEOUT_S) as second,
    ):
        yield first, second


def test_a_second_app_answers_the_first_apps_inputs_from_redis(
    fleet: tuple[InProcessServer, InProcessServer], redis_server: RedisServer
) -> None:
    first, second = fleet
    one = text()
    keys = redis_server.keys()
    computed = embed(first, one)
    wait_for(lambda: redis_server.keys() > keys, 10, "the first app's answer written to Redis")
    shared = sample(second, "warmpool_cache_hits_total", tier="shared")
    answered = embed(second, one)
    assert answered.headers["x-cache"] == "hit"
    assert raw(answered) == raw(computed)
    assert sample(second, "warmpool_cache_hits_total", tier="shared") - shared == 1


def test_redis_killed_and_restarted_fails_no_request(model_dir: Path, tmp_path: Path) -> None:
    redis = RedisServer(tmp_path).start()
    with serving(model_dir, cache_url=redis.url, cache_timeout=TIMEOUT_S) as app:
        reference = {t: raw(embed(app, t)) for t in (text(), text())}
        redis.stop()
        for _ in range(6):  # dead Redis: each one computed (or from the LRU), none failed
            for t, bits in reference.items():
                assert raw(embed(app, t)) == bits
            assert raw(embed(app, text()))
        assert sample(app, "warmpool_cache_shared_errors_total", op="get") >= 1
        restarted = RedisServer(tmp_path, redis.port).start()  # the same address: the app's client reconnects
        try:

            def written_again() -> bool:  # after the breaker's cool-down, writes land again
                assert raw(embed(app, text()))
                return restarted.keys() > 0

            wait_for(written_again, 30, "writes to the restarted Redis", interval=0.5)
        finally:
            restarted.stop()


def test_a_redis_that_never_answers_costs_at_most_the_timeout() -> None:
    silent = SilentServer()

    async def lookup() -> tuple[list[bytes | None], float]:
        cache = SharedCache(silent.url, timeout_s=0.2, ttl_s=60)
        started = time.perf_counter()
        found = await cache.get_many([b"a", b"b"])
        return found, time.perf_counter() - started

    try:
        found, took = asyncio.run(lookup())
    finally:
        silent.close()
    assert found == [None, None]
    assert took < 0.2 + 0.1  # the timeout, and the loop's slack on a loaded machine


def test_connections_a_restarted_redis_closed_are_no_failures(tmp_path: Path) -> None:
    """Redis restarted while the server was idle: each pooled connection it closed is replaced on its
    next use, and no lookup fails (3 failures opened the breaker: no cache for its cool-down)."""
    redis = RedisServer(tmp_path).start()

    async def lookups(cache: SharedCache) -> None:
        assert await asyncio.gather(*(cache.get_many([b"a"]) for _ in range(8))) == [[None]] * 8

    async def around_a_restart() -> SharedCache:
        cache = SharedCache(redis.url, timeout_s=TIMEOUT_S, ttl_s=60)
        await lookups(cache)  # 8 connections in the pool
        await asyncio.to_thread(redis.stop)
        await asyncio.to_thread(redis.start)
        await lookups(cache)
        await cache.close()
        return cache

    try:
        cache = asyncio.run(around_a_restart())
    finally:
        redis.stop()
    assert (cache.errors, cache.breaker.state) == (0, "closed")
