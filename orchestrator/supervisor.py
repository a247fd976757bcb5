"""Engine processes: fork them from the forkserver, watch them, re-fork them within a restart budget.

The forkserver imports the heavy modules in its own process (never on a thread of this one: that
raced with the main thread's imports upstream in vLLM) and stays up for re-forks. The supervisor
knows nothing of HTTP: it reports through the `SupervisorEvents` it is given, and learns of a lost
engine from `engine_lost` (the engine client sees the pipe close first).
"""

from __future__ import annotations

import contextlib
import multiprocessing.process
import queue
import threading
import time
from multiprocessing.connection import Connection
from typing import Any, Protocol

import structlog
from tenacity import Retrying, retry_if_exception_type, wait_exponential

from common.devices import engine_device
from common.procmem import process_memory
from common.settings import Settings
from common.startup import ModelPhases
from common.wire import EngineSpec, Msg
from engine import entry
from orchestrator import forkserver
from orchestrator.forkserver import StartMethod
from orchestrator.pidfd import ProcessRef
from orchestrator.restart_budget import RestartBudget

STOP_GRACE_S = 5.0
# At shutdown an engine gets this long to finish its batch before it is killed: whatever it held
# has been answered 503 already, and the drain must end within WARMPOOL_DRAIN_TIMEOUT + ~2 s.
SHUTDOWN_GRACE_S = 1.0
# How long an engine started after the first waits for the serving engines to be idle before it warms
# up: the first requests after ready get the cores, a steady load delays the second engine this much.
FOLLOWER_QUIET_S = 2.0
# A fork from a running forkserver takes milliseconds; one after a replacement waits for the new
# forkserver's whole preload, which the first fork only waited for the end of (it began at t≈0).
# Past this many times that preload (at least FORK_FLOOR_S) the forkserver is taken to be hung,
# and is killed and replaced.
FORK_LIMIT_FACTOR = 5
FORK_FLOOR_S = 10.0

log = structlog.get_logger("warmpool.supervisor")


class EngineStartError(Exception):
    """An engine died or failed while loading or warming up."""


class EngineDied(EngineStartError):
    """An engine's process ended while starting, without saying why (a crash, a kill)."""


class RestartBudgetSpent(Exception):
    """More restarts within the window than allowed: the appliance should exit and be restarted."""


class SupervisorEvents(Protocol):
    """What the supervisor reports; called on its own threads."""

    def engine_ready(self, slot: int, conn: Connection, warmup: dict[str, Any]) -> None:
        """A (re)started engine is warm (`warmup`: what its READY said): its pipe can take work."""

    def engine_restarted(self, slot: int) -> None: ...

    def engine_compile(self, slot: int, detail: dict[str, Any]) -> None:
        """Engine `slot`'s compiled forward changed state while it started."""

    def gave_up(self, reason: str) -> None:
        """The restart budget is spent; no engine will be started again."""


