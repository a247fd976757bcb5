"""ThreadShare (engine/runtime/threads.py): torch threads by who else is busy, and a later engine's warm-up
waiting for the serving engines to be idle."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Iterator

import pytest
import torch

from engine.runtime import threads as threads_module
from engine.runtime.threads import (
    BUSY,
    COLD_AFTER_S,
    KEEP_WARM_EVERY_S,
    SOLO_AFTER_S,
    SOLO_BACKOFF_S,
    RunQueueDelay,
    ThreadShare,
)


@pytest.fixture(autouse=True)
def torch_threads_kept() -> Iterator[None]:
    """Each test may resize torch's pool (ThreadShare does): it is put back after."""
    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)


def test_working_alone_takes_the_solo_threads_and_beside_another_the_shared() -> None:
    """An engine that is the only busy one uses its solo thread count; with another busy, its share."""
    busy = [0.0, 0.0]
    share = ThreadShare(busy, slot=1, shared=1, solo=2)
    share.working()
    assert torch.get_num_threads() == 2 and busy == [0.0, BUSY]
    share.idle()
    busy[0] = BUSY
    share.working()
    assert torch.get_num_threads() == 1


def test_an_engine_keeps_to_its_share_while_its_compile_runs() -> None:
    """Alone, but with its compile worker running: the shared count; the compile done: solo again."""
    share = ThreadShare([0.0, 0.0], slot=1, shared=1, solo=2)
    share.compiling = True
    share.working()
    assert torch.get_num_threads() == 1
    share.idle()
    share.compiling = False
    share.working()
    assert torch.get_num_threads() == 2


def test_an_engine_idle_for_less_than_the_solo_wait_still_counts_as_working() -> None:
    """Another engine that went idle just now keeps this one at its share (under load engines pass
    each other between groups); once it has been idle SOLO_AFTER_S, this one takes every core."""
    busy = [time.monotonic(), 0.0]
    share = ThreadShare(busy, slot=1, shared=1, solo=2)
    share.working()
    assert torch.get_num_threads() == 1
    share.idle()
    busy[0] = time.monotonic() - SOLO_AFTER_S
    share.working()
    assert torch.get_num_threads() == 2


def _forward(
    share: ThreadShare, monkeypatch: pytest.MonkeyPatch, wall: float, cpu: float, waited: float | None = None
) -> None:
    """working(), a forward that took `wall` seconds and `cpu` seconds of the process's CPU, its threads
    `waited` seconds for a core between them (None: the kernel does not say), ran()."""
    clocks: dict[str, float] = {"perf_counter": 100.0, "process_time": 50.0, "waited": 7.0}
    monkeypatch.setattr(threads_module.time, "perf_counter", lambda: clocks["perf_counter"])
    monkeypatch.setattr(threads_module.time, "process_time", lambda: clocks["process_time"])
    monkeypatch.setattr(share._waits, "seconds", lambda: None if waited is None else clocks["waited"])
    share.working()
    clocks["perf_counter"] += wall
    clocks["process_time"] += cpu
    clocks["waited"] += waited or 0.0
    share.ran()
    monkeypatch.undo()


