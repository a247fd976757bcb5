"""One model's LoRA adapters as the HTTP process tracks them: those of WARMPOOL_ADAPTERS (loaded at every
engine's start, for good) and those loaded at run time through the admin API, which may be unloaded, or
dropped to keep WARMPOOL_ADAPTER_BYTES (least recently used first) and loaded again by the next request
naming one. Every change goes to all the model's engines at once (EngineClient.change_adapters), one at a
time; everything here runs on the event loop, so a request that has checked its adapter loaded and counted
itself as a user cannot see it dropped before its inputs are answered.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from common.settings import Settings
from common.startup import ModelPhases
from server.core.engine_client import EngineClient
from server.http.errors import APIError
from server.http.metrics import Metrics

State = Literal["loaded", "loading", "dropped"]
_GENERATIONS = itertools.count()


@dataclass
class Adapter:
    name: str
    folder: Path
    at_start: bool  # WARMPOOL_ADAPTERS': never dropped for memory
    state: State = "loaded"
    bytes: int = 0  # what one engine holds for it (its answer), else its file's size
    last_used: float = 0.0  # time.time() of the last request naming it
    users: int = 0  # requests whose inputs run with it now
    idle: asyncio.Event = field(default_factory=asyncio.Event)  # set while users == 0
    loading: asyncio.Task[None] | None = None  # its one load on the way (single flight)
    generation: int = field(default_factory=lambda: next(_GENERATIONS))  # this registration of the name

    def card(self) -> dict[str, Any]:
        """Its fields in /v1/models, named as a model's on demand are (ready, loading, unloaded)."""
        return {
            "state": {"loaded": "ready", "loading": "loading", "dropped": "unloaded"}[self.state],
            "memory_bytes": self.bytes,
            "loaded_at": "start" if self.at_start else "run time",
            "last_used": int(self.last_used) or None,
        }


def not_found(name: str) -> APIError:
    return APIError(404, f"adapter '{name}' does not exist", param="model", code="model_not_found")


class AdapterSet:
    def __init__(
        self,
        engine: EngineClient,
        at_start: tuple[tuple[str, Path], ...] = (),
        resident: dict[str, int] | None = None,
        cap: int | None = None,
        wait_s: float = 30.0,
    ) -> None:
        self.engine = engine
        self.cap = cap  # bytes the run-time adapters may hold per engine; None: no bound
        self.wait_s = wait_s  # how long the engines get to answer a change
        self.entries = {
            name: Adapter(name, folder, True, bytes=(resident or {}).get(name, 0)) for name, folder in at_start
        }
        for entry in self.entries.values():
            entry.idle.set()
        self._changing = asyncio.Lock()  # one change of the engines' set at a time
        self.on_change: Callable[[], None] | None = None  # told after every change (the startup detail, metrics)

    def __iter__(self) -> Iterator[tuple[str, Path]]:
        """(name, folder) of each adapter a request may name."""
        return iter([(a.name, a.folder) for a in self.entries.values()])

    def __contains__(self, name: object) -> bool:
        return name in self.entries

    def describe(self) -> dict[str, dict[str, Any]]:
        """Each adapter's card (also read off the loop, by /status: a copy of the entries iterated)."""
        return {name: entry.card() for name, entry in list(self.entries.items())}

    async def load(self, name: str, folder: Path) -> Adapter:
        """Register a run-time adapter and load it on every engine: answered once they serve it; 400 with
        the engines' reason for one they refuse (nothing registered then); 409 for the name of another."""
        entry = self.entries.get(name)
        if entry is not None and entry.folder != folder:
            raise APIError(409, f"adapter '{name}' is loaded from {entry.folder}: unload it first", code="conflict")
        if entry is None:
            entry = self.entries[name] = Adapter(name, folder, False, state="dropped", bytes=_file_bytes(folder))
            entry.idle.set()
        try:
            await self.until_loaded(name, asyncio.get_running_loop().time() + self.wait_s)
        except APIError:
            if entry.state != "loaded" and self.entries.get(name) is entry:
                del self.entries[name]
            raise
        return entry

    async def unload(self, name: str, deadline: float) -> None:
        """Unregister it (new requests get the 404 at once), wait for the requests using it, then drop it
        from the engines."""
        entry = self.entries.pop(name, None)
        if entry is None:
            raise not_found(name)
        try:
            await _until(entry.idle.wait(), deadline, f"adapter '{name}' still in use")
            await self._change()
        finally:
            self.publish()

    async def until_loaded(self, name: str, deadline: float) -> None:
        """At once for a loaded adapter; else its one load (started here or by another request) awaited
        until `deadline` (503 past it); 404 for a name no longer registered."""
        entry = self.entries.get(name)
        if entry is None:
            raise not_found(name)
        if entry.state == "loaded":
            return
        if entry.loading is None:
            entry.loading = asyncio.ensure_future(self._bring_in(entry))
            entry.loading.add_done_callback(lambda task: task.cancelled() or task.exception())
        await _until(asyncio.shield(entry.loading), deadline, f"adapter '{name}' is loading")
        if self.entries.get(name) is not entry or entry.state != "loaded":
            raise not_found(name)

    def use(self, name: str) -> _Use:
        """A request's inputs run with the adapter while this is held (call right after until_loaded)."""
        entry = self.entries.get(name)
        if entry is None or entry.state != "loaded":
            raise not_found(name)
        return _Use(entry)

    async def _bring_in(self, entry: Adapter) -> None:
        try:
            async with self._changing:
                if self.entries.get(entry.name) is not entry:
                    return  # unloaded meanwhile
                self._make_room(entry)
                entry.state = "loading"
                report = await self._change()
                if entry.name in report["refused"]:
                    entry.state = "dropped"
                    del self.entries[entry.name]
                    await self._change()
                    raise APIError(400, report["refused"][entry.name], param="path", code="invalid_adapter")
                entry.state = "loaded"
                entry.bytes = report["loaded"].get(entry.name, entry.bytes)
                entry.last_used = time.time()
        finally:
            if entry.state == "loading":  # the engines did not answer in time: the next request tries again
                entry.state = "dropped"
            entry.loading = None
            self.publish()

    def _make_room(self, incoming: Adapter) -> None:
        """Drop the least recently used run-time adapters nobody uses until `incoming` fits the cap (the
        engines let them go with the change that loads it); 400 for one larger than the cap alone."""
        if self.cap is None:
            return
        if incoming.bytes > self.cap:
            raise APIError(
                400,
                f"adapter '{incoming.name}' ({incoming.bytes} bytes) is larger than "
                f"WARMPOOL_ADAPTER_BYTES ({self.cap})",
                param="path",
                code="adapter_too_large",
            )
        loaded = [a for a in self.entries.values() if not a.at_start and a.state == "loaded"]
        held = sum(a.bytes for a in loaded)
        for victim in sorted((a for a in loaded if a.users == 0), key=lambda a: a.last_used):
            if held + incoming.bytes <= self.cap:
                break
            victim.state = "dropped"
            held -= victim.bytes
        if held + incoming.bytes > self.cap:
            raise APIError(
                503,
                f"no room for adapter '{incoming.name}' within WARMPOOL_ADAPTER_BYTES: the others are in use",
                code="not_ready",
                headers={"Retry-After": "1"},
            )

    async def _change(self) -> dict[str, Any]:
        """The engines' set made the loaded and loading adapters: their report."""
        wanted = tuple((a.name, a.folder) for a in self.entries.values() if a.state != "dropped")
        report = await _until(self.engine.change_adapters(wanted), self._deadline(), "the engines did not answer")
        return report

    def _deadline(self) -> float:
        return asyncio.get_running_loop().time() + self.wait_s

    def publish(self) -> None:
        if self.on_change is not None:
            self.on_change()