class EngineSupervisor:
    """`settings.engine_count` engine processes from one forkserver, each restarted on its own when it dies."""

    def __init__(self, settings: Settings, startup: ModelPhases, method: StartMethod, events: SupervisorEvents) -> None:
        self.settings = settings
        self.startup = startup
        self.method = method
        self.events = events
        self.count = settings.engine_count
        # One slot per engine: BUSY while it has work, else when it went idle (common.wire.BUSY).
        # Engines size their torch pools by it.
        self.busy = method.ctx.RawArray("d", self.count)  # type: ignore[attr-defined]
        self.processes: list[multiprocessing.process.BaseProcess | None] = [None] * self.count
        # What kills and waits for engines: their Process objects go blind with the forkserver.
        self.refs: list[ProcessRef | None] = [None] * self.count
        self.budget = RestartBudget(settings.max_restarts, settings.restart_window)
        self._up: set[int] = set()
        self._up_lock = threading.Lock()  # _up and startup.engine_up change together
        self._publish_lock = threading.Lock()  # see _publish
        self.served = False  # an engine of this model has been ready (with every adapter it was given)
        self._forked_at = [0.0] * self.count
        # A re-forked engine gets this long to load and warm up (the first has none: a cold start
        # from a slow volume takes what it takes, and the startup probe bounds it).
        self._start_limit_s: float | None = None
        self._fork_limit_s: float | None = None  # likewise for a fork, once the first has been timed
        self.forkserver_replacements = 0
        self.stalls = 0  # engines killed for answering nothing with work outstanding
        self._stopping = threading.Event()
        self._lost: queue.SimpleQueue[int | None] = queue.SimpleQueue()

    def spec(self, slot: int, follower: bool = False) -> EngineSpec:
        """What engine `slot` starts with; a `follower` (a CPU engine started after the first, at
        start-up) warms up when the engines serving are idle, within FOLLOWER_QUIET_S."""
        cpu = self.settings.resolved_device == "cpu"
        return EngineSpec(
            model_path=self.settings.model_path,
            slot=slot,
            threads=self.settings.shared_engine_threads,
            solo_threads=self.settings.solo_engine_threads,
            max_batch_tokens=self.settings.max_batch_tokens,
            max_batch_size=self.settings.max_batch_size,
            nice=self.settings.engine_nice,
            device=engine_device(self.settings.resolved_device, slot, self.settings.gpus),
            dtype=self.settings.dtype,
            allow_bin_weights=self.settings.allow_bin_weights == "on",
            keep_warm_s=self.settings.engine_keep_warm,
            quiet_wait_s=FOLLOWER_QUIET_S if follower and cpu else 0.0,
            compile=self.settings.compile,
            compile_cache=self.settings.compile_cache,
            compile_timeout_s=self.settings.compile_timeout,
            compile_nice=self.settings.compile_nice,
            adapters=self.settings.adapter_folders,
            adapters_refusable=self.served,  # the set was read whole once: a re-fork serves what it can
        )

    @property
    def pids(self) -> list[int | None]:
        return [p.pid if p else None for p in self.processes]

    def _detail(self) -> dict[str, Any]:
        """The engine phase's detail: `pid` is the first engine's (what single-engine tools read),
        `pids` all of them."""
        return {
            "pid": self.pids[0],
            "pids": self.pids,
            "up": len(self._up),
            "restarts": self.budget.used,
            "stalls": self.stalls,
            "forkserver_replacements": self.forkserver_replacements,
            "memory": self._memory(),
        }

    def _publish(self) -> None:
        """The engine phase's detail as it is now. Read and written under one lock: two engines ready
        at once (a restart beside a follower's start) each publish after their change, and one
        reading before the other's change would otherwise land after it and stay (up 1 of 2)."""
        with self._publish_lock:
            self.startup.update("engine", **self._detail())

    def _memory(self) -> list[dict[str, Any]]:
        """RSS, PSS, shared and private MB of each live engine and of the forkserver they share the
        weights with (common/procmem.py): PSS adds up to what they hold together."""
        pids = [(f"engine {slot}", pid) for slot, pid in enumerate(self.pids) if pid]
        if pids and (server := forkserver.pid(self.method)) is not None:  # not an engine's parent: that
            pids.append(("forkserver", server))  # may be the one replaced (orphans go to init)
        return [{"process": name, "pid": pid, **memory} for name, pid in pids if (memory := process_memory(pid))]

    def start_engines(self) -> dict[str, Any]:
        """The first engine warms up alone, on every core, and makes the server ready; the rest
        follow. Its load report (LOADED's detail) is returned: what the model answers may hang on it.

        Warming all engines side by side made readiness ~0.9 s later on 2 cores (bench.coldstart).
        """
        forking = time.monotonic()
        _, conn = self._fork(0)
        first_fork_s = time.monotonic() - forking
        self.startup.done("forkserver", preload=self.method.preload)
        preload_s = max(first_fork_s, self.startup.duration("forkserver") or 0.0)  # from its start at t≈0
        self._fork_limit_s = max(FORK_FLOOR_S, FORK_LIMIT_FACTOR * preload_s)
        self.startup.start("engine", engines=self.count, **self._detail())
        loaded = self._expect(conn, 0, Msg.LOADED)
        self.startup.done("engine", **{k: v for k, v in loaded.items() if k != "pid"})
        self.startup.start("warmup")
        try:
            warmup = self._expect(conn, 0, Msg.READY)
        except EngineDied as exc:
            if self.settings.compile == "off":
                raise
            # It may have crashed on a cached compiled artifact it loads before READY: the next
            # engine finds the marker it left, sets that artifact aside and starts eager
            # (engine/compiling/artifacts.py). Once: a crash of another cause fails the start as before.
            log.error("engine_died_in_warmup", slot=0, error=str(exc))
            self.startup.update("warmup", first_engine_died=str(exc))
            conn.close()
            _, conn = self._fork(0)
            self._expect(conn, 0, Msg.LOADED)
            warmup = self._expect(conn, 0, Msg.READY)
        self.startup.done("warmup", **{k: v for k, v in warmup.items() if k != "compile"})
        self._start_limit_s = max(60.0, 10 * (float(loaded.get("load_s", 0)) + float(warmup.get("warmup_s", 0))))
        if self.settings.compile == "required":  # a restart may wait on a compile another engine runs
            self._start_limit_s += self.settings.compile_timeout
        self._ready(0, conn, warmup)
        threading.Thread(target=self._supervise, name="engine-supervisor", daemon=True).start()
        threading.Thread(target=self._start_others, name="engine-start-others", daemon=True).start()
        return loaded

    def engine_lost(self, slot: int) -> None:
        """An engine's pipe closed (it died, or was stopped): re-fork it unless stopping."""
        self.busy[slot] = 0.0  # idle since ever: a dead engine holds no core
        with self._up_lock:
            self._up.discard(slot)
            self.startup.engine_up = bool(self._up)
        self._publish()
        if not self._stopping.is_set():
            process = self.processes[slot]
            log.error("engine_lost", slot=slot, pid=process.pid if process else None, up=len(self._up))
            self._lost.put(slot)

    def kill(self, slot: int, reason: str, stalled_s: float) -> None:
        """Kill a hung engine (SIGKILL works on a stopped process too); its pipe closes, its inputs
        move to the other engines and it is replaced like any lost engine. An engine in that slot
        younger than the stall is its replacement already, and is left alone."""
        ref = self.refs[slot]
        if time.monotonic() - self._forked_at[slot] < stalled_s:
            return
        if ref is not None and not ref.exited():
            log.error("engine_killed", slot=slot, pid=ref.pid, reason=reason)
            self.stalls += 1
            self._publish()
            ref.kill()

    def abort(self) -> None:
        """The start failed elsewhere (the model folder, the tokenizer): fork no engine from now on."""
        self._stopping.set()

    def stop(self) -> None:
        """Stop the engines (each finishes its batch) and the forkserver; no process left behind."""
        self.stop_engines()
        # A forkserver that never forked is still importing its preload (a start that failed on the
        # model's folder): nothing in it to wait for, and waiting held the exit ~4 s past the linger.
        preloaded = self.startup.state("forkserver") == "done"
        forkserver.stop(self.method, forkserver.STOP_TIMEOUT_S if preloaded else 0.0)

    def stop_engines(self) -> None:
        """Stop this model's engines alone (each finishes its batch, then is killed past the grace):
        the forkserver stays for the other models, an unloaded one's next load included."""
        self._stopping.set()
        self._lost.put(None)
        deadline = time.monotonic() + SHUTDOWN_GRACE_S
        for ref in self.refs:
            if ref is not None and not ref.exited(max(deadline - time.monotonic(), 0.0)):
                ref.kill()
                ref.exited(STOP_GRACE_S)
        for slot in range(self.count):
            self._release(slot)

    def _release(self, slot: int) -> None:
        """Close what watched engine `slot` once it has exited (its pidfd, its Process object's pipe
        from the forkserver): a supervisor lives as long as its model's load, and an unloaded
        model's descriptors would otherwise stay open until a garbage collection, the pidfd for good."""
        ref, process = self.refs[slot], self.processes[slot]
        if ref is None or not ref.exited():
            return  # it outlived SIGKILL and the grace (uninterruptible sleep): still watched
        ref.close()
        if process is not None:
            process.join(STOP_GRACE_S)  # its exit code, once the forkserver has reaped it
            with contextlib.suppress(ValueError):  # not reaped within the grace: the collector closes it
                process.close()

    def _start_others(self) -> None:
        for slot in range(1, self.count):
            try:
                self._bring_up(slot, follower=True)
            except EngineStartError as exc:
                if self._stopping.is_set():
                    return
                log.error("engine_start_failed", slot=slot, error=str(exc))
                self._lost.put(slot)  # the supervisor retries it within the restart budget

    def _fork(self, slot: int, follower: bool = False) -> tuple[multiprocessing.process.BaseProcess, Connection]:
        if self._stopping.is_set():
            raise EngineStartError("stopping")
        parent, child = self.method.ctx.Pipe(duplex=True)
        process = self.method.ctx.Process(  # type: ignore[attr-defined]
            target=entry.engine_main,
            args=(child, self.spec(slot, follower), self.busy),
            name=f"warmpool-engine-{slot}",
            daemon=True,
        )
        limit, forked = self._fork_limit_s, threading.Event()
        overrun = threading.Timer(limit or 0, self._fork_overran, (slot, limit, forked))
        if limit is not None:
            overrun.start()
        try:
            process.start()  # with forkserver, returns once the server has preloaded and forked
        except (EOFError, OSError) as exc:  # the forkserver died under it (or was replaced)
            parent.close()
            raise EngineStartError(f"the forkserver did not fork engine {slot}: {exc or type(exc).__name__}") from None
        finally:
            forked.set()
            overrun.cancel()
            child.close()
        if (old := self.refs[slot]) is not None:
            old.close()
        self.processes[slot], self.refs[slot] = process, ProcessRef(process.pid)  # type: ignore[arg-type]
        self._forked_at[slot] = time.monotonic()
        return process, parent

    def _fork_overran(self, slot: int, limit: float, forked: threading.Event) -> None:
        """On a timer: a fork past its limit is blocked on a hung forkserver; killing it ends the fork.
        (A fork that returned as the timer fired has set `forked`: Timer.cancel comes too late then.)"""
        if forked.is_set():
            return
        if forkserver.replace(self.method, f"engine {slot} was not forked within {limit:.0f} s"):
            self.forkserver_replacements += 1
            self._publish()

    def _ready(self, slot: int, conn: Connection, warmup: dict[str, Any]) -> None:
        with self._up_lock:  # an engine_lost for this pipe, however early, lands after this
            self.events.engine_ready(slot, conn, warmup)
            self._up.add(slot)
            self.startup.engine_up = True
            self.served = True
        self._publish()
        log.info("engine_ready", slot=slot, pid=self.pids[slot], up=len(self._up))

    def _bring_up(self, slot: int, follower: bool = False) -> None:
        _, conn = self._fork(slot, follower)
        deadline = None if self._start_limit_s is None else time.monotonic() + self._start_limit_s
        self._expect(conn, slot, Msg.LOADED, deadline)
        self._ready(slot, conn, self._expect(conn, slot, Msg.READY, deadline))

    def _expect(self, conn: Connection, slot: int, wanted: str, deadline: float | None = None) -> dict[str, Any]:
        """Engine `slot`'s next start-up message of kind `wanted`; EngineStartError (the process
        killed, so nothing lingers holding memory or a GPU) if it fails, dies or hangs past `deadline`."""
        process, ref = self.processes[slot], self.refs[slot]
        assert process is not None and ref is not None
        try:
            while not self._stopping.is_set():
                if deadline is not None and time.monotonic() > deadline:
                    raise EngineStartError(f"engine did not start within {self._start_limit_s:.0f} s")
                if conn.poll(0.1):
                    try:
                        kind, body = conn.recv()
                    except (EOFError, OSError):  # it died: its exit code tells why
                        process.join(STOP_GRACE_S)
                        raise EngineDied(f"engine exited with code {process.exitcode} while starting") from None
                    if kind == Msg.FAILED:
                        reason, trace = body
                        # The traceback goes to the log; /health/startup (open without a key) gets one line.
                        log.error("engine_start_failed", reason=reason, traceback=trace)
                        process.join(STOP_GRACE_S)
                        raise EngineStartError(reason.splitlines()[0] if reason else "engine failed")
                    if kind == wanted:
                        return dict(body)
                    if kind == Msg.COMPILE:  # WARMPOOL_COMPILE=required: compiling before it is ready
                        self.events.engine_compile(slot, body)
                elif ref.exited():
                    process.join(STOP_GRACE_S)
                    raise EngineDied(f"engine exited with code {process.exitcode} while starting")
            raise EngineStartError("stopping")
        except EngineStartError:
            if not ref.exited():
                ref.kill()
                ref.exited(STOP_GRACE_S)
            raise

    def _supervise(self) -> None:
        while (slot := self._lost.get()) is not None and not self._stopping.is_set():
            self._reap(slot)
            try:
                self._restart(slot)
            except Exception as exc:
                if self._stopping.is_set():
                    return
                reason = (
                    f"engines restarted {self.budget.used} times within "
                    f"{self.settings.restart_window:.0f} s; last error: {exc}"
                )
                self.startup.fail("engine", reason)
                self.events.gave_up(reason)
                return

    def _restart(self, slot: int) -> None:
        """Re-fork one engine; each try spends one restart, with exponential backoff between tries.
        The budget is checked here alone: RestartBudgetSpent is not retried."""
        for attempt in Retrying(
            retry=retry_if_exception_type(EngineStartError),
            wait=wait_exponential(multiplier=0.5, max=10),
            reraise=True,
        ):
            with attempt:
                if self._stopping.is_set():
                    return
                if not self.budget.spend():
                    raise RestartBudgetSpent(f"more than {self.settings.max_restarts} restarts")
                self._bring_up(slot)
                self.events.engine_restarted(slot)

    def _reap(self, slot: int) -> None:
        ref = self.refs[slot]
        if ref is not None and not ref.exited(1.0):
            ref.kill()
