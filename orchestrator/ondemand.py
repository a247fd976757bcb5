"""Models on demand: which configured models are resident within WARMPOOL_MEMORY_BUDGET.

Models start in the order listed while they fit (`resident=always` ones whatever the budget); a
request naming a `resident=auto` model that is not loaded loads it (one load however many ask),
the least recently used `auto` models unloaded first to make room; an idle `auto` model goes after
its keep_alive. A model loaded on demand is unloaded for room only past its minimum residence: two
models that do not fit together take turns instead of unloading one per request, and a request for
the one not loaded waits for its turn (at most WARMPOOL_LOAD_WAIT).
A model's memory is estimated from its files before it loads (orchestrator/budget.py), then
measured: its engines' PSS, as the engine phase reports it (common/procmem.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, Protocol

import structlog

from common.procmem import process_memory
from common.settings import Settings
from common.startup import ModelPhases
from orchestrator import prefetch, readorder
from orchestrator.budget import estimate, first_resident, least_recently_used
from server.core.services import ServedModel, Services
from server.http.errors import APIError

if TYPE_CHECKING:
    from orchestrator.lifecycle import EngineWiring

log = structlog.get_logger("warmpool.ondemand")

State = Literal["resident", "loading", "unloading", "unloaded", "failed"]
POLL_S = 0.02  # how often an unload looks whether the model's in-flight requests have finished
TICK_S = 0.25  # how often idle models are looked for (keep_alive)
MEASURE_S = 5.0  # how often resident models' memory is measured again
# A model loaded on demand is not unloaded for room before this long, or RESIDENCE_PER_LOAD times its
# load if longer (the models taking turns in a budget spend at most about a tenth of the time
# loading), but at most half of WARMPOOL_LOAD_WAIT: a request waiting for its turn gets it in time.
MIN_RESIDENCE_S = 2.0
RESIDENCE_PER_LOAD = 10


class Host(Protocol):
    """What the pool needs of the server that boots models (orchestrator/lifecycle.py)."""

    services: Services

    async def boot_model(self, settings: Settings) -> bool: ...

    def wiring(self, name: str) -> EngineWiring | None: ...

    def retire(self, name: str) -> EngineWiring | None: ...


@dataclass
class Slot:
    """One configured model."""

    settings: Settings
    estimate: int
    state: State = "unloaded"
    booting: bool = False  # loading with the start, not on demand
    loads: asyncio.Task[bool] | None = None
    unloads: asyncio.Task[None] | None = None
    measured: int | None = None  # its engines' PSS, bytes
    loaded_at: float = 0.0
    stays_until: float = 0.0  # monotonic: not unloaded for room before (its minimum residence)
    waiters: int = 0  # requests waiting for its load: room is waited for while one does
    awaits_room: bool = False  # its load waits for a model's residence to end
    placed: bool = False  # loading, it has its room (a load still waiting to make room holds none)

    @property
    def name(self) -> str:
        return self.settings.model_name

    @property
    def auto(self) -> bool:
        return self.settings.resident == "auto"

    @property
    def held(self) -> int:
        """What it counts for in the budget: its engines' PSS once measured, at least its estimate
        (measured just after warm-up, an engine has not grown to its working heap yet; an `always`
        model's weights are partly the forkserver's). A load still waiting to make room holds nothing:
        counted, it would keep the load making room (which it waits behind) from ever finding it."""
        if self.state not in ("resident", "loading", "unloading") or (self.state == "loading" and not self.placed):
            return 0
        return max(self.measured or 0, self.estimate)


class ModelPool:
    """The ModelLoader the server asks (server/core/services.py), on the event loop."""

    def __init__(self, host: Host, models: list[Settings], budget: int | None) -> None:
        self.host = host
        self.svc = host.services
        self.budget = budget
        self.slots = {m.model_name: Slot(m, estimate(m)) for m in models}
        self._room = asyncio.Lock()  # one load makes room at a time
        self._measured_at = 0.0
        self.waiting = 0  # requests waiting for a load
        self.min_residence_s = MIN_RESIDENCE_S
        self.svc.startup.on_demand = {name for name, slot in self.slots.items() if slot.auto}

    async def boot(self) -> list[bool]:
        """Start the models that fit, leave the rest unloaded; True for each model that serves."""
        slots = list(self.slots.values())
        chosen = first_resident([s.settings for s in slots], [s.estimate for s in slots], self.budget)
        for slot, starts in zip(slots, chosen, strict=True):
            if not starts:
                self.svc.startup.reset_model(slot.name, "not loaded: loads on its first request")
                log.info("model_unloaded", model=slot.name, estimate_mb=slot.estimate // 10**6, budget=self.budget)
        started = [self._start(slot, booting=True) for slot, starts in zip(slots, chosen, strict=True) if starts]
        results = iter(await asyncio.gather(*started, return_exceptions=True))
        return [next(results) is True if starts else False for starts in chosen]

    def describe(self, name: str) -> dict[str, Any]:
        slot = self.slots[name]
        state: str = slot.state
        if state == "resident":
            state = "ready" if name in self.svc.models else "failed"
        elif state == "loading" and slot.booting:
            state = "starting"
        used = self.svc.last_used.get(name)
        return {"state": state, "resident": slot.settings.resident, "memory_bytes": slot.held, "last_used": used}

    def loading(self) -> bool:
        return any(slot.state == "loading" and not slot.booting for slot in self.slots.values())

    def wakes(self, name: str) -> bool:
        slot = self.slots.get(name)
        return slot is not None and slot.auto and not (slot.state == "loading" and slot.booting)

    async def until_loaded(self, name: str, retry: bool = False) -> None:
        slot = self.slots[name]
        self._fits_alone(slot)
        if slot.state == "failed" and retry:
            slot.state = "unloaded"
        if slot.state == "failed":
            raise APIError(503, f"model '{name}' failed to load: see /health/startup", code="model_failed")
        if self.waiting >= self.svc.settings.admission_permits:  # the wait holds no permit: bounded here
            self.svc.metrics.rejections.labels(reason="overloaded").inc()
            raise APIError(
                429,
                "too many requests wait for models to load; retry later",
                code="overloaded",
                headers={"Retry-After": "1"},
            )
        loop = asyncio.get_running_loop()
        begun = loop.time()
        self.waiting += 1
        slot.waiters += 1
        try:
            while slot.unloads is not None and not slot.unloads.done():
                await asyncio.wait_for(asyncio.shield(slot.unloads), self._left(begun))
            if slot.state != "resident" or name not in self.svc.models:
                ok = await asyncio.wait_for(asyncio.shield(self._start(slot)), self._left(begun))
                if not ok:
                    raise APIError(503, f"model '{name}' failed to load: see /health/startup", code="model_failed")
        except TimeoutError:
            self.svc.metrics.rejections.labels(reason="load_wait").inc()
            if slot.awaits_room:
                raise self._no_room(slot, waited=True) from None
            raise self.svc.unavailable(
                f"model '{name}' is loading and was not ready within WARMPOOL_LOAD_WAIT "
                f"({self.svc.settings.load_wait:g} s): retry later"
            ) from None
        finally:
            self.waiting -= 1
            slot.waiters -= 1
            self.svc.metrics.load_wait.labels(model=name).observe(loop.time() - begun)

    async def unload(self, name: str, reason: str = "asked") -> None:
        slot = self.slots[name]
        if reason == "asked":
            if not slot.auto:
                raise APIError(409, f"model '{name}' is resident=always: it is never unloaded", code="always_resident")
            if slot.state in ("resident", "loading") and not self._others_resident(slot):
                raise APIError(409, f"model '{name}' is the only model loaded: load another first", code="last_model")
        if slot.loads is not None and not slot.loads.done():
            with contextlib.suppress(Exception):
                await asyncio.shield(slot.loads)
        if slot.state != "resident":
            if slot.unloads is not None and not slot.unloads.done():
                await asyncio.shield(slot.unloads)
            return
        slot.state = "unloading"
        slot.unloads = asyncio.ensure_future(self._unload(slot, reason))
        await asyncio.shield(slot.unloads)

    def lost(self, name: str) -> None:
        """The model failed (its start, or its restart budget): it holds nothing now."""
        slot = self.slots.get(name)
        if slot is not None and slot.state == "resident":
            slot.state, slot.measured = "failed", None
            self.svc.metrics.resident_bytes.labels(model=name).set(0)

    async def keep_alive(self) -> None:
        """Unload `auto` models idle past their keep_alive; measure the resident ones now and then."""
        while not self.svc.startup.draining:
            await asyncio.sleep(TICK_S)
            now = time.time()
            for slot in self.slots.values():
                alive = slot.settings.keep_alive
                if not slot.auto or alive is None or slot.state != "resident" or self._busy(slot):
                    continue
                if now - self.svc.last_used.get(slot.name, slot.loaded_at) > alive and self._others_resident(slot):
                    log.info("model_idle", model=slot.name, keep_alive_s=alive)
                    try:
                        await self.unload(slot.name, "idle")
                    except Exception:  # this loop serves every model: one failed unload must not end it
                        log.exception("model_unload_failed", model=slot.name)
            if time.monotonic() - self._measured_at > MEASURE_S:
                await self._measure()

    def _start(self, slot: Slot, booting: bool = False) -> asyncio.Task[bool]:
        """The model's one load: started unless it is under way."""
        if slot.loads is None or slot.loads.done():
            if self.svc.startup.draining:
                raise self.svc.unavailable()
            slot.state, slot.booting, slot.placed = "loading", booting, booting
            slot.loads = asyncio.ensure_future(self._load(slot))
            slot.loads.add_done_callback(lambda t: t.cancelled() or t.exception())  # a waiter may have gone
        return slot.loads

    async def _load(self, slot: Slot) -> bool:
        svc, name = self.svc, slot.name
        loop = asyncio.get_running_loop()
        begun = loop.time()
        try:
            if not slot.booting:
                async with self._room:
                    await self._make_room(slot)
                    slot.placed = True
                if svc.startup.draining:  # the drain stops the engines it knows of: start none after it
                    raise svc.unavailable()
                svc.startup.reset_model(name, "loading")
                _prefetch(slot.settings, svc.startup.for_model(name))
                log.info("model_loading", model=name, estimate_mb=slot.estimate // 10**6)
            booting = loop.time()
            ok = await self.host.boot_model(slot.settings)
        except BaseException:
            slot.state = "unloaded"
            raise
        finally:
            slot.awaits_room = False
        if not ok:
            slot.state = "failed"
            return False
        slot.state, slot.loaded_at = "resident", time.time()
        if not slot.booting:
            residence = max(self.min_residence_s, RESIDENCE_PER_LOAD * (loop.time() - booting))
            residence = min(residence, svc.settings.load_wait / 2)
            slot.stays_until = time.monotonic() + residence
            svc.metrics.model_loads.labels(model=name).inc()
            log.info("model_loaded", model=name, load_s=round(loop.time() - begun, 3))
        await self._measure()
        return True

    async def _make_room(self, slot: Slot) -> None:
        """Unload least recently used `auto` models past their residence until this one fits (those in
        flight finish first). Where the rest is held by `always` models: 503 no_room at once; else wait
        while a request waits for this load (each at most its WARMPOOL_LOAD_WAIT, then 503 no_room)."""
        if self.budget is None:
            return
        await self._measure()
        while (used := sum(s.held for s in self.slots.values() if s is not slot)) + slot.estimate > self.budget:
            victim = least_recently_used([s.name for s in self._unloadable(slot)], self.svc.last_used)
            if victim is not None:
                log.info("model_evicted", model=victim, for_model=slot.name, used_mb=used // 10**6)
                self.svc.metrics.model_evictions.labels(model=victim).inc()
                await self.unload(victim, "evicted")
                continue
            if used - sum(s.held for s in self._turn_takers(slot)) + slot.estimate > self.budget:
                raise self._no_room(slot, waited=False)  # the `always` models leave no room, ever
            if not slot.waiters:  # each request waiting for it has had its WARMPOOL_LOAD_WAIT
                raise self._no_room(slot, waited=True)
            slot.awaits_room = True
            await asyncio.sleep(POLL_S)

    def _unloadable(self, slot: Slot) -> list[Slot]:
        """The `auto` models that may be unloaded to make room for `slot` now: past their residence."""
        now = time.monotonic()
        return [s for s in self._turn_takers(slot) if s.state == "resident" and now >= s.stays_until]

    def _turn_takers(self, slot: Slot) -> list[Slot]:
        """The other `auto` models holding part of the budget (loaded, loading or unloading)."""
        return [s for s in self.slots.values() if s.auto and s is not slot and s.held]

    def _no_room(self, slot: Slot, waited: bool) -> APIError:
        assert self.budget is not None
        used = sum(s.held for s in self.slots.values() if s is not slot) / 1e6
        need = f"model '{slot.name}' needs about {slot.estimate / 1e6:.0f} MB and the models loaded hold {used:.0f} MB"
        budget = f"of WARMPOOL_MEMORY_BUDGET ({self.budget / 1e6:.0f} MB)"
        if waited:
            names = ", ".join(f"'{s.name}'" for s in self._turn_takers(slot))
            why = (
                f"{names} could not be unloaded within WARMPOOL_LOAD_WAIT ({self.svc.settings.load_wait:g} s): "
                "loading, or within their residence (a model loaded on demand stays "
                f"{self.min_residence_s:g} s at least)"
            )
        else:
            why = "none of which can be unloaded (resident=always)"
        return APIError(503, f"{need} {budget}, {why}: retry later", code="no_room", headers={"Retry-After": "1"})

    async def _unload(self, slot: Slot, reason: str) -> None:
        """Stop taking requests for it, let those in flight finish (up to the drain timeout), then
        stop its engine client and its engines; the forkserver and the page cache stay."""
        svc, name = self.svc, slot.name
        loop = asyncio.get_running_loop()
        served = svc.models.pop(name, None)
        wiring = self.host.retire(name)
        deadline = loop.time() + svc.settings.drain_timeout
        while served is not None and _in_flight(served) and loop.time() < deadline:
            await asyncio.sleep(POLL_S)
        if wiring is not None:
            wiring.retired = True  # its engines' exits are not losses to re-fork
            if wiring.supervisor is not None:
                wiring.supervisor.abort()
            if wiring.client is not None:
                wiring.client.stop(f"model '{name}' was unloaded")
            if wiring.supervisor is not None:
                await svc.off_loop(wiring.supervisor.stop_engines)
        svc.startup.reset_model(name, f"unloaded ({reason}): loads on its next request")
        slot.state, slot.measured = "unloaded", None
        svc.metrics.model_unloads.labels(model=name, reason=reason).inc()
        svc.metrics.resident_bytes.labels(model=name).set(0)
        log.info("model_unloaded", model=name, reason=reason)

    async def _measure(self) -> None:
        """Each resident model's engines' PSS (off the loop: smaps_rollup walks every mapping)."""
        self._measured_at = time.monotonic()
        resident = [s for s in self.slots.values() if s.state == "resident"]
        wirings = [self.host.wiring(s.name) for s in resident]
        sizes = await self.svc.off_loop(lambda: [_engines_pss(w) for w in wirings])
        for slot, size in zip(resident, sizes, strict=True):
            if slot.state == "resident":
                slot.measured = size if size is not None else slot.measured
                self.svc.metrics.resident_bytes.labels(model=slot.name).set(slot.held)

    def _fits_alone(self, slot: Slot) -> None:
        if self.budget is not None and slot.estimate > self.budget:
            raise APIError(
                400,
                f"model '{slot.name}' needs about {slot.estimate / 1e6:.0f} MB, more than WARMPOOL_MEMORY_BUDGET "
                f"({self.budget / 1e6:.0f} MB) holds: it cannot be loaded",
                param="model",
                code="model_too_large",
            )

    def _others_resident(self, slot: Slot) -> bool:
        """Another model serves: the last one is kept, so a request naming none has a model."""
        return any(s.state == "resident" and s is not slot and s.name in self.svc.models for s in self.slots.values())

    def _busy(self, slot: Slot) -> bool:
        served = self.svc.models.get(slot.name)
        return served is not None and _in_flight(served)

    def _left(self, begun: float) -> float:
        return max(self.svc.settings.load_wait - (asyncio.get_running_loop().time() - begun), 0.0)


def _prefetch(settings: Settings, phases: ModelPhases) -> None:
    """The model's files read into the page cache in the loader's order, on prefetch's own threads,
    while its engines fork and load (as at the start: they find the bytes read ahead of them)."""
    phases.start("prefetch", threads=settings.prefetch_threads)
    prefetch.start(
        settings.model_path,
        [],
        settings.prefetch_threads,
        settings.prefetch == "on",
        False,  # the environment is in memory: the forkserver runs
        on_progress=lambda detail: phases.update("prefetch", **detail),
        on_done=lambda detail: phases.done("prefetch", **detail),
        on_skip=lambda reason: phases.skip("prefetch", reason),
        views=readorder.CPU_COMPUTE[settings.dtype] if settings.resolved_device == "cpu" else None,
    )


def _in_flight(served: ServedModel) -> bool:
    """Requests hold the model's admission permits from their first input to their answer."""
    return bool(served.admission.used) if served.admission is not None else bool(served.engine.queued_inputs)


def _engines_pss(wiring: EngineWiring | None) -> int | None:
    """What the model's engines hold, their PSS summed (None before any is up): the weights they
    map are counted once between them, the torch pages they share with the forkserver in part."""
    if wiring is None or wiring.supervisor is None:
        return None
    sizes = [process_memory(pid) for pid in wiring.supervisor.pids if pid]
    found = [m["pss_mb"] for m in sizes if m is not None]
    return int(sum(found) * 10**6) if found else None
