"""Models on demand without a server: the budget's syntax, which models start, which goes first."""

from __future__ import annotations

import pytest

from common.settings import Settings, budget_bytes
from common.startup import StartupState
from orchestrator.ondemand import first_resident, least_recently_used


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("123456", 123456),
        ("800M", 800 * 10**6),
        ("2G", 2 * 10**9),
        ("1.5Gi", 3 * 2**29),
        ("512MiB", 512 * 2**20),
        ("64k", 64_000),
        (" 3 GB ", 3 * 10**9),
        ("80%", 8 * 10**9),
        ("12.5%", 1_250_000_000),
    ],
)
def test_budget_bytes_reads_suffixes_and_shares_of_the_limit(text: str, expected: int) -> None:
    """Powers of 1000 for k/M/G/T, of 1024 with an i, a share of the memory limit with %."""
    assert budget_bytes(text, 10 * 10**9) == expected


@pytest.mark.parametrize("text", ["", "lots", "-1G", "80%%", "1Q", "G"])
def test_budget_bytes_refuses_what_is_not_a_size(text: str) -> None:
    """A budget that is not a size fails the start, naming the variable."""
    with pytest.raises(ValueError, match="WARMPOOL_MEMORY_BUDGET"):
        budget_bytes(text, 10**9)


def test_a_share_needs_a_limit() -> None:
    with pytest.raises(ValueError, match="no memory limit"):
        budget_bytes("50%", None)


def test_the_setting_is_checked_when_read() -> None:
    """WARMPOOL_MEMORY_BUDGET=lots fails validation before anything starts."""
    with pytest.raises(ValueError):
        Settings(memory_budget="lots")  # type: ignore[call-arg]


def models(*entries: str) -> list[Settings]:
    return Settings(models=",".join(entries)).per_model()  # type: ignore[call-arg]


def test_resident_and_keep_alive_are_per_model_options() -> None:
    """`;resident=auto;keep_alive=300` sets them for that model alone; the default is always."""
    a, b = models("a=/m/a;resident=auto;keep_alive=300", "b=/m/b")
    assert (a.resident, a.keep_alive) == ("auto", 300.0)
    assert (b.resident, b.keep_alive) == ("always", None)


def test_resident_auto_needs_another_model() -> None:
    """One model alone is always loaded: auto would leave nothing to serve requests naming none."""
    with pytest.raises(ValueError, match="two or more models"):
        models("a=/m/a;resident=auto")


def test_models_start_in_order_while_they_fit() -> None:
    """auto models in the order listed while they fit beside the always ones; a later smaller one
    that fits still starts; always ones start whatever the budget."""
    listed = models("a=/m/a;resident=auto", "b=/m/b;resident=auto", "c=/m/c;resident=auto", "d=/m/d")
    assert first_resident(listed, [40, 50, 30, 20], 100) == [True, False, True, True]
    assert first_resident(listed, [40, 40, 30, 200], 100) == [False, False, False, True]
    assert first_resident(listed, [40, 40, 30, 20], None) == [True, True, True, True]


def test_the_least_recently_used_goes_first() -> None:
    """Oldest answer first; a model never answered before any answered one; none: None."""
    assert least_recently_used(["a", "b", "c"], {"a": 3.0, "b": 1.0, "c": 2.0}) == "b"
    assert least_recently_used(["a", "b"], {"a": 3.0}) == "b"
    assert least_recently_used([], {"a": 1.0}) is None


def test_an_on_demand_models_failure_is_its_own() -> None:
    """A load on demand that fails fails that model's phases, not the appliance; reset_model starts
    its phases over (skipped, with the reason) and drops it from readiness."""
    state = StartupState(["a", "b"])
    state.on_demand = {"b"}
    state.set_up("a", True)
    state.set_up("b", True)
    state.fail("engine:b", "boom")
    assert not state.failed and state.state("ready:b") == "skipped" and state.state("ready") == "pending"
    state.reset_model("b", "unloaded")
    assert state.state("engine:b") == "skipped" and state.engine_up
    state.fail("engine:a", "boom")
    assert state.failed
