"""torch threads for an engine that shares the machine with other engines.

Engines that each keep to their share of the cores run faster together than one engine on
all of them: fewer barriers per operator, and a core taken by the HTTP process stalls one
engine's thread instead of every thread of a single engine (two engines served 1.13-1.23x one
on 2 cores, bench.paired). An engine alone at work still uses every core, so one client's
latency keeps it.

"Alone" means no other engine has worked within the last SOLO_AFTER_S, not merely none at this
instant. Under steady load two engines pass each other between groups all the time; one that took
every core in such a gap still held them when the other began its next group, three threads on two
cores, and GNU OpenMP's team then waits at each operator's barrier for a thread the kernel has
parked: that group ran several times slower. bfloat16 at 32 clients (bench.paired): p99 544 ms with
the instant rule, 99 ms with one thread each always, at 1.17x the inputs/s.

An engine is busy from the moment the engine client sends it work (the client marks its slot first):
a request split over idle engines reached the first before the second had read its share, and the
first took every core, three threads on two cores. bench.bursts on 2 cores of an AMD Zen 5, the
engines marking themselves against the client marking them: two 8-input requests at once after 0.5 s
idle, the slower's p50/p90/max 60.9/76.5/105.0 ms against 51.5/64.3/69.1; four 1-input requests
after 0.3 s, 21.1/32.2/41.7 against 19.3/24.8/29.3.

Every core only while they are free. A team of threads waits at each operator's barrier for its
slowest thread, and an engine runs niced: when anything else takes a core (the HTTP process
tokenizing, a neighbour in the container) the parked thread holds the team for a scheduler slice per
operator. On 2 cores of an AMD EPYC Zen 3 beside one busy process, one short input through
multilingual-e5-small took 20-30 ms on one thread and 300-850 ms on two, and all-MiniLM-L6-v2 at
one client served 2 inputs/s (bench.paired --busy 1) — while on a quiet machine two threads answer
one input sooner. So an engine alone still takes every core, and checks afterwards what it got: a
forward whose threads got less than CONTENDED_SHARE of their cores' time, with the recent ones',
found a core taken, and the engine keeps to its share for a back-off that doubles while the cores
stay taken (SOLO_BACKOFF_S up to SOLO_BACKOFF_MAX_S) and ends with the first forward that gets them.

A team its engine left unused for a while is cold: its other threads have gone to sleep, and on a
VM the host may have given their cores away, so the first forward on it waits for them (on 2 cores
of a Zen 5 VM, 9.3 ms of a 12.6 ms forward that took 3.9 ms warm and 7.2 ms on one thread). A cold
forward found waiting so backs off cold forwards alone, as contended ones back off every forward:
warm ones, back to back, still take every core. bench.bursts, one request after 0.3 s idle: p50
12.3-13.7 ms against 17.5-17.7 with cold forwards judged as any other; back to back 6.1 against 6.9.

A team kept awake is not cold. Idle after a forward on every core, an engine runs a tiny region on
its team every KEEP_WARM_EVERY_S for keep_warm_s (WARMPOOL_ENGINE_KEEP_WARM) while it would still be
alone, so its threads spin on instead of sleeping, one core busy meanwhile (the Intel OpenMP of
vLLM's CPU build spins 200 ms after each region). One client pausing 20-200 ms between requests, 2 cores
of an AMD EPYC Zen 4, one server with keep-warm switched on and off in turn: p50 15.0-17.1 ms against
19.1-23.0, back to back 14.0 against 14.5, the machine busy 1.14-1.46 cores against 0.15-0.63; with 2 to 8
clients the engines take turns and nothing changed. Kept while no other engine was at work instead, a team
went on spinning beside a neighbour that had just answered, whose next forward found a third thread on
two cores: two tenants' in-step pairs right after a forward on every core (bench.tenants) had their p99
1.07-1.35x with the noisy third, against 1.03-1.07x with keep-warm off; kept only while alone, 1.01x.

What a forward's threads did not get is the time they waited, runnable, for a core: the kernel's
run-queue delay of each of the process's threads (/proc/self/task/*/schedstat). CPU time against
wall time, the measure where schedstat is not readable, also counts a short forward's Python between
operators and OpenMP's spinning across forwards: on a quiet Zen 5, one in ten 38-token forwards read
below 0.8 and one in fourteen below 0.6, so one client's forwards backed off to one thread again and
again (7.0 ms a request against 5.3 ms with one engine). The run-queue delay read 0 at the median
and 0.4 % at the 90th percentile there, and 26 % per thread beside one busy process.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable, MutableSequence

import torch

from common.wire import BUSY

# An engine takes every core only when every other one has been idle at least this long: longer
# than the gap between two groups under load (a group is tens of ms), short beside a client's pause.
SOLO_AFTER_S = 0.2
# A forward on every core whose threads got less than this share of those cores' time found one
# taken, when the recent forwards' average is below it too (or this one is below CLEARLY_CONTENDED):
# a quiet short forward dips to ~0.73 now and then (its Python between operators, the team asleep),
# one beside a busy process sits at ~0.72 and goes down to ~0.52 (all-MiniLM-L6-v2, 2 cores).
CONTENDED_SHARE = 0.8
CLEARLY_CONTENDED = 0.6
SHARE_WEIGHT = 0.3  # of each forward's share in the average
SOLO_BACKOFF_S = 0.5  # the first back-off after a contended forward; doubled up to the max while it lasts
SOLO_BACKOFF_MAX_S = 8.0
# A team unused this long is cold: libgomp's threads spin ~300,000 times after a region (10-50 ms on a
# Zen 5), then sleep; at 10 ms between forwards the second thread still answered at once here.
COLD_AFTER_S = 0.01
MEASURED_FROM_S = 0.002  # forwards shorter than this tell nothing (clock and scheduling granularity)
# An engine keeping its team warm runs a region this often: within libgomp's spin (see COLD_AFTER_S).
KEEP_WARM_EVERY_S = 0.005
WARM_REGION = 1 << 16  # elements of the keep-warm region's add: past torch's grain (32,768), so every thread runs


class ThreadShare:
    """Marks this engine busy or idle in the shared slots and sizes torch's pool to match. Each slot
    is BUSY or when its engine went idle (CLOCK_MONOTONIC, one clock for every process)."""

    def __init__(
        self, busy: MutableSequence[float], slot: int, shared: int, solo: int, keep_warm_s: float = 0.0
    ) -> None:
        self.busy = busy
        self.slot = slot
        self.shared = shared
        self.solo = solo
        self.current = torch.get_num_threads()
        self.backoff = 0.0  # seconds; 0: every core is tried whenever the engine is alone
        self.share = 1.0  # recent forwards on every core: the share of those cores' time they got (average)
        self.solo_from = 0.0  # monotonic time before which the engine keeps to its share
        self.team_at: float | None = None  # monotonic time the last forward on every core ended (None: none yet)
        self.cold_backoff = 0.0  # as backoff, for forwards on a team unused COLD_AFTER_S
        self.cold_from = 0.0  # monotonic time before which those keep to the share
        # a forward on every core: the wall and CPU clocks, and the threads' run-queue delay, at its start
        self._started: tuple[float, float, float | None] | None = None
        self._cold = False  # that forward's team was unused COLD_AFTER_S
        self._waits = RunQueueDelay()
        # While this engine's compile worker runs, the engine keeps to its share: the worker's slices
        # (nice 19, but runnable) park a team's thread at its barriers. Beside a 1.3 GB model's
        # compile, one client at a time: two threads served 3.6 requests/s on 1.86 cores and the
        # compile was not done after 200 s; one thread 3.8/s on 0.97, and the compile done in 58 s.
        self.compiling = False
        self.keep_warm_s = keep_warm_s  # after a forward on every core, its team kept awake this long while idle
        self.forward_at = 0.0  # monotonic time the last forward on every core ended
        self._warm_in, self._warm_out = torch.zeros(WARM_REGION), torch.empty(WARM_REGION)

    def working(self) -> None:
        """Called before each forward pass: re-read who else is busy."""
        self.busy[self.slot] = BUSY
        now = time.monotonic()
        alone = self._alone(now)
        self._cold = self.team_at is not None and now - self.team_at >= COLD_AFTER_S
        ready = now >= self.solo_from and (not self._cold or now >= self.cold_from)
        wanted = self.solo if alone and ready and not self.compiling else self.shared
        if wanted != self.current:
            torch.set_num_threads(wanted)
            self.current = wanted
            self._waits.forget()  # another team: other threads to read
        solo = wanted > self.shared
        self._started = (time.perf_counter(), time.process_time(), self._waits.seconds()) if solo else None

    def ran(self) -> None:
        """Called after each forward pass: one on every core whose threads did not get them backs off."""
        if self._started is None:
            return
        wall = time.perf_counter() - self._started[0]
        cpu = time.process_time() - self._started[1]
        waited_from, waited = self._started[2], self._waits.seconds()
        self._started = None
        self.team_at = self.forward_at = time.monotonic()
        if wall < MEASURED_FROM_S:
            return
        if waited_from is not None and waited is not None:
            share = 1.0 - (waited - waited_from) / (wall * self.current)
        else:
            share = cpu / (wall * self.current)
        if self._cold:  # waiting for the sleepers' cores says nothing of the next warm forward's
            contended = share < CONTENDED_SHARE
            self.cold_backoff = (
                min(max(2 * self.cold_backoff, SOLO_BACKOFF_S), SOLO_BACKOFF_MAX_S) if contended else 0.0
            )
            self.cold_from = self.team_at + self.cold_backoff
            return
        self.share += SHARE_WEIGHT * (share - self.share)
        if share < CONTENDED_SHARE and (share < CLEARLY_CONTENDED or self.share < CONTENDED_SHARE):
            self.backoff = min(max(2 * self.backoff, SOLO_BACKOFF_S), SOLO_BACKOFF_MAX_S)
            self.solo_from = time.monotonic() + self.backoff
        else:
            self.backoff = 0.0

    def idle_warm(self, poll: Callable[[float], bool]) -> None:
        """Between forwards, until `poll` (the inbox's) finds work: a team that just ran on every core is
        kept awake for keep_warm_s while the others are idle, each region marking this engine's slot as
        just idle (another engine taking every core meanwhile would find three threads on two cores)."""
        while self._keeps_warm() and not poll(KEEP_WARM_EVERY_S):
            torch.add(self._warm_in, 1.0, out=self._warm_out)
            self.team_at = self.busy[self.slot] = time.monotonic()

    def _keeps_warm(self) -> bool:
        """While a forward now would take every core: beside a neighbour that worked within SOLO_AFTER_S
        it would run on the share, and the team's spinning would only take a core from that neighbour."""
        if self.solo < 2 or self.current != self.solo or self.compiling:
            return False
        now = time.monotonic()
        return now - self.forward_at < self.keep_warm_s and self._alone(now)

    def _alone(self, now: float) -> bool:
        """Every other engine idle for SOLO_AFTER_S at least."""
        return all(when != BUSY and now - when >= SOLO_AFTER_S for i, when in enumerate(self.busy) if i != self.slot)

    def idle(self) -> None:
        if self.busy[self.slot] == BUSY:
            self.busy[self.slot] = time.monotonic()

    def wait_quiet(self, timeout: float) -> None:
        """Until no other engine is at work, or `timeout` seconds: a CPU engine that follows the first
        at start-up warms up between the first requests rather than beside them (on 2 cores its
        warm-up beside the first request made that request 2-3x slower)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and any(when == BUSY for i, when in enumerate(self.busy) if i != self.slot):
            time.sleep(0.002)  # a shared flag, not an event: polled, briefly, at most once per start


class RunQueueDelay:
    """The seconds this process's threads have waited, runnable, for a core (schedstat's second
    field, in ns); None where the kernel does not say. The files are kept open (a read is a pread):
    reopened when the threads change."""

    def __init__(self) -> None:
        self._fds: list[int] | None = None

    def seconds(self) -> float | None:
        for _ in range(2):  # a thread gone since the files were opened: open the present ones once
            if self._fds is None:
                self._fds = _open_schedstats()
            try:
                return sum(int(os.pread(fd, 128, 0).split()[1]) for fd in self._fds) / 1e9 if self._fds else None
            except (OSError, ValueError, IndexError):
                self.forget()
        return None

    def forget(self) -> None:
        for fd in self._fds or []:
            with contextlib.suppress(OSError):
                os.close(fd)
        self._fds = None

    def __del__(self) -> None:
        self.forget()  # its files closed with it, not left to the process's end


def _open_schedstats() -> list[int]:
    fds = []
    with contextlib.suppress(OSError):
        for task in os.listdir("/proc/self/task"):
            with contextlib.suppress(OSError):
                fds.append(os.open(f"/proc/self/task/{task}/schedstat", os.O_RDONLY))
    return fds
