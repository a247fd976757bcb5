"""EngineRouting's tenant shares: who sends more than its share of the engines' work, and which engines
its interactive inputs may take then."""

from __future__ import annotations

import time

from engine.runtime import batching
from server.core import engine_routing
from server.core.engine_routing import ABOUT_SHARE, SHARE_HALF_LIFE_S, SPILL_TOKENS, EngineRouting, TenantShares


def steady(shares: TenantShares, rates: dict[str, int], seconds: float, step: float = 0.05) -> float:
    """Each tenant sends `rates[tenant]` tokens every `step` for `seconds`; the time it ends at."""
    now = 0.0
    while now < seconds:
        for tenant, tokens in rates.items():
            shares.add(tenant, tokens, now)
        now += step
    return now


def test_a_tenant_sending_well_past_the_others_is_over_its_share() -> None:
    shares = TenantShares()
    now = steady(shares, {"search": 20, "rag": 20, "indexer": 160}, seconds=3)
    assert shares.over("indexer", now)
    assert not shares.over("search", now) and not shares.over("rag", now)


def test_tenants_at_one_rate_are_none_over_their_share() -> None:
    shares = TenantShares()
    now = steady(shares, {"search": 20, "rag": 20, "indexer": 20}, seconds=3)
    assert not any(shares.over(tenant, now) for tenant in ("search", "rag", "indexer"))


def test_a_tenant_alone_is_never_over_its_share() -> None:
    shares = TenantShares()
    now = steady(shares, {"indexer": 500}, seconds=3)
    assert not shares.over("indexer", now)


def test_a_tenant_sending_now_and_then_does_not_count_as_about() -> None:
    """A request now and then from another tenant (under ABOUT_SHARE of the tokens) leaves a busy tenant
    alone: it is not kept off an engine for the seconds those tokens take to decay."""
    shares = TenantShares()
    now = steady(shares, {"indexer": 500}, seconds=3)
    shares.add("search", int(ABOUT_SHARE * shares.sent("indexer", now) / 2), now)
    assert not shares.over("indexer", now)


def test_shares_decay_and_a_quiet_tenant_is_forgotten() -> None:
    shares = TenantShares()
    shares.add("search", 100, 0.0)
    assert abs(shares.sent("search", SHARE_HALF_LIFE_S) - 50) < 1e-9
    shares.over("search", 20 * SHARE_HALF_LIFE_S)  # 100 / 2**20 tokens: below GONE_TOKENS
    assert "search" not in shares._sent


def test_an_over_share_tenants_interactive_inputs_keep_off_the_kept_engine() -> None:
    routing = EngineRouting()
    routing.urgent_at = time.monotonic()  # interactive inputs about
    assert routing.targets([0, 1, 2], priority=0, kept_off=True) == [1, 2]
    assert routing.targets([0, 1, 2], priority=0, kept_off=False) == [0, 1, 2]
    assert routing.targets([0], priority=0, kept_off=True) == [0]  # one engine: nothing to keep


def test_an_over_share_tenant_takes_the_kept_engine_while_the_others_hold_a_group_each() -> None:
    """Spill: every other engine at SPILL_TOKENS or more and the kept one below it; else kept off."""
    routing = EngineRouting()
    routing.urgent_at = time.monotonic()
    loads = {0: 0, 1: SPILL_TOKENS, 2: SPILL_TOKENS}
    assert routing.targets([0, 1, 2], priority=0, kept_off=True, load=loads.__getitem__) == [0, 1, 2]
    loads[2] = SPILL_TOKENS - 1  # one other engine still has room
    assert routing.targets([0, 1, 2], priority=0, kept_off=True, load=loads.__getitem__) == [1, 2]
    loads.update({0: SPILL_TOKENS, 2: SPILL_TOKENS})  # the kept engine holds a group already
    assert routing.targets([0, 1, 2], priority=0, kept_off=True, load=loads.__getitem__) == [1, 2]
    assert routing.targets([0, 1, 2], priority=1, load={0: 0, 1: 999, 2: 999}.__getitem__) == [1, 2]  # bulk never


def test_the_routing_windows_match_the_engines() -> None:
    """The server cannot import the engine: its copies of the engines' group size and urgent window are
    checked here."""
    assert SPILL_TOKENS == batching.GROUP_TOKENS
    assert engine_routing.URGENT_WINDOW_S == batching.URGENT_WINDOW_S
