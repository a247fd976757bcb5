"""ResultCache — a request's inputs answered from the exact result cache where it can, the rest by
the engine, one forward per distinct input however many ask for it at once (single flight).

Per input, in order: the process's LRU (looked up on the executor, with the keys made there:
`lookup`), then Redis where WARMPOOL_CACHE_URL is set (one MGET for the request's misses), then
an identical input another request is already running (awaited, not run again), then the engine.
What the engine answered is stored on the executor as the response is rendered, in the LRU, then
in Redis in the background. A request whose inputs are all distinct misses keeps the engine
client's one hand-over to the executor (its `then` stores and renders).
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Awaitable, Callable
from concurrent.futures import Executor
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from common.settings import Settings
from common.wire import Tokens
from server.core.outcome import Outcome
from server.core.result_cache import (
    CacheFormatError,
    LocalLRU,
    Value,
    adapter_digest,
    decode,
    encode,
    input_key,
    model_digest,
)
from server.core.shared_cache import SharedCache
from server.http.metrics import Metrics

if TYPE_CHECKING:
    from server.core.services import ServedModel

TIERS = ("local", "shared", "flight")  # where a hit came from (warmpool_cache_hits_total's label)
Submit = Callable[[list[Tokens], Callable[[Outcome], Any] | None], Awaitable[Outcome]]


class FlightTimeout(Exception):
    """The request's deadline passed while it waited for another request's forward of its input."""


class _LeaderFailed(Exception):
    """The request running an input failed or left: those waiting for it run it themselves."""


@dataclass
class Lookup:
    """A request's inputs' keys and what the LRU held for them (None: not there)."""

    keys: list[bytes]
    rows: list[Value | None]
    # whether answers computed now may be kept under these keys: the engines still run the mode they
    # were made for (server/core/engine_modes.py)
    keep: Callable[[], bool] = lambda: True


class ResultCache:
    def __init__(self, settings: Settings, bound: int, metrics: Metrics, executor: Executor) -> None:
        self.lru = LocalLRU(bound)
        self.shared = (
            SharedCache(settings.cache_url, settings.cache_timeout, settings.cache_ttl, self._shared_failed)
            if settings.cache_url
            else None
        )
        self._settings = settings
        self._metrics = metrics
        self._executor = executor
        self._flight: dict[bytes, asyncio.Future[Value]] = {}  # inputs being run now, by key
        self._digests: dict[tuple[str, str], tuple[int, str]] = {}  # (model, mode) -> (engine client's id, digest)
        self._digest_lock = threading.Lock()
        self._adapter_digests: dict[tuple[str, str, int], str] = {}  # (model, adapter, its load) -> digest
        self._per_model: dict[str, Settings] | None = None
        self._started = False
        metrics.cache_bytes.set_function(lambda: self.lru.bytes)
        metrics.cache_entries.set_function(lambda: len(self.lru))

    def _shared_failed(self, op: str) -> None:
        self._metrics.cache_shared_errors.labels(op=op).inc()

    def digest(self, model: ServedModel, mode: str) -> str:
        """The model's digest (result_cache.model_digest) with its engines' forward (eager or compiled),
        made once per load of it and mode (on the executor)."""
        with self._digest_lock:
            known = self._digests.get((model.name, mode))
            if known is not None and known[0] == id(model.engine):
                return known[1]
            if self._per_model is None:
                self._per_model = {m.model_name: m for m in self._settings.per_model()}
            ms = self._per_model.get(model.name, self._settings)
            made = model_digest(ms.model_path, ms.dtype, ms.resolved_device, mode)
            self._digests[(model.name, mode)] = (id(model.engine), made)
            return made

    def _adapter(self, model: ServedModel, name: str) -> str:
        """The digest of the adapter an input names, made once per load of it (a name loaded again
        from other files keys apart)."""
        entry = model.adapters.entries.get(name) if name and model.adapters is not None else None
        if entry is None:
            return ""
        made = self._adapter_digests.get((model.name, name, entry.generation))
        if made is None:
            made = self._adapter_digests[(model.name, name, entry.generation)] = adapter_digest(entry.folder)
        return made

    def lookup(self, model: ServedModel, tokens: list[Tokens]) -> Lookup:
        """Where prepare runs (the executor; a short gRPC text's: the loop): each input's key, and its
        answer where the LRU holds it. While the model's engines run different forwards (a compile
        switch under way) nothing is looked up nor kept: the keys only join identical inputs in flight."""
        mode, changes = model.engine.modes.serving()
        digest = self.digest(model, mode or "mixed")
        keys = [input_key(digest, t, self._adapter(model, t.adapter)) for t in tokens]
        if mode is None:
            return Lookup(keys, [None] * len(keys), lambda: False)
        unchanged = lambda: model.engine.modes.serving() == (mode, changes)  # noqa: E731
        return Lookup(keys, [self._decoded(self.lru.get(k)) for k in keys], unchanged)

    @staticmethod
    def _decoded(data: bytes | None) -> Value | None:
        try:
            return None if data is None else decode(data)
        except CacheFormatError:
            return None

    async def run(
        self, found: Lookup, tokens: list[Tokens], submit: Submit, then: Callable[[Outcome], Any], deadline: float
    ) -> tuple[Outcome, str]:
        """The request's outcome (rendered by `then`) and how the cache answered it: `hit` (no input
        ran on the engine for it), `miss` (every one did) or `partial`."""
        loop = asyncio.get_running_loop()
        if self.shared is not None and not self._started:
            self._started = True
            self.shared.start()
        keys, rows = found.keys, list(found.rows)
        hits = {"local": sum(r is not None for r in rows), "shared": 0, "flight": 0}
        if found.keep():
            await self._from_shared(keys, rows, hits)
        leaders: dict[bytes, int] = {}  # key -> its first position: run here
        followers: dict[bytes, asyncio.Future[Value]] = {}  # key -> another request's run of it
        for i, key in enumerate(keys):
            if rows[i] is not None or key in leaders or key in followers:
                continue
            if key in self._flight:
                followers[key] = self._flight[key]
            elif (late := self._decoded(self.lru.get(key))) is not None:  # stored since this request's lookup
                rows[i] = late
                hits["local"] += 1
            else:
                leaders[key] = i
        flights = {key: loop.create_future() for key in leaders}
        for future in flights.values():
            future.add_done_callback(lambda f: f.cancelled() or f.exception())  # retrieved when none waits
        self._flight.update(flights)
        fresh: dict[bytes, Value] = {}  # answered by this request's forwards: stored
        stored: list[tuple[bytes, bytes]] = []
        try:
            everything = len(leaders) == len(keys)  # all distinct misses: the engine client's `then` renders
            first = then if everything else None
            ran = await self._forward(leaders, tokens, submit, fresh, flights, first, stored, found.keep)
            retry = await self._await_others(followers, rows, keys, deadline)
            ran = await self._forward(retry, tokens, submit, fresh, {}, None, stored, found.keep) or ran
            if everything and ran is not None:
                outcome = ran
            else:
                rows = [fresh[key] if row is None else row for key, row in zip(keys, rows, strict=True)]
                outcome = Outcome.of(rows, ran.queue_ms if ran else 0.0, ran.inference_ms if ran else 0.0)  # type: ignore[arg-type]
                outcome.rendered = await loop.run_in_executor(
                    self._executor, self._store_and_render, fresh, outcome, then, stored, found.keep
                )
        finally:
            for key, future in flights.items():
                if self._flight.get(key) is future:
                    del self._flight[key]
        # an input run for another request, or repeated within this one, counts as a hit of the flight
        hits["flight"] = len(keys) - hits["local"] - hits["shared"] - len(fresh)
        self._count(hits, len(fresh))
        if self.shared is not None:
            self.shared.put_many(stored)
        state = "hit" if not fresh else "miss" if len(fresh) == len(keys) else "partial"
        return outcome, state

    async def _from_shared(self, keys: list[bytes], rows: list[Value | None], hits: dict[str, int]) -> None:
        """Redis's answers for the inputs the LRU did not hold (one MGET), decoded and kept in the LRU
        on the executor."""
        missing = list(dict.fromkeys(k for k, r in zip(keys, rows, strict=True) if r is None))
        if self.shared is None or not missing:
            return
        values = await self.shared.get_many(missing)
        got = {k: v for k, v in zip(missing, values, strict=True) if isinstance(v, bytes)}
        if not got:
            return
        adopted = await asyncio.get_running_loop().run_in_executor(self._executor, self._adopt, got)
        for i, key in enumerate(keys):
            if rows[i] is None and key in adopted:
                rows[i] = adopted[key]
                hits["shared"] += 1

    def _adopt(self, got: dict[bytes, bytes]) -> dict[bytes, Value]:
        adopted = {}
        for key, data in got.items():
            value = self._decoded(data)
            if value is not None:  # another format's value: a miss, overwritten once computed
                adopted[key] = value
                self._put(key, data)
        return adopted

    async def _forward(
        self,
        leaders: dict[bytes, int],
        tokens: list[Tokens],
        submit: Submit,
        fresh: dict[bytes, Value],
        flights: dict[bytes, asyncio.Future[Value]],
        then: Callable[[Outcome], Any] | None,
        stored: list[tuple[bytes, bytes]],
        keep: Callable[[], bool],
    ) -> Outcome | None:
        """The engine's answers for these inputs (one each), into `fresh`, and to those waiting for them."""
        if not leaders:
            return None
        order = list(leaders)
        wrapped = None
        if then is not None:
            wrapped = lambda out: self._store_and_render(  # noqa: E731
                dict(zip(order, out.vectors, strict=True)), out, then, stored, keep
            )
        try:
            outcome = await submit([tokens[i] for i in leaders.values()], wrapped)
        except BaseException:
            for future in flights.values():
                if not future.done():
                    future.set_exception(_LeaderFailed())
            raise
        for key, row in zip(order, outcome.vectors, strict=True):
            fresh[key] = row
            if key in flights:
                flights[key].set_result(row)
        return outcome

    async def _await_others(
        self,
        followers: dict[bytes, asyncio.Future[Value]],
        rows: list[Value | None],
        keys: list[bytes],
        deadline: float,
    ) -> dict[bytes, int]:
        """Other requests' answers for these inputs; those whose run failed come back to be run here."""
        if not followers:
            return {}
        loop = asyncio.get_running_loop()
        _, pending = await asyncio.wait(followers.values(), timeout=max(deadline - loop.time(), 0.0))
        if pending:
            raise FlightTimeout()
        retry = {}
        for i, key in enumerate(keys):
            future = followers.get(key)
            if future is None or rows[i] is not None:
                continue
            if future.exception() is None:
                rows[i] = future.result()
            elif key not in retry:
                retry[key] = i
        return retry

    def _store_and_render(
        self,
        fresh: dict[bytes, Value],
        outcome: Outcome,
        then: Callable[[Outcome], Any],
        stored: list[tuple[bytes, bytes]],
        keep: Callable[[], bool],
    ) -> Any:
        """On the executor: this request's new answers into the LRU (their bytes kept for Redis), then the
        response. Not kept where an engine changed its forward since the lookup: they may be either's bits."""
        for key, value in fresh.items() if keep() else ():
            data = encode(value)
            self._put(key, data)
            stored.append((key, data))
        return then(outcome)

    def _put(self, key: bytes, data: bytes) -> None:
        before = self.lru.evictions
        self.lru.put(key, data)
        if self.lru.evictions != before:
            self._metrics.cache_evictions.inc(self.lru.evictions - before)

    def _count(self, hits: dict[str, int], misses: int) -> None:
        for tier, count in hits.items():
            if count:
                self._metrics.cache_hits.labels(tier=tier).inc(count)
        if misses:
            self._metrics.cache_misses.inc(misses)

    def stats(self) -> dict[str, Any]:
        """The status page's and /health/startup's figures."""
        registry = self._metrics.registry
        hits = {t: int(registry.get_sample_value("warmpool_cache_hits_total", {"tier": t}) or 0) for t in TIERS}
        found: dict[str, Any] = {
            "enabled": True,
            "entries": len(self.lru),
            "bytes": self.lru.bytes,
            "bound_bytes": self.lru.bound,
            "hits": hits,
            "misses": int(registry.get_sample_value("warmpool_cache_misses_total") or 0),
            "evictions": self.lru.evictions,
        }
        if self.shared is not None:
            found["shared"] = self.shared.stats()
        return found


def cache_stats(cache: ResultCache | None) -> dict[str, Any]:
    return {"enabled": False} if cache is None else cache.stats()
