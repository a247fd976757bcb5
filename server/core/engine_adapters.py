"""The LoRA adapter set every engine of one model serves, kept the same on each of them: an ADAPTERS
message (common/wire.py) to every attached engine whenever it changes, and to an engine as it attaches
where the set is no longer the one engines start with (EngineSpec.adapters): a re-forked engine serves
what the others serve before its first input. Each engine answers what it holds and what it refused;
inputs naming an adapter are routed around the engines that refused it.
"""

from __future__ import annotations

import asyncio
import itertools
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import structlog

from common.wire import Msg
from server.core.engine_pipe import EnginePipe

AdapterFolders = tuple[tuple[str, Path], ...]

log = structlog.get_logger("warmpool.engine_adapters")


class AdapterUnavailable(Exception):
    """The engine these inputs reached does not hold the LoRA adapter they name: it refused it when it was
    sent the set (NO_ADAPTER), though the others took it. Not the request's fault, and not the engine's."""

    def __init__(self, name: str) -> None:
        super().__init__(f"adapter '{name}' is not loaded on the engine this request reached")
        self.name = name


@dataclass
class _Change:
    """One change of the set, sent to these engines: their answers merged until the last one is in."""

    future: asyncio.Future[dict[str, Any]]
    slots: set[int]
    loaded: dict[str, int] = field(default_factory=dict)
    refused: dict[str, str] = field(default_factory=dict)


class EngineAdapters:
    """Called under the engine client's lock (attached, change) and on pipe reader threads (answered, lost)."""

    def __init__(self, loop: asyncio.AbstractEventLoop, started_with: AdapterFolders = ()) -> None:
        self._loop = loop
        self.started_with = started_with  # what every engine loads at its start (EngineSpec.adapters)
        self.wanted = started_with
        self.resident: dict[str, int] = {}  # name -> the bytes an engine holds for it (its last answer)
        self._seq = itertools.count(1)
        self._changes: dict[int, _Change] = {}
        self._refusing: dict[int, set[str]] = {}  # slot -> the adapters that engine refused: routed around
        self._lock = threading.Lock()

    def attached(self, pipe: EnginePipe) -> None:
        """A (re-)forked engine started with `started_with`: it gets the set as it is now."""
        if self.wanted != self.started_with:
            pipe.send((Msg.ADAPTERS, (next(self._seq), list(self.wanted))))

    def change(self, wanted: AdapterFolders, pipes: Mapping[int, EnginePipe]) -> asyncio.Future[dict[str, Any]]:
        """Every engine serves `wanted` from now on; the future: {"loaded": {name: bytes}, "refused":
        {name: reason}} once each engine has answered or been lost (at once without engines)."""
        self.wanted = wanted
        seq = next(self._seq)
        future: asyncio.Future[dict[str, Any]] = self._loop.create_future()
        change = _Change(future, set(pipes))
        with self._lock:
            self._changes[seq] = change
        for pipe in pipes.values():
            pipe.send((Msg.ADAPTERS, (seq, list(wanted))))
        self._settle_if_done(seq)
        return future

    def answered(self, slot: int, body: tuple[int, dict[str, Any]]) -> None:
        seq, report = body
        if report["refused"]:  # by this engine alone, if the others took it: its inputs get NO_ADAPTER
            log.warning("adapters_refused", slot=slot, refused=report["refused"])
        with self._lock:
            self._refusing[slot] = set(report["refused"])  # its answer covers the whole set
            self.resident = dict(report["loaded"])
            change = self._changes.get(seq)
            if change is None:
                return  # an attaching engine's answer: nobody waits for it
            change.loaded |= report["loaded"]
            change.refused |= report["refused"]
            change.slots.discard(slot)
        self._settle_if_done(seq)

    def refused_by(self, slot: int, name: str) -> None:
        """Engine `slot` answered NO_ADAPTER for `name` (a re-forked engine refuses at its start)."""
        with self._lock:
            self._refusing.setdefault(slot, set()).add(name)

    def able(self, slots: list[int], name: str) -> list[int]:
        """Of `slots`, those whose engine has not refused adapter `name` (every one for the base model)."""
        if not name:
            return slots
        with self._lock:
            return [slot for slot in slots if name not in self._refusing.get(slot, ())]

    def refused(self, name: str) -> list[int]:
        """The slots whose engine refused adapter `name` (/v1/models says how many)."""
        with self._lock:
            return sorted(slot for slot, names in self._refusing.items() if name in names)

    def lost(self, slot: int) -> None:
        """A lost engine answers nothing: changes stop waiting for it (its re-fork gets the set as it attaches)."""
        with self._lock:
            self._refusing.pop(slot, None)
            for change in self._changes.values():
                change.slots.discard(slot)
            seqs = list(self._changes)
        for seq in seqs:
            self._settle_if_done(seq)

    def _settle_if_done(self, seq: int) -> None:
        with self._lock:
            change = self._changes.get(seq)
            if change is None or change.slots:
                return
            del self._changes[seq]
        report = {"loaded": change.loaded, "refused": change.refused}

        def settle() -> None:
            if not change.future.done():  # its waiter may have given up (its deadline)
                change.future.set_result(report)

        self._loop.call_soon_threadsafe(settle)
