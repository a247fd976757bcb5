"""The keys file (WARMPOOL_API_KEYS_FILE): parsing and hashing, quotas as token buckets on a fake
clock, and reloading on change (a Kubernetes Secret's symlink swap included)."""

from __future__ import annotations

import asyncio
import hashlib
import json
import math
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from server.http.metrics import Metrics
from server.tenants.buckets import PRESSING_WINDOW_S, LimitsTable, TenantLimits, TokenBucket, duration
from server.tenants.guard import TenantPass
from server.tenants.keysfile import KeysFileError, Quota, keyring, parse
from server.tenants.watcher import KeysWatcher

HASHED = "sha256:" + hashlib.sha256(b"hashed-key").hexdigest()
WAIT_S = 10.0


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def tenants(**entries: dict[str, Any]) -> dict[str, Any]:
    return {"tenants": entries}


def search(**changes: Any) -> dict[str, Any]:
    entry: dict[str, Any] = {"keys": [HASHED], "scopes": ["inference"], "models": ["*"]}
    return {**entry, **changes}


def test_the_documented_shape_loads() -> None:
    quota = {"requests_per_second": 5, "tokens_per_minute": 100000, "concurrent": 4}
    ring = keyring(tenants(search=search(quota=quota)))
    tenant = ring.tenants["search"]
    assert tenant.scopes == {"inference"} and tenant.models is None
    assert tenant.quota == Quota(5.0, 100000, 4)
    assert ring.tenant_for(b"hashed-key") is tenant


def test_a_plain_key_is_kept_only_as_its_digest() -> None:
    ring = keyring(tenants(search=search(keys=["plain-secret"])))
    assert ring.tenant_for(b"plain-secret") is ring.tenants["search"]
    assert b"plain-secret" not in repr(ring).encode() and list(ring.by_digest) == [
        hashlib.sha256(b"plain-secret").digest()
    ]


def test_a_model_list_limits_the_tenant() -> None:
    ring = keyring(tenants(search=search(models=["e5", "my-adapter"])))
    assert ring.tenants["search"].models == {"e5", "my-adapter"}


@pytest.mark.parametrize(
    ("quota", "words"),
    [
        ({"tokens_per_day": 10}, "not enforced"),
        ({"requests_per_second": 0}, "positive number"),
        ({"concurrent": 1.5}, "positive integer"),
        ({"tokens_per_minute": True}, "positive integer"),
    ],
)
def test_a_quota_field_not_enforced_or_invalid_is_refused(quota: dict[str, Any], words: str) -> None:
    with pytest.raises(KeysFileError, match=words):
        keyring(tenants(search=search(quota=quota)))


@pytest.mark.parametrize(
    ("entry", "words"),
    [
        (search(scopes=["inference", "root"]), "scopes must be some of"),
        (search(keys=[]), "at least one key"),
        (search(keys=["sha256:abc"]), "64 hex"),
        (search(keys=["key\n"]), "whitespace"),
        (search(rate=1), "unknown field"),
    ],
)
def test_a_bad_tenant_is_refused_with_its_name(entry: dict[str, Any], words: str) -> None:
    with pytest.raises(KeysFileError, match=f"tenant 'search'.*{words}"):
        keyring(tenants(search=entry))


def test_a_key_shared_by_two_tenants_is_refused() -> None:
    with pytest.raises(KeysFileError, match="'a' and 'b' share a key"):
        keyring(tenants(a=search(keys=["k"]), b=search(keys=["sha256:" + hashlib.sha256(b"k").hexdigest()])))


def test_the_single_key_joins_as_tenant_default_with_every_scope() -> None:
    ring = keyring(tenants(search=search()), single_key="solo")
    default = ring.tenant_for(b"solo")
    assert default is not None and default.name == "default"
    assert default.scopes == {"inference", "admin", "metrics"} and default.models is None
    assert not ring.metrics_open  # a keys file closes /metrics


def test_a_parse_error_does_not_quote_the_file(tmp_path: Path) -> None:
    """A YAML parser's message can quote the line a key is on: only the place is said."""
    with pytest.raises(KeysFileError) as raised:
        parse(b"tenants:\n  a: {keys: [top-secret-key, : ]", tmp_path / "keys.yaml")
    assert "top-secret" not in str(raised.value) and "line" in str(raised.value)


def test_yaml_and_json_files_load(tmp_path: Path) -> None:
    yaml_ring = parse(b"tenants:\n  a:\n    keys: [k1]\n    scopes: [admin]\n", tmp_path / "keys.yaml")
    json_ring = parse(json.dumps(tenants(a=search(keys=["k1"]))).encode(), tmp_path / "keys.json")
    assert yaml_ring.tenant_for(b"k1") is not None and json_ring.tenant_for(b"k1") is not None


