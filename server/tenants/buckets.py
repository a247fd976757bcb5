"""Quotas as token buckets, per tenant: requests per second and concurrency checked at the request's
head, tokens per minute once its tokens are counted (before the engine). Every check runs on the
event loop, so no lock: a refusal is a few arithmetic operations, and no tenant waits on another."""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Callable
from dataclasses import dataclass

from server.tenants.keysfile import Keyring, Quota

Clock = Callable[[], float]
# How long a tenant presses past its quota after a refusal, or after a request let through on a request
# bucket under DRAINED_SHARE full (a burst faster than the quota's rate): the requests it is let
# through meanwhile run as bulk work, behind the other tenants' interactive inputs (TenantPass.demoted).
# Refusals alone come late: a full bucket let a third tenant's ten 8-input requests through at once, at
# the others' priority, and those were the others' slowest requests (bench.tenants --noisy-inputs 8).
PRESSING_WINDOW_S = 2.0
DRAINED_SHARE = 0.8


class TokenBucket:
    """`capacity` units, refilled at `rate` a second; taken whole or not at all."""

    __slots__ = ("capacity", "clock", "level", "rate", "stamp")

    def __init__(self, rate: float, capacity: float, clock: Clock) -> None:
        self.rate = rate
        self.capacity = capacity
        self.clock = clock
        self.level = capacity
        self.stamp = clock()

    def _refill(self) -> None:
        now = self.clock()
        self.level = min(self.capacity, self.level + (now - self.stamp) * self.rate)
        self.stamp = now

    def take(self, amount: float) -> float:
        """0.0 when taken; else the seconds until `amount` would be there (inf: more than it holds)."""
        self._refill()
        if amount <= self.level:
            self.level -= amount
            return 0.0
        if amount > self.capacity:
            return math.inf
        return (amount - self.level) / self.rate

    def share(self) -> float:
        """How full the bucket is now, 0-1."""
        self._refill()
        return self.level / self.capacity

    def remaining(self) -> int:
        return int(self.level)

    def until_full(self) -> float:
        return (self.capacity - self.level) / self.rate


@dataclass(frozen=True)
class Refusal:
    """Why a request is over its tenant's quota, with the 429's headers."""

    reason: str  # requests, tokens, concurrent: the rejections metric's label
    message: str
    headers: dict[str, str]
    never: bool = False  # more than the bucket holds: no wait lets it through


class TenantLimits:
    """One tenant's buckets and its requests in flight."""

    def __init__(self, quota: Quota, clock: Clock = time.monotonic) -> None:
        self.quota = quota
        self.clock = clock
        self.pressed_at = -math.inf  # the last refusal (a batch line waiting is none) or drained bucket
        rps, tpm = quota.requests_per_second, quota.tokens_per_minute
        # a second's requests as burst (at least one); a minute's tokens
        self.requests = TokenBucket(rps, max(rps, 1.0), clock) if rps else None
        self.tokens = TokenBucket(tpm / 60.0, float(tpm), clock) if tpm else None
        daily = quota.batch_tokens_per_day  # a day's tokens, refilled evenly: a job runs at its daily rate
        self.batch_tokens = TokenBucket(daily / 86400.0, float(daily), clock) if daily else None
        self.in_flight = 0

    def admit(self) -> Refusal | None:
        """At the request's head: one request in flight more, or why not."""
        limit = self.quota.concurrent
        if limit is not None and self.in_flight >= limit:
            self._press()
            return self._refusal("concurrent", f"{limit} requests of this key's tenant are in flight already", 1.0)
        if self.requests is not None:
            if self.requests.share() < DRAINED_SHARE:  # a burst: taking its second's requests in less
                self._press()
            wait = self.requests.take(1)
            if wait:
                self._press()
                return self._refusal("requests", f"over {self.requests.rate:g} requests per second", wait)
        self.in_flight += 1
        return None

    def release(self) -> None:
        self.in_flight -= 1

    def _press(self) -> None:
        self.pressed_at = self.clock()

    def pressing(self) -> bool:
        """Refused for its quota, or let through on a drained request bucket, within PRESSING_WINDOW_S: the
        tenant sends faster than its quota refills."""
        return self.clock() - self.pressed_at < PRESSING_WINDOW_S

    def charge(self, tokens: int, batch: bool = False) -> Refusal | None:
        """Once its tokens are counted: the request's tokens taken, or why not. A batch job's line
        takes them from batch_tokens_per_day where the tenant has one."""
        if batch and self.batch_tokens is not None:
            bucket, limit, per, reason = self.batch_tokens, self.quota.batch_tokens_per_day, "day", "batch_tokens"
        elif self.tokens is not None:
            bucket, limit, per, reason = self.tokens, self.quota.tokens_per_minute, "minute", "tokens"
        else:
            return None
        wait = bucket.take(tokens)
        if not wait:
            return None
        if reason == "tokens":
            self._press()
        if math.isinf(wait):
            refusal = self._refusal(reason, f"this request's {tokens} tokens exceed {limit} tokens per {per}", 60.0)
            return dataclasses.replace(refusal, never=True)
        return self._refusal(reason, f"{tokens} tokens would exceed {limit} tokens per {per}", wait)

    def _refusal(self, reason: str, message: str, wait: float) -> Refusal:
        headers = {"retry-after": str(max(1, math.ceil(wait)))}
        for name, bucket in (("requests", self.requests), ("tokens", self.tokens)):
            if bucket is not None:
                bucket._refill()
                headers[f"x-ratelimit-limit-{name}"] = f"{bucket.capacity:g}"
                headers[f"x-ratelimit-remaining-{name}"] = str(bucket.remaining())
                headers[f"x-ratelimit-reset-{name}"] = duration(bucket.until_full())
        return Refusal(reason, f"rate limit reached: {message}", headers)


def duration(seconds: float) -> str:
    """OpenAI's reset format: 250ms, 1.5s, 2m30s."""
    if seconds < 1:
        return f"{math.ceil(seconds * 1000)}ms"
    minutes, rest = divmod(seconds, 60)
    return f"{int(minutes)}m{rest:.0f}s" if minutes else f"{rest:.3g}s"


class LimitsTable:
    """Each tenant's limits; a reload keeps the buckets (and in-flight counts) of tenants whose quota
    did not change, so a reload neither refills nor forgets them."""

    def __init__(self, clock: Clock = time.monotonic) -> None:
        self.clock = clock
        self.by_tenant: dict[str, TenantLimits] = {}

    def update(self, ring: Keyring) -> None:
        kept = {n: lim for n, lim in self.by_tenant.items() if n in ring.tenants and lim.quota == ring.tenants[n].quota}
        self.by_tenant = {n: kept.get(n) or TenantLimits(t.quota, self.clock) for n, t in ring.tenants.items()}

    def __getitem__(self, tenant: str) -> TenantLimits:
        return self.by_tenant[tenant]
