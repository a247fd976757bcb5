"""The HTTP process's side of the engines: dispatch, results, requeue, cancel, and a stall watchdog.

Pickling and pipe writes happen on each engine's sender thread and result bookkeeping on its
reader thread (server.core.engine_pipe), so the event loop only registers futures and receives
finished requests. Each input goes to the engine with the fewest tokens outstanding (of those
server.core.engine_routing lets it take; of equal ones, the one with fewer interactive tokens: an engine
runs those first, so an interactive input there waits for the group running, not for another one's whole
forward); a dead engine's inputs move to the others, once per request.
An engine with work outstanding that answers nothing for a while is taken for stalled
(server.core.engine_stalls): it gets no new work while another engine answers, and what it holds moves
to those; past the whole stall timeout it is reported, so the supervisor can kill and replace it.
"""

from __future__ import annotations

import asyncio
import functools
import itertools
import threading
import time
from collections.abc import Callable, Iterable, MutableSequence
from concurrent.futures import Executor
from multiprocessing.connection import Connection
from typing import Any

import numpy as np
import structlog

from common.wire import BUSY, Keyed, Msg, Tokens
from server.core.engine_adapters import AdapterFolders, AdapterUnavailable, EngineAdapters
from server.core.engine_events import BatchStats, EngineEvents
from server.core.engine_inflight import InFlight, InFlightInput
from server.core.engine_modes import EAGER, EngineModes
from server.core.engine_pipe import EnginePipe
from server.core.engine_routing import EngineRouting
from server.core.engine_stalls import EngineStalls
from server.core.outcome import Outcome


class EngineUnavailable(Exception):
    """No engine can run this request now (none attached, or engines died twice under it)."""


class EngineFailed(Exception):
    """The engine ran the batch and it raised."""


log = structlog.get_logger("warmpool.engine_client")