def test_a_bucket_refuses_past_its_capacity_and_says_when() -> None:
    clock = FakeClock()
    bucket = TokenBucket(rate=2.0, capacity=2.0, clock=clock)
    assert bucket.take(1) == 0.0 and bucket.take(1) == 0.0
    assert bucket.take(1) == pytest.approx(0.5)


def test_a_bucket_refills_with_time() -> None:
    clock = FakeClock()
    bucket = TokenBucket(rate=2.0, capacity=2.0, clock=clock)
    bucket.take(2)
    clock.now += 0.5
    assert bucket.take(1) == 0.0


def test_more_than_a_bucket_holds_never_fits() -> None:
    bucket = TokenBucket(rate=1.0, capacity=10.0, clock=FakeClock())
    assert math.isinf(bucket.take(11))


def test_requests_over_the_rate_are_refused_with_openai_headers() -> None:
    clock = FakeClock()
    limits = TenantLimits(Quota(requests_per_second=1, tokens_per_minute=600), clock)
    assert limits.admit() is None
    limits.release()
    refusal = limits.admit()
    assert refusal is not None and refusal.reason == "requests"
    assert refusal.headers["retry-after"] == "1"
    assert refusal.headers["x-ratelimit-limit-requests"] == "1"
    assert refusal.headers["x-ratelimit-remaining-requests"] == "0"
    assert refusal.headers["x-ratelimit-reset-requests"] == "1s"
    assert refusal.headers["x-ratelimit-limit-tokens"] == "600"


def test_concurrency_counts_requests_in_flight() -> None:
    limits = TenantLimits(Quota(concurrent=1), FakeClock())
    assert limits.admit() is None
    refused = limits.admit()
    assert refused is not None and refused.reason == "concurrent"
    limits.release()
    assert limits.admit() is None


def test_tokens_are_charged_per_minute() -> None:
    clock = FakeClock()
    limits = TenantLimits(Quota(tokens_per_minute=60), clock)
    assert limits.charge(50) is None
    refusal = limits.charge(20)
    assert refusal is not None and refusal.reason == "tokens" and refusal.headers["retry-after"] == "10"
    clock.now += 10
    assert limits.charge(20) is None


def test_a_tenant_refused_for_its_quota_presses_past_it_for_a_while() -> None:
    clock = FakeClock()
    limits = TenantLimits(Quota(requests_per_second=1), clock)
    assert limits.admit() is None and not limits.pressing()
    assert limits.admit() is not None
    clock.now += PRESSING_WINDOW_S / 2
    assert limits.pressing()
    clock.now += PRESSING_WINDOW_S
    assert not limits.pressing()


def test_only_a_pressing_tenants_requests_are_demoted_and_counted() -> None:
    metrics = Metrics(dict)
    limits = TenantLimits(Quota(requests_per_second=1), FakeClock())
    granted = TenantPass("noisy", None, limits)
    assert limits.admit() is None and not granted.demoted(metrics)
    assert limits.admit() is not None and granted.demoted(metrics)
    assert metrics.tenant_demoted.labels(tenant="noisy")._value.get() == 1
    assert not TenantPass("noisy", None, limits, batch=True).demoted(metrics)  # its job's lines: bulk already


def test_a_burst_faster_than_the_quota_refills_presses_before_any_refusal() -> None:
    """Ten requests a second: one every tenth of a second keeps the bucket full; four at once leave the
    fourth taken from a bucket under 80 % full."""
    clock = FakeClock()
    limits = TenantLimits(Quota(requests_per_second=10), clock)
    for _ in range(20):
        assert limits.admit() is None and not limits.pressing()
        clock.now += 0.1
    for _ in range(3):
        assert limits.admit() is None and not limits.pressing()
    assert limits.admit() is None and limits.pressing()


def test_a_batch_line_waiting_for_its_daily_tokens_does_not_press() -> None:
    """A job's lines waiting for batch_tokens_per_day are the job's pace, not its tenant pushing."""
    limits = TenantLimits(Quota(tokens_per_minute=600, batch_tokens_per_day=100), FakeClock())
    assert limits.charge(90, batch=True) is None
    assert limits.charge(20, batch=True) is not None
    assert not limits.pressing()
    assert limits.charge(601) is not None
    assert limits.pressing()


def test_a_request_over_a_whole_minutes_tokens_is_refused() -> None:
    refusal = TenantLimits(Quota(tokens_per_minute=60), FakeClock()).charge(61)
    assert refusal is not None and "exceed 60 tokens per minute" in refusal.message


def test_reset_durations_read_as_openai_writes_them() -> None:
    assert [duration(0.2), duration(1.5), duration(150)] == ["200ms", "1.5s", "2m30s"]


