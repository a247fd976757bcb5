"""The restart budget: at most `limit` engine restarts within any sliding window, on an injected clock."""

from __future__ import annotations

from orchestrator.restart_budget import RestartBudget


class FakeClock:
    """A monotonic clock that moves only when the test says so."""

    def __init__(self, now: float = 0.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def spend_at(budget: RestartBudget, clock: FakeClock, *times: float) -> list[bool]:
    """Spend one restart at each of the given times, in order."""
    answers: list[bool] = []
    for t in times:
        clock.now = t
        answers.append(budget.spend())
    return answers


def test_limit_restarts_within_the_window_are_allowed() -> None:
    """Three restarts in quick succession fit a budget of three."""
    clock = FakeClock()
    budget = RestartBudget(limit=3, window_s=60.0, clock=clock)
    assert spend_at(budget, clock, 0.0, 1.0, 2.0) == [True, True, True]


def test_the_restart_after_the_limit_is_refused() -> None:
    """The fourth restart within the window is refused."""
    clock = FakeClock()
    budget = RestartBudget(limit=3, window_s=60.0, clock=clock)
    spend_at(budget, clock, 0.0, 1.0, 2.0)
    assert spend_at(budget, clock, 30.0) == [False]


def test_a_restart_is_allowed_again_once_the_window_slides_past_the_oldest() -> None:
    """When the oldest restart falls out of the window, one more is allowed."""
    clock = FakeClock()
    budget = RestartBudget(limit=3, window_s=60.0, clock=clock)
    spend_at(budget, clock, 0.0, 10.0, 20.0)
    assert spend_at(budget, clock, 60.5) == [True]


def test_the_window_slides_rather_than_resetting() -> None:
    """Only the restarts older than the window expire: the ones at 10 and 20 still count at 60.5."""
    clock = FakeClock()
    budget = RestartBudget(limit=3, window_s=60.0, clock=clock)
    spend_at(budget, clock, 0.0, 10.0, 20.0, 60.5)
    assert spend_at(budget, clock, 61.0) == [False]
    assert spend_at(budget, clock, 70.5) == [True]


def test_a_refused_restart_is_not_counted() -> None:
    """Refusals spend nothing: once the oldest real restart expires, the next one is allowed."""
    clock = FakeClock()
    budget = RestartBudget(limit=2, window_s=60.0, clock=clock)
    spend_at(budget, clock, 0.0, 1.0, 30.0, 31.0, 32.0)
    assert spend_at(budget, clock, 60.5) == [True]


def test_used_counts_the_restarts_spent() -> None:
    """`used` is the number of restarts taken so far within the window."""
    clock = FakeClock()
    budget = RestartBudget(limit=5, window_s=60.0, clock=clock)
    spend_at(budget, clock, 0.0, 1.0)
    assert budget.used == 2


def test_used_counts_only_restarts_within_the_window() -> None:
    """Restarts older than the window no longer count."""
    clock = FakeClock()
    budget = RestartBudget(limit=5, window_s=60.0, clock=clock)
    spend_at(budget, clock, 0.0, 30.0, 50.0)
    clock.now = 85.0
    assert budget.used == 2


def test_used_does_not_spend() -> None:
    """Reading `used` leaves the budget as it was."""
    clock = FakeClock()
    budget = RestartBudget(limit=1, window_s=60.0, clock=clock)
    assert (budget.used, budget.used) == (0, 0)
    assert budget.spend() is True


def test_a_zero_limit_allows_no_restart() -> None:
    """With a limit of 0 the first restart is already refused."""
    clock = FakeClock()
    budget = RestartBudget(limit=0, window_s=60.0, clock=clock)
    assert budget.spend() is False
    assert budget.used == 0