def test_a_forward_on_every_core_that_did_not_get_them_keeps_the_engine_to_its_share(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Two threads that got one core's time between them (a core taken): the next forwards run on the
    shared count for the back-off, which doubles while the cores stay taken."""
    share = ThreadShare([0.0, 0.0], slot=0, shared=1, solo=2)
    _forward(share, monkeypatch, wall=0.1, cpu=0.1)
    assert share.backoff == SOLO_BACKOFF_S and share.solo_from > time.monotonic()
    share.working()
    assert torch.get_num_threads() == 1
    share.solo_from = 0.0  # the back-off over
    _forward(share, monkeypatch, wall=0.1, cpu=0.1)
    assert share.backoff == 2 * SOLO_BACKOFF_S


def test_one_dip_among_quiet_forwards_does_not_back_off(monkeypatch: pytest.MonkeyPatch) -> None:
    """A forward a little under the share (a short one's gaps) after quiet ones: no back-off; the same
    share forward after forward brings the average down and backs off."""
    share = ThreadShare([0.0, 0.0], slot=0, shared=1, solo=2)
    _forward(share, monkeypatch, wall=0.1, cpu=0.14)
    assert share.backoff == 0.0
    for _ in range(5):
        _forward(share, monkeypatch, wall=0.1, cpu=0.14)
        share.solo_from = 0.0  # each judged alone, as if its back-off were over
    assert share.backoff > 0.0


def test_a_forward_that_got_every_core_ends_the_back_off(monkeypatch: pytest.MonkeyPatch) -> None:
    """Two threads busy the whole forward: the engine goes on taking every core when alone."""
    share = ThreadShare([0.0, 0.0], slot=0, shared=1, solo=2)
    share.backoff = 4.0
    _forward(share, monkeypatch, wall=0.1, cpu=0.19)
    assert share.backoff == 0.0 and share.solo_from <= time.monotonic()
    share.working()
    assert torch.get_num_threads() == 2


def test_threads_that_waited_for_a_core_back_off_whatever_their_cpu_time(monkeypatch: pytest.MonkeyPatch) -> None:
    """Where the kernel says how long the threads waited, runnable, that is what they did not get: a
    forward whose two threads waited half the wall time between them backs off, however much CPU
    time the process counted (OpenMP's spinning counts as CPU)."""
    share = ThreadShare([0.0, 0.0], slot=0, shared=1, solo=2)
    _forward(share, monkeypatch, wall=0.1, cpu=0.2, waited=0.1)
    assert share.backoff == SOLO_BACKOFF_S


def test_threads_that_never_waited_keep_every_core_whatever_their_cpu_time(monkeypatch: pytest.MonkeyPatch) -> None:
    """A short forward's CPU time dips (its Python between operators, the team asleep); its threads never
    waited for a core: forward after forward, no back-off."""
    share = ThreadShare([0.0, 0.0], slot=0, shared=1, solo=2)
    for _ in range(6):
        _forward(share, monkeypatch, wall=0.01, cpu=0.01, waited=0.0)
    assert share.backoff == 0.0


def test_a_cold_team_that_waited_for_its_cores_backs_off_cold_forwards_only(monkeypatch: pytest.MonkeyPatch) -> None:
    """A forward on a team unused COLD_AFTER_S whose threads waited half the time (the sleepers' cores
    woken late): forwards after another pause keep to the share, one right after takes every core."""
    share = ThreadShare([0.0, 0.0], slot=0, shared=1, solo=2)
    share.team_at = time.monotonic() - 1.0
    _forward(share, monkeypatch, wall=0.01, cpu=0.01, waited=0.01)
    assert share.cold_backoff == SOLO_BACKOFF_S and share.backoff == 0.0
    share.working()  # the team just ran: warm
    assert torch.get_num_threads() == 2
    share.team_at = time.monotonic() - COLD_AFTER_S
    share.working()
    assert torch.get_num_threads() == 1


def test_a_cold_team_that_got_its_cores_ends_the_cold_back_off(monkeypatch: pytest.MonkeyPatch) -> None:
    share = ThreadShare([0.0, 0.0], slot=0, shared=1, solo=2)
    share.team_at, share.cold_backoff = time.monotonic() - 1.0, 4.0
    _forward(share, monkeypatch, wall=0.01, cpu=0.02, waited=0.0)
    assert share.cold_backoff == 0.0 and share.cold_from <= time.monotonic()


def test_the_run_queue_delay_is_read_from_the_kernel() -> None:
    """On Linux the threads' run-queue delay is there to read, in seconds, and never goes back."""
    delay = RunQueueDelay()
    first = delay.seconds()
    assert first is not None and first >= 0.0
    second = delay.seconds()
    assert second is not None and second >= first
    delay.forget()


def test_a_run_queue_reader_let_go_closes_its_files() -> None:
    """Each engine keeps its threads' schedstat files open while it reads them; a reader dropped (an
    engine's ThreadShare gone) leaves no descriptor behind."""
    delay = RunQueueDelay()
    assert delay.seconds() is not None
    opened = {fd: os.readlink(f"/proc/self/fd/{fd}") for fd in delay._fds or []}
    assert opened and all(path.endswith("/schedstat") for path in opened.values())
    del delay
    assert not [fd for fd, path in opened.items() if _link(fd) == path]


def _link(fd: int) -> str | None:
    try:
        return os.readlink(f"/proc/self/fd/{fd}")
    except OSError:
        return None


def test_a_forward_on_the_shared_count_is_not_judged(monkeypatch: pytest.MonkeyPatch) -> None:
    """Beside a busy engine a forward runs on its share: however little CPU it got, no back-off."""
    share = ThreadShare([BUSY, 0.0], slot=1, shared=1, solo=2)
    _forward(share, monkeypatch, wall=0.1, cpu=0.0)
    assert share.backoff == 0.0


def test_idle_records_when_the_engine_stopped_working() -> None:
    """idle() after work stores the time it went idle; a second idle() keeps that time."""
    busy = [0.0, 0.0]
    share = ThreadShare(busy, slot=0, shared=1, solo=1)
    share.working()
    before = time.monotonic()
    share.idle()
    went_idle = busy[0]
    assert before <= went_idle <= time.monotonic()
    share.idle()
    assert busy[0] == went_idle


def test_wait_quiet_returns_once_the_other_engines_are_idle() -> None:
    """wait_quiet blocks while another engine is busy and returns when it goes idle, before its
    timeout."""
    busy = [BUSY, 0.0]
    share = ThreadShare(busy, slot=1, shared=1, solo=1)
    order: list[str] = []
    waiting = threading.Thread(target=lambda: (share.wait_quiet(60), order.append("warm-up")))
    waiting.start()
    waiting.join(0.05)
    assert waiting.is_alive() and order == []
    order.append("first engine idle")
    busy[0] = time.monotonic()
    waiting.join(10)
    assert order == ["first engine idle", "warm-up"]


def test_wait_quiet_gives_up_at_its_timeout_under_steady_work() -> None:
    """Under steady work elsewhere wait_quiet waits out its timeout, then returns."""
    busy = [BUSY, 0.0]
    started = time.monotonic()
    ThreadShare(busy, slot=1, shared=1, solo=1).wait_quiet(0.05)
    assert time.monotonic() - started >= 0.05 and busy == [BUSY, 0.0]


def test_wait_quiet_ignores_its_own_flag() -> None:
    """An engine busy itself, with every other idle, does not wait for itself."""
    share = ThreadShare([0.0, BUSY], slot=1, shared=1, solo=1)
    waiting = threading.Thread(target=share.wait_quiet, args=(600,))
    waiting.start()
    waiting.join(30)
    assert not waiting.is_alive()


def test_only_cpu_engines_that_follow_the_first_wait_for_idle(model_dir, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """The supervisor asks engines started after the first, at start-up on the CPU, to wait for the
    serving engines to be idle before warming up; the first engine, a re-forked one and GPU engines
    warm up at once."""
    import multiprocessing

    from common.settings import Settings
    from orchestrator.forkserver import StartMethod
    from orchestrator.supervisor import FOLLOWER_QUIET_S, EngineSupervisor

    def supervisor(device: str) -> EngineSupervisor:
        monkeypatch.setattr(Settings, "resolved_device", property(lambda self: device))
        method = StartMethod(multiprocessing.get_context("fork"))
        return EngineSupervisor(Settings(model=str(model_dir), engines=2), None, method, None)  # type: ignore[arg-type]

    cpu = supervisor("cpu")
    assert cpu.spec(1, follower=True).quiet_wait_s == FOLLOWER_QUIET_S > 0
    assert cpu.spec(0).quiet_wait_s == cpu.spec(1).quiet_wait_s == 0
    assert supervisor("cuda:0").spec(1, follower=True).quiet_wait_s == 0


def _kept_warm(keep_warm_s: float, monkeypatch: pytest.MonkeyPatch, busy: list[float] | None = None) -> ThreadShare:
    """An engine idle right after a forward on every core, as serve_batches leaves it before idle_warm."""
    share = ThreadShare(busy if busy is not None else [0.0, 0.0], slot=0, shared=1, solo=2, keep_warm_s=keep_warm_s)
    _forward(share, monkeypatch, wall=0.01, cpu=0.02, waited=0.0)
    share.idle()
    return share


def _polls(answers: Callable[[int], bool]) -> tuple[list[float], Callable[[float], bool]]:
    """A stand-in for the inbox's poll: the timeouts it was called with, and its answer to the n-th call
    (a loop polling past MAX_POLLS fails instead of hanging)."""
    calls: list[float] = []

    def poll(timeout: float) -> bool:
        calls.append(timeout)
        assert len(calls) < MAX_POLLS, "idle_warm never stopped"
        return answers(len(calls))

    return calls, poll


MAX_POLLS = 10_000


def test_a_team_that_just_ran_on_every_core_is_kept_awake_until_work_comes(monkeypatch: pytest.MonkeyPatch) -> None:
    """Idle after a forward on every core: one region every KEEP_WARM_EVERY_S, each marking the team used
    and the slot just idle, until the inbox has work."""
    busy = [0.0, 0.0]
    share = _kept_warm(60.0, monkeypatch, busy)
    before = time.monotonic()
    calls, poll = _polls(lambda n: n == 3)
    share.idle_warm(poll)
    assert calls == [KEEP_WARM_EVERY_S] * 3
    assert share.team_at is not None and share.team_at >= before and busy[0] >= before


def test_the_team_is_let_sleep_once_the_keep_warm_time_has_passed(monkeypatch: pytest.MonkeyPatch) -> None:
    share = _kept_warm(0.05, monkeypatch)
    calls, poll = _polls(lambda n: False)
    share.idle_warm(poll)
    assert calls and time.monotonic() - share.forward_at >= 0.05


def test_another_engine_at_work_ends_the_keep_warm(monkeypatch: pytest.MonkeyPatch) -> None:
    """A neighbour that starts a forward gets the cores: the regions stop at the next look."""
    busy = [0.0, 0.0]
    share = _kept_warm(60.0, monkeypatch, busy)

    def neighbour_starts(n: int) -> bool:
        busy[1] = BUSY
        return False

    calls, poll = _polls(neighbour_starts)
    share.idle_warm(poll)
    assert len(calls) == 1


def test_a_neighbour_that_worked_within_the_solo_wait_ends_the_keep_warm(monkeypatch: pytest.MonkeyPatch) -> None:
    """A forward now would run on the share beside an engine that has just worked: the team is let sleep
    rather than spin beside that engine's next forward."""
    busy = [0.0, 0.0]
    share = _kept_warm(60.0, monkeypatch, busy)

    def neighbour_answers(n: int) -> bool:
        busy[1] = time.monotonic()  # it went idle just now
        return False

    calls, poll = _polls(neighbour_answers)
    share.idle_warm(poll)
    assert len(calls) == 1


@pytest.mark.parametrize("case", ["keep_warm off", "last forward on the share", "one thread"])
def test_a_team_not_to_keep_warm_is_not_polled_for(case: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """With keep-warm off, after a forward beside a busy neighbour (one thread), or with one solo thread,
    idle_warm returns at once: the engine waits on its pipe as before."""
    if case == "keep_warm off":
        share = _kept_warm(0.0, monkeypatch)
    else:
        solo = 1 if case == "one thread" else 2
        share = ThreadShare([0.0, BUSY], slot=0, shared=1, solo=solo, keep_warm_s=60.0)
        _forward(share, monkeypatch, wall=0.01, cpu=0.01, waited=0.0)
        share.idle()
    calls, poll = _polls(lambda n: True)
    share.idle_warm(poll)
    assert calls == []


def test_a_team_kept_awake_is_not_cold(monkeypatch: pytest.MonkeyPatch) -> None:
    """Cold forwards backed off to the share: a forward after a pause spent keeping the team awake takes
    every core all the same."""
    share = _kept_warm(60.0, monkeypatch)
    share.cold_from = time.monotonic() + 60.0  # cold forwards keep to the share for a minute
    share.team_at = time.monotonic() - 1.0  # as if the pause had begun long ago
    calls, poll = _polls(lambda n: n == 2)
    share.idle_warm(poll)
    share.working()
    assert len(calls) == 2 and torch.get_num_threads() == 2


def test_engines_keep_their_teams_awake_as_the_setting_says(model_dir, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """WARMPOOL_ENGINE_KEEP_WARM reaches every engine's spec; 0.2 s unless set."""
    import multiprocessing

    from common.settings import Settings
    from orchestrator.forkserver import StartMethod
    from orchestrator.supervisor import EngineSupervisor

    method = StartMethod(multiprocessing.get_context("fork"))
    for given, expected in (({}, 0.2), ({"engine_keep_warm": 0.0}, 0.0)):
        settings = Settings(model=str(model_dir), engines=2, **given)
        assert EngineSupervisor(settings, None, method, None).spec(1).keep_warm_s == expected  # type: ignore[arg-type]