class EngineClient:
    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        executor: Executor,
        events: EngineEvents,
        stall_timeout_s: float | None = None,
        adapters: AdapterFolders = (),
    ) -> None:
        self._loop = loop
        self.adapters = EngineAdapters(loop, adapters)  # the LoRA adapters every engine serves
        self._executor = executor
        self._events = events
        self._lock = threading.Lock()
        self._keys = itertools.count()
        self._entries: dict[int, InFlightInput] = {}
        self._slots: dict[int, EnginePipe] = {}
        self._stopped = False
        self.modes = EngineModes()  # which forward each engine runs: the result cache keys by it
        self.routing = EngineRouting()  # an engine kept for interactive work while there is some
        # The engines' busy slots (common.wire.BUSY), where the supervisor shares them: marked before the
        # work is sent, so an engine sizing its threads sees every engine one dispatch gives work to.
        self.busy: MutableSequence[float] | None = None
        self.stalls = EngineStalls(stall_timeout_s)  # the watchdog's judgement (its timeout None until known)
        self._watchdog = threading.Event()
        threading.Thread(target=self._watch, name="engine-watchdog", daemon=True).start()

    @property
    def attached(self) -> int:
        """Engines taking work now."""
        return len(self._slots)

    @property
    def queued_inputs(self) -> int:
        with self._lock:
            return len(self._entries)

    def attach(self, slot: int, conn: Connection, mode: str = EAGER) -> None:
        """An engine is ready (running `mode`'s forward): it takes what no live engine holds, then its
        share of new work."""
        with self._lock:
            if self._stopped:  # a restart that finished while the server stopped: let it exit
                conn.close()
                return
            self.modes.set(slot, mode)
            self._slots[slot] = pipe = EnginePipe(slot, conn, self._on_message, self._on_lost)
            self.adapters.attached(pipe)  # before its first input
            self._dispatch([e for e in self._entries.values() if e.slot is None])

    def submit(
        self, tokens: list[Tokens], then: Callable[[Outcome], Any] | None = None, tenant: str = ""
    ) -> tuple[asyncio.Future[Outcome], list[int]]:
        """Queue one request's inputs (`tenant`'s, where keys name one); the future resolves with one
        row per input, in order.

        `then` (response building) runs on the executor as soon as the last row arrives, and the
        future resolves after it with its result in `rendered`: the loop wakes once per request
        instead of once for the rows and again to hand them to the executor.
        """
        future: asyncio.Future[Outcome] = self._loop.create_future()
        keys = [next(self._keys) for _ in tokens]
        items = list(zip(keys, tokens, strict=True))
        request = InFlight(future, items, [None] * len(items), then, tenant=tenant)
        entries = [InFlightInput(request, index, None) for index in range(len(items))]
        with self._lock:
            if not self._slots:
                raise EngineUnavailable("no engine is running")
            self.routing.saw(items, tenant)
            self._entries.update(zip(keys, entries, strict=True))
            self._dispatch(entries)
        return future, keys

    def change_adapters(self, wanted: AdapterFolders) -> asyncio.Future[dict[str, Any]]:
        """Every engine serves these LoRA adapters from now on (EngineAdapters.change)."""
        with self._lock:
            return self.adapters.change(wanted, self._slots)

    def cancel(self, keys: list[int]) -> None:
        """Forget a request (its client left); engines drop those inputs if still queued."""
        with self._lock:
            self._drop(keys)

    def stop(self, reason: str = "the server is shutting down") -> None:
        """Tell every engine to stop and answer what is still pending with EngineUnavailable."""
        with self._lock:
            self._stopped = True
            pipes, self._slots = self._slots, {}
        self._watchdog.set()
        for pipe in pipes.values():
            pipe.send((Msg.STOP, None))
            pipe.close_sender()
        self.fail_all(reason)

    def fail_all(self, reason: str) -> None:
        with self._lock:
            requests = self._requests_of(self._entries.values())
            self._entries.clear()
        for req in requests:
            self._settle(req, EngineUnavailable(reason))

    def _dispatch(self, entries: list[InFlightInput]) -> None:
        """Each input to the engine of _targets with the fewest tokens outstanding (then interactive ones),
        of those its priority and tenant may take (EngineRouting) that have not refused its adapter where
        any has not (caller holds the lock)."""
        if not self._slots or not entries:
            return
        slots = self._targets()
        batches: dict[int, list[Keyed]] = {}
        kept_off = functools.cache(self.routing.kept_off)  # each tenant's, once per dispatch
        for entry in entries:
            key, tokens = entry.request.items[entry.index]
            off = kept_off(entry.request.tenant)
            allowed = self.routing.targets(slots, tokens.priority, off, self._load)
            able = self.adapters.able(allowed, tokens.adapter) or self.adapters.able(slots, tokens.adapter)
            entry.slot = slot = min(able or slots, key=lambda s: (self._load(s), self._slots[s].interactive))
            self._slots[slot].add(entry.tokens, entry.interactive)
            if off and tokens.priority <= 0:  # queued behind the other tenants' inputs there
                tokens = tokens._replace(behind=True)
            batches.setdefault(slot, []).append((key, tokens))
        if self.busy is not None:
            # A request split over idle engines: the first to read its share would otherwise find the
            # others idle and take every core, three threads on two cores once the next begins.
            for slot in batches:
                self.busy[slot] = BUSY
        for slot, items in batches.items():
            self._slots[slot].send((Msg.SUBMIT, items))

    def _load(self, slot: int) -> int:
        return self._slots[slot].load

    def _targets(self) -> list[int]:
        """The engines _dispatch sends to: those not stalled while there are any (caller holds the lock)."""
        return [s for s in self._slots if s not in self.stalls.slots] or list(self._slots)

    @staticmethod
    def _requests_of(entries: Iterable[InFlightInput]) -> list[InFlight]:
        return list({id(e.request): e.request for e in entries}.values())

    def _on_message(self, pipe: EnginePipe, kind: str, body: Any) -> None:
        """On the pipe's reader thread."""
        with self._lock:
            pipe.progressed()
        try:
            if kind == Msg.RESULT:
                keys, vectors, stats = body
                self._on_result(keys, vectors, stats, pipe.slot)
            elif kind == Msg.ERROR:
                keys, message = body
                self._on_error(keys, lambda: EngineFailed(message), pipe.slot)
            elif kind == Msg.NO_ADAPTER:  # those inputs alone, not run (the group ran)
                keys, name = body
                self._on_no_adapter(keys, name, pipe.slot)
            elif kind == Msg.COMPILE:
                self.modes.set(pipe.slot, str(body.get("mode", EAGER)))  # before any row it computes compiled
                self._events.engine_compile(pipe.slot, body)
            elif kind == Msg.ADAPTERS:
                self.adapters.answered(pipe.slot, body)
        except Exception:  # a bug here must not silently stop this engine's results
            log.exception("engine_message_failed", slot=pipe.slot, kind=kind)

    def _watch(self) -> None:
        """Route around the engines engine_stalls takes for stalled, moving what they hold, and report
        each one past the whole stall timeout."""
        while not self._watchdog.wait(0.1):
            with self._lock:
                report = self.stalls.judge(list(self._slots.values()), time.monotonic())
                if report is None:
                    continue
                self._move_off()
                stalled = sorted(self.stalls.slots)
            if report.changed:
                log.warning("engines_stalled", slots=stalled, every=report.every)
                self._events.engines_stalled(stalled, report.every)
            for pipe, seconds in report.past_timeout:
                log.error("engine_stalled", slot=pipe.slot, seconds=round(seconds, 1), load=pipe.load)
                self._events.engine_stalled(pipe.slot, seconds)

    def _move_off(self) -> None:
        """What stalled engines hold goes to the engines still answering, if there are any; the
        stalled ones are told to drop it; what one still answers (it was running it) the engine it moved
        to is told to drop in turn (`_answered`)."""
        if not self.stalls.slots or not set(self._slots) - self.stalls.slots:
            return
        moved = [e for e in self._entries.values() if e.slot in self.stalls.slots]
        if not moved:
            return
        for slot in {e.slot for e in moved}:
            held = [e for e in moved if e.slot == slot]
            self._slots[slot].cancel(sum(e.tokens for e in held), sum(e.interactive for e in held))  # type: ignore[index]
            self._slots[slot].send((Msg.CANCEL, [e.request.items[e.index][0] for e in held]))  # type: ignore[index]
        for entry in moved:
            entry.slot = None
        log.warning("inputs_moved_off_stalled", slots=sorted(self.stalls.slots), inputs=len(moved))
        self._dispatch(moved)

    def _on_result(self, keys: list[int], vectors: np.ndarray, stats: dict[str, Any], slot: int) -> None:
        """Engine `slot`'s rows. An input moved off it while it stalled may come back from it still
        (it was running them): the engine it moved to is then told to drop it."""
        done: list[InFlight] = []
        share = stats["inference_ms"] / max(len(keys), 1)
        with self._lock:
            self._answered(keys, slot)
            for row, key in enumerate(keys):
                entry = self._entries.pop(key, None)
                if entry is None:
                    continue
                req = entry.request
                req.rows[entry.index] = vectors[row]
                req.inference_ms += share
                if all(r is not None for r in req.rows):
                    done.append(req)
        self._events.batch_done(BatchStats(stats["batch_size"], stats["batch_tokens"], stats["inference_ms"]))
        settled: list[tuple[InFlight, Outcome | Exception]] = []
        for req in done:
            total_ms = (time.perf_counter() - req.submitted) * 1000
            inference_ms = min(req.inference_ms, total_ms)
            outcome = Outcome.of(req.rows, total_ms - inference_ms, inference_ms)  # type: ignore[arg-type]
            if req.then is None:
                settled.append((req, outcome))
                continue
            try:
                self._executor.submit(self._finish, req, outcome)
            except RuntimeError as exc:  # the executor is shut down: the server is exiting
                settled.append((req, exc))
        self._settle_all(settled)

    def _finish(self, req: InFlight, outcome: Outcome) -> None:
        """On the executor: the request's `then`, then its future."""
        assert req.then is not None
        try:
            outcome.rendered = req.then(outcome)
        except Exception as exc:
            self._settle(req, exc)
            return
        self._settle(req, outcome)

    def _on_error(self, keys: list[int], error: Callable[[], Exception], slot: int) -> None:
        with self._lock:
            failed = self._requests_of(e for k in keys if (e := self._entries.get(k)))
            self._answered(keys, slot)
            for key in keys:
                self._entries.pop(key, None)
            self._forget(failed)
        for req in failed:
            self._settle(req, error())  # one exception per request: each await raises its own

    def _on_no_adapter(self, keys: list[int], name: str, slot: int) -> None:
        """Engine `slot` refused adapter `name` (its folder gone since the others loaded it): those
        inputs go to an engine _dispatch sends to that has not refused it; with none, their requests fail (503)."""
        self.adapters.refused_by(slot, name)
        with self._lock:
            moved = [e for k in keys if (e := self._entries.get(k)) is not None and e.slot == slot]
            if moved and self.adapters.able(self._targets(), name):
                self._answered(keys, slot)
                for entry in moved:
                    entry.slot = None
                self._dispatch(moved)
                return
        self._on_error(keys, lambda: AdapterUnavailable(name), slot)

    def _answered(self, keys: list[int], slot: int) -> None:
        """Engine `slot` has run these (caller holds the lock): their tokens leave its load. An input
        moved off it while it stalled may be among them (it was running it): the engine it moved
        to is told to drop it, and counts it until it next answers, as for any cancel."""
        by_slot: dict[int, list[int]] = {}
        for key in keys:
            entry = self._entries.get(key)
            if entry is None or entry.slot not in self._slots:
                continue
            if entry.slot == slot:
                self._slots[slot].answered(entry.tokens, entry.interactive)
            else:
                self._slots[entry.slot].cancel(entry.tokens, entry.interactive)
                by_slot.setdefault(entry.slot, []).append(key)
        for other, dropped in by_slot.items():
            self._slots[other].send((Msg.CANCEL, dropped))

    def _forget(self, requests: list[InFlight]) -> None:
        """Drop every input of these requests (caller holds the lock)."""
        self._drop([key for req in requests for key, _ in req.items])

    def _drop(self, keys: list[int]) -> None:
        """Forget these inputs and tell the engines holding them to skip them (caller holds the lock):
        an engine must not spend time on inputs nobody waits for, nor count as idle while it does."""
        by_slot: dict[int, list[int]] = {}
        for key in keys:
            entry = self._entries.pop(key, None)
            if entry is not None and entry.slot in self._slots:
                self._slots[entry.slot].cancel(entry.tokens, entry.interactive)
                by_slot.setdefault(entry.slot, []).append(key)
        for slot, dropped in by_slot.items():
            self._slots[slot].send((Msg.CANCEL, dropped))

    def _on_lost(self, pipe: EnginePipe) -> None:
        """A dead engine's inputs move to the live ones, once per request; a second loss is a 503."""
        slot = pipe.slot
        with self._lock:
            self.stalls.forget(pipe)
            if self._slots.get(slot) is not pipe:
                return  # stopped on purpose, or already replaced
            del self._slots[slot]
            self.modes.drop(slot)
            orphans = [e for e in self._entries.values() if e.slot == slot]
            given_up = []
            for req in self._requests_of(orphans):
                req.attempts += 1
                if req.attempts > 1:
                    given_up.append(req)
            self._forget(given_up)
            orphans = [e for e in orphans if e.request.attempts <= 1]
            for entry in orphans:
                entry.slot = None
            self._dispatch(orphans)
        self.adapters.lost(slot)
        for req in given_up:
            self._settle(req, EngineUnavailable("engines died twice while running this request"))
        self._events.engine_lost(slot)

    def _settle(self, req: InFlight, result: Outcome | Exception) -> None:
        self._settle_all([(req, result)])

    def _settle_all(self, results: list[tuple[InFlight, Outcome | Exception]]) -> None:
        """One wake-up of the event loop for all the requests a message finished."""

        def settle() -> None:
            for req, result in results:
                if req.future.done():
                    continue
                if isinstance(result, Exception):
                    req.future.set_exception(result)
                else:
                    req.future.set_result(result)

        if results:
            self._loop.call_soon_threadsafe(settle)