class _Use:
    def __init__(self, entry: Adapter) -> None:
        self.entry = entry

    def __enter__(self) -> None:
        self.entry.users += 1
        self.entry.idle.clear()
        self.entry.last_used = time.time()

    def __exit__(self, *_: object) -> None:
        self.entry.users -= 1
        if self.entry.users == 0:
            self.entry.idle.set()


async def _until(awaitable: Any, deadline: float, what: str) -> Any:
    """`awaitable` by the loop's `deadline`: 503 with Retry-After past it."""
    try:
        return await asyncio.wait_for(awaitable, max(deadline - asyncio.get_running_loop().time(), 0.0))
    except TimeoutError:
        raise APIError(503, f"{what}: retry later", code="not_ready", headers={"Retry-After": "1"}) from None


def _file_bytes(folder: Path) -> int:
    """What an adapter not yet loaded is taken to hold: its weights file's size (float32 A and B, as saved)."""
    try:
        return (folder / "adapter_model.safetensors").stat().st_size
    except OSError:
        return 0


def model_adapters(
    name: str, engine: EngineClient, settings: Settings, loaded: dict[str, Any], metrics: Metrics, phases: ModelPhases
) -> AdapterSet:
    """A model's adapters as it starts serving (`loaded`: its engine's LOADED detail, which holds what each
    WARMPOOL_ADAPTERS adapter takes), each change shown in its ready phase's detail and in the metrics."""
    adapters = AdapterSet(
        engine, settings.adapter_folders, loaded.get("adapters"), settings.adapter_cap, settings.load_wait
    )
    shown: set[str] = set()

    def show() -> None:
        cards = adapters.describe()
        phases.update("ready", adapters=cards)
        for gone in shown - cards.keys():
            metrics.adapter_resident_bytes.labels(model=name, adapter=gone).set(0)
        for adapter, card in cards.items():
            held = card["memory_bytes"] if card["state"] == "ready" else 0
            metrics.adapter_resident_bytes.labels(model=name, adapter=adapter).set(held)
        shown.update(cards)

    adapters.on_change = show
    return adapters