def test_a_reload_keeps_the_buckets_of_unchanged_quotas() -> None:
    table = LimitsTable(FakeClock())
    table.update(keyring(tenants(a=search(keys=["1"], quota={"concurrent": 1}), b=search(keys=["2"]))))
    a, b = table["a"], table["b"]
    table.update(
        keyring(tenants(a=search(keys=["1"], quota={"concurrent": 1}), b=search(keys=["2"], quota={"concurrent": 3})))
    )
    assert table["a"] is a and table["b"] is not b


def write(path: Path, data: dict[str, Any]) -> None:
    path.write_text(json.dumps(data))


async def until(condition: Callable[[], bool]) -> None:
    deadline = time.monotonic() + WAIT_S
    while not condition():
        assert time.monotonic() < deadline, "condition not met in time"
        await asyncio.sleep(0.01)


def poll_after(watcher: KeysWatcher, clock: FakeClock, seen: Callable[[], bool]) -> None:
    """One interval later, a request's poll; then the check's outcome awaited."""

    async def run() -> None:
        clock.now += watcher.interval
        watcher.poll()
        await until(lambda: not watcher.checking)
        assert seen()

    asyncio.run(run())


def test_a_changed_file_is_reloaded(tmp_path: Path) -> None:
    path, clock = tmp_path / "keys.json", FakeClock()
    write(path, tenants(a=search(keys=["old"])))
    watcher = KeysWatcher(path, 5.0, clock=clock)
    write(path, tenants(a=search(keys=["new-key-longer"])))
    poll_after(watcher, clock, lambda: watcher.reloads == 1)
    assert watcher.ring.tenant_for(b"new-key-longer") is not None and watcher.ring.tenant_for(b"old") is None


def test_no_check_before_the_interval(tmp_path: Path) -> None:
    path, clock = tmp_path / "keys.json", FakeClock()
    write(path, tenants(a=search(keys=["old"])))
    watcher = KeysWatcher(path, 5.0, clock=clock)
    write(path, tenants(a=search(keys=["new-key-longer"])))

    async def run() -> None:
        clock.now += 4.9
        watcher.poll()
        assert not watcher.checking

    asyncio.run(run())


def test_a_broken_file_keeps_the_last_good_keys_and_says_so(tmp_path: Path) -> None:
    path, clock = tmp_path / "keys.json", FakeClock()
    write(path, tenants(a=search(keys=["old"])))
    watcher = KeysWatcher(path, 5.0, clock=clock)
    path.write_text('{"tenants": ')
    poll_after(watcher, clock, lambda: watcher.error is not None)
    assert watcher.ring.tenant_for(b"old") is not None
    assert "not valid JSON" in watcher.detail()["error"]


def test_a_secret_volume_symlink_swap_is_seen(tmp_path: Path) -> None:
    """Kubernetes updates a Secret volume by pointing `..data` at a new folder: same path, new inode."""
    first, second = tmp_path / "..2026_01", tmp_path / "..2026_02"
    first.mkdir()
    second.mkdir()
    write(first / "keys.json", tenants(a=search(keys=["old"])))
    write(second / "keys.json", tenants(a=search(keys=["new"])))
    os.symlink(first.name, tmp_path / "..data")
    os.symlink("..data/keys.json", tmp_path / "keys.json")
    clock = FakeClock()
    watcher = KeysWatcher(tmp_path / "keys.json", 5.0, clock=clock)
    os.symlink(second.name, tmp_path / "..data_tmp")
    os.replace(tmp_path / "..data_tmp", tmp_path / "..data")
    poll_after(watcher, clock, lambda: watcher.reloads == 1)
    assert watcher.ring.tenant_for(b"new") is not None


def test_an_unusable_file_at_the_start_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(KeysFileError, match="cannot read"):
        KeysWatcher(tmp_path / "absent.json", 5.0)


def test_the_kubernetes_example_loads() -> None:
    """deploy/kubernetes/api-keys-secret.yaml's keys file is one the server takes."""
    import yaml

    manifest = yaml.safe_load((Path(__file__).parents[2] / "deploy/kubernetes/api-keys-secret.yaml").read_text())
    ring = parse(manifest["stringData"]["keys.yaml"].encode(), Path("keys.yaml"))
    assert sorted(ring.tenants) == ["ops", "search"]


def test_batch_lines_take_the_daily_bucket_not_the_minutes() -> None:
    clock = FakeClock()
    limits = TenantLimits(Quota(tokens_per_minute=10, batch_tokens_per_day=86400), clock)
    assert limits.charge(50, batch=True) is None  # a day's bucket, whatever a minute holds
    assert limits.charge(10) is None and limits.charge(1) is not None  # the minute's bucket untouched by it
    refused = limits.charge(86400, batch=True)
    assert refused is not None and refused.reason == "batch_tokens"
    clock.now += 50  # a day's tokens refill at one a second here
    assert limits.charge(50, batch=True) is None
