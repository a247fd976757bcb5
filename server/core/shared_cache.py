"""The result cache shared by a fleet through Redis (WARMPOOL_CACHE_URL), behind the process's LRU.

Redis is never on the start path nor a reason for a request to fail: the client connects on its
first command (a background ping at start), every call has a deadline (WARMPOOL_CACHE_TIMEOUT), and
after BREAKER_FAILURES failures in a row it is not asked for BREAKER_COOLDOWN_S; a lookup that fails
or times out is a miss (the request computes and answers), a write that fails is dropped. Writes are
fire-and-forget, at most MAX_WRITES_IN_FLIGHT at once (more are dropped, counted).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from typing import Any

import structlog

from server.core.result_cache import FORMAT_VERSION

log = structlog.get_logger("warmpool.cache")

BREAKER_FAILURES = 3
BREAKER_COOLDOWN_S = 5.0
MAX_WRITES_IN_FLIGHT = 32
KEY_PREFIX = f"warmpool:v{FORMAT_VERSION}:".encode()


class Breaker:
    """Closed until `failures` failures in a row; then open (nothing asked) for `cooldown_s`; then one
    call is let through (half-open): its success closes it, its failure opens it again."""

    def __init__(
        self,
        failures: int = BREAKER_FAILURES,
        cooldown_s: float = BREAKER_COOLDOWN_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.failures = failures
        self.cooldown_s = cooldown_s
        self._clock = clock
        self._failed = 0
        self._open_until = 0.0

    @property
    def state(self) -> str:
        if self._failed < self.failures:
            return "closed"
        return "open" if self._clock() < self._open_until else "half-open"

    def allows(self) -> bool:
        state = self.state
        if state == "half-open":  # one try: open again meanwhile, so that only it goes through
            self._open_until = self._clock() + self.cooldown_s
        return state != "open"

    def succeeded(self) -> None:
        self._failed = 0

    def failed(self) -> None:
        self._failed += 1
        if self._failed >= self.failures:
            self._open_until = self._clock() + self.cooldown_s


class SharedCache:
    """Redis as the fleet's cache: MGET for a request's inputs in one round trip, SET with a TTL."""

    def __init__(self, url: str, timeout_s: float, ttl_s: float, on_error: Callable[[str], None] | None = None) -> None:
        import redis.asyncio  # only with WARMPOOL_CACHE_URL set
        from redis.asyncio.retry import Retry
        from redis.backoff import NoBackoff
        from redis.exceptions import ConnectionError as RedisConnectionError

        # redis-py's own socket timeouts back the deadline below; no retry on a timeout: a miss is
        # cheaper. One retry, at once, on a connection error: a pooled connection that a restarted
        # Redis closed fails once and is replaced; without it each one failed a call, and a burst
        # after a restart opened the breaker while Redis was up. Both tries stay within the deadline.
        self._client: Any = redis.asyncio.Redis.from_url(
            url,
            socket_timeout=timeout_s,
            socket_connect_timeout=timeout_s,
            retry_on_timeout=False,
            retry=Retry(NoBackoff(), 1),
            retry_on_error=[RedisConnectionError],
        )
        self.url = url
        self.timeout_s = timeout_s
        self.ttl_ms = max(int(ttl_s * 1000), 1)
        self.breaker = Breaker()
        self.writes: set[asyncio.Task[None]] = set()
        self.dropped_writes = 0
        self.errors = 0
        self._on_error = on_error or (lambda kind: None)

    def start(self) -> None:
        """Connect in the background (on the event loop): the start never waits for Redis."""
        self._spawn(self._ping())

    async def _ping(self) -> None:
        await self._call("ping", self._client.ping)

    async def get_many(self, keys: list[bytes]) -> list[bytes | None]:
        """The values stored under `keys` (None for each missing), or all None when Redis fails or is slow."""
        found = await self._call("get", self._client.mget, [KEY_PREFIX + k for k in keys])
        if not isinstance(found, list) or len(found) != len(keys):
            return [None] * len(keys)
        return found

    def put_many(self, items: list[tuple[bytes, bytes]]) -> None:
        """Store in the background, each with the TTL; dropped past MAX_WRITES_IN_FLIGHT or while the
        breaker is open."""
        if not items:
            return
        if len(self.writes) >= MAX_WRITES_IN_FLIGHT:
            self.dropped_writes += 1
            return
        self._spawn(self._put(items))

    async def _put(self, items: list[tuple[bytes, bytes]]) -> None:
        pipe = self._client.pipeline(transaction=False)
        for key, value in items:
            pipe.set(KEY_PREFIX + key, value, px=self.ttl_ms)
        await self._call("set", pipe.execute)

    async def _call(self, kind: str, fn: Callable[..., Any], *args: Any) -> Any:
        """fn(*args) within the timeout; None where the breaker is open or it failed."""
        if not self.breaker.allows():
            return None
        try:
            result = await asyncio.wait_for(fn(*args), self.timeout_s)
        except Exception as exc:  # any failure of Redis is a miss, never the request's failure
            self.breaker.failed()
            self.errors += 1
            self._on_error(kind)
            log.debug("cache_redis_failed", op=kind, error=f"{type(exc).__name__}: {exc}", breaker=self.breaker.state)
            return None
        self.breaker.succeeded()
        return result

    def _spawn(self, work: Any) -> None:
        task = asyncio.ensure_future(work)
        self.writes.add(task)
        task.add_done_callback(self.writes.discard)

    def stats(self) -> dict[str, Any]:
        return {
            "url": _without_password(self.url),
            "breaker": self.breaker.state,
            "errors": self.errors,
            "writes_in_flight": len(self.writes),
            "dropped_writes": self.dropped_writes,
        }

    async def close(self) -> None:
        for task in list(self.writes):
            task.cancel()
        with contextlib.suppress(Exception):  # closing a dead connection: nothing to keep
            await asyncio.wait_for(self._client.aclose(), self.timeout_s)


def _without_password(url: str) -> str:
    """The URL for display: a password in it replaced."""
    scheme, sep, rest = url.partition("://")
    auth, at, host = rest.rpartition("@")
    if not at:
        return url
    user = auth.split(":", 1)[0]
    return f"{scheme}{sep}{user}:***@{host}" if ":" in auth else url
