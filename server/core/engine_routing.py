"""Which engines an input may go to, and where it queues there. While interactive inputs are about (one
at priority 0 or lower within URGENT_WINDOW_S), one engine of several is kept for them: bulk inputs
(above 0) keep off it. An interactive input then finds an engine with no bulk group running, instead of
waiting for one and sharing the cores with it. The others run bulk work meanwhile, all of them again
once interactive traffic stops. With one engine there is nothing to keep: bulk yields between its
groups (the engine's priority order).

On 2 Zen 5 cores, one interactive client beside a Batch API job (all-MiniLM-L6-v2, compiled): with
every engine taking bulk work p50 17-18 ms, p99 28-30 ms (2.2-2.6x alone), ~7 ms of it waiting for
an engine whatever the bulk groups' size (16 to 64 tokens); with one kept, p50 9.3-9.5 ms, p99
20.5-20.8 ms (1.55x alone), the job's lines/s meanwhile as before.

Tenants (keys that name them): one sending more than its share of the engines' work while others send
theirs (judged with the request's own tokens counted: one big request after a quiet spell counts as a
burst) keeps off the kept engine too, at the priority it asked, except while every other engine holds a
group's worth of tokens (SPILL_TOKENS, anyone's) and the kept one less; and wherever its inputs go they
queue behind the other tenants' of that priority (Tokens.behind, set when they are sent: the engine runs
theirs first, between its groups). On 2 Zen 5 cores, a tenant of
32 clients beside one sending 20 requests/s (bench.busy_tenant), against the tree without either: the
light one's p50/p99 33.4/72.7 ms against 65.9/141.1, the heavy one's inputs/s 309 against 330 (its
groups no longer carry the light one's inputs: those run apart, first). Kept off altogether (no
spilling) the light one's p50 was 13.2 ms but the heavy one served 225 inputs/s; spilling without
queueing behind, 60.2 ms. Smaller groups for inputs behind cost more than they gave (192 tokens: p50
28.8 ms, 310 inputs/s).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterable

from common.wire import Keyed

# As long as an engine keeps bulk groups small after an urgent input (engine.runtime.batching's
# URGENT_WINDOW_S): interactive requests seconds apart still find an engine kept for them.
URGENT_WINDOW_S = 10.0
# A tenant's share of the tokens sent to the engines decays with this half-life: long enough to see a
# rate (requests come tens of milliseconds apart), short enough that a burst over is soon forgotten.
SHARE_HALF_LIFE_S = 1.0
# Over its share: more than this many times an equal share of what the tenants about sent. Tenants at
# equal rates drift around their equal share; only one sending well past the others is kept off.
OVER_SHARE = 1.5
# A tenant with less than this share of the decayed tokens is not about: a request now and then does not
# hold a busy tenant behind for the seconds its tokens take to decay. At 5 %, a tenant of 20 requests/s
# beside one of 32 clients was about only some of the time: its p99 115-130 ms against 69-78 at 1 %.
ABOUT_SHARE = 0.01
# A tenant over its share spills onto the kept engine while every other one holds at least this many
# tokens and the kept one fewer (a group's worth, engine.runtime.batching's GROUP_TOKENS): one that fills
# the machine keeps its throughput; the others, queued before its inputs, wait for the group running.
SPILL_TOKENS = 384
# Below this many decayed tokens a tenant is forgotten.
GONE_TOKENS = 1.0


class TenantShares:
    """Each tenant's tokens sent to the engines, decayed (SHARE_HALF_LIFE_S): who sends more than its share."""

    def __init__(self) -> None:
        self._sent: dict[str, tuple[float, float]] = {}  # tenant -> (decayed tokens, as of when)

    def sent(self, tenant: str, now: float) -> float:
        """`tenant`'s tokens sent, decayed to `now`."""
        tokens, at = self._sent.get(tenant, (0.0, now))
        return tokens * math.exp2((at - now) / SHARE_HALF_LIFE_S)

    def add(self, tenant: str, tokens: int, now: float) -> None:
        self._sent[tenant] = (self.sent(tenant, now) + tokens, now)

    def over(self, tenant: str, now: float) -> bool:
        """Whether `tenant` sent more than OVER_SHARE times an equal share of what the tenants about
        sent (ABOUT_SHARE of it or more), while another is about; those long quiet are forgotten (the
        dict stays bounded)."""
        decayed = {name: self.sent(name, now) for name in self._sent}
        for name, tokens in decayed.items():
            if tokens < GONE_TOKENS:
                del self._sent[name]
        total = sum(decayed.values())
        about = {name: tokens for name, tokens in decayed.items() if tokens >= ABOUT_SHARE * total}
        if len(about) < 2 or tenant not in about:
            return False
        return about[tenant] > OVER_SHARE * sum(about.values()) / len(about)


class EngineRouting:
    def __init__(self) -> None:
        self.urgent_at = -URGENT_WINDOW_S  # when an interactive input was last submitted (monotonic)
        self.shares = TenantShares()

    def saw(self, items: Iterable[Keyed], tenant: str = "") -> None:
        """A request's inputs, submitted by `tenant` ("": none named it)."""
        now = time.monotonic()
        interactive = [tokens for _, tokens in items if tokens.priority <= 0]
        if interactive:
            self.urgent_at = now
            self.shares.add(tenant, sum(len(tokens.input_ids) for tokens in interactive), now)

    def kept_off(self, tenant: str) -> bool:
        """Whether `tenant`'s interactive inputs keep off the kept engine (until they spill) and queue behind
        the others' now: it takes more than its share."""
        return self.shares.over(tenant, time.monotonic())

    def targets(
        self, slots: list[int], priority: int, kept_off: bool = False, load: Callable[[int], int] | None = None
    ) -> list[int]:
        """The engines an input at `priority` may go to (`kept_off`: its tenant's, as kept_off said; `load`:
        each engine's tokens outstanding): all but the lowest slot for bulk work, and for a tenant over its
        share, while interactive inputs are about and there are several; else all. A tenant over its share
        takes the lowest slot too while the others hold SPILL_TOKENS each and it fewer."""
        if (priority <= 0 and not kept_off) or len(slots) < 2 or time.monotonic() - self.urgent_at >= URGENT_WINDOW_S:
            return slots
        kept = min(slots)
        others = [slot for slot in slots if slot != kept]
        if priority <= 0 and load is not None and load(kept) < SPILL_TOKENS <= min(map(load, others)):
            return slots
        return others
