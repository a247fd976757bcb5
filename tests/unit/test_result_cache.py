"""The result cache's pieces: the LRU's byte bound, the key, the value format, the Redis breaker."""

from __future__ import annotations

import struct
import tracemalloc
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest

from common.settings import Settings, cache_bound
from common.startup import StartupState
from common.wire import Tokens
from server.core.result_cache import (
    FORMAT_VERSION,
    CacheFormatError,
    LocalLRU,
    decode,
    encode,
    input_key,
    model_digest,
)
from server.core.services import Services
from server.core.shared_cache import Breaker
from tests.checkpoints import linked_copy

BASE = Tokens([101, 2023, 102], [0, 0, 0])


def bound_for(*entries: tuple[bytes, bytes]) -> int:
    """The bytes an LRU holding exactly these entries counts: a bound they fill."""
    probe = LocalLRU(bound=1 << 30)
    for key, value in entries:
        probe.put(key, value)
    return probe.bytes


def test_the_lru_stays_within_its_bytes() -> None:
    lru = LocalLRU(bound=bound_for(*((f"k{i}".encode(), b"x" * 100) for i in range(3))))
    for i in range(10):
        lru.put(f"k{i}".encode(), b"x" * 100)
        assert lru.bytes <= lru.bound
    assert 0 < len(lru) <= 3 and lru.evictions == 10 - len(lru)


def test_the_lru_evicts_the_least_recently_used() -> None:
    lru = LocalLRU(bound=bound_for((b"a", b"1"), (b"b", b"2")))
    lru.put(b"a", b"1")
    lru.put(b"b", b"2")
    assert lru.get(b"a") == b"1"  # b is now the oldest
    lru.put(b"c", b"3")
    assert lru.get(b"b") is None and lru.get(b"a") == b"1" and lru.get(b"c") == b"3"


def test_a_value_got_is_not_changed_by_later_puts() -> None:
    lru = LocalLRU(bound=bound_for((b"a", b"1" * 64)))
    lru.put(b"a", b"1" * 64)
    got = lru.get(b"a")
    lru.put(b"b", b"2" * 64)  # evicts a, its buffer written over with b's value
    assert got == b"1" * 64 and lru.get(b"b") == b"2" * 64


@pytest.mark.parametrize("row", [np.ones(384, np.float32), np.ones(2, np.float32)], ids=["embedding", "logits"])
def test_the_memory_a_full_lru_holds_is_within_its_bound(row: np.ndarray) -> None:
    """What Python allocated for the entries (tracemalloc: keys, values, the dict's tables and nodes),
    after many more entries than fit went through, against the bound + 10 %. (Keys made from Tokens
    would leave their tuples on CPython's free lists, counted as held.)"""
    bound, value = 1 << 20, encode(row)
    puts = 3 * bound // LocalLRU.cost(b"k" * 20, value)  # three times what fits, at least
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        lru = LocalLRU(bound)
        for i in range(puts):
            lru.put(i.to_bytes(20, "little"), value)  # a key's length
        held = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert lru.evictions > 0 and held <= 1.1 * bound


def test_the_lru_keeps_no_value_larger_than_its_bound() -> None:
    lru = LocalLRU(bound=200)
    lru.put(b"a", b"x" * 500)
    assert len(lru) == 0 and lru.bytes == 0


@pytest.mark.parametrize(
    "other",
    [
        BASE._replace(input_ids=[101, 2023, 2003, 102]),  # another truncation or prompt: other ids
        BASE._replace(token_type_ids=[0, 1, 1]),
        BASE._replace(head="tokens"),
        BASE._replace(keys=2),
        BASE._replace(outputs=("dense",)),
        BASE._replace(adapter="legal"),
        BASE._replace(pixels=np.zeros((3, 2, 2), dtype=np.uint8)),
    ],
)
def test_every_field_that_changes_the_answer_changes_the_key(other: Tokens) -> None:
    assert input_key("model", other) != input_key("model", BASE)


def test_priority_does_not_change_the_key() -> None:
    assert input_key("model", BASE._replace(priority=5)) == input_key("model", BASE)


def test_another_model_digest_changes_the_key() -> None:
    assert input_key("model-a", BASE) != input_key("model-b", BASE)


@pytest.mark.parametrize("change", ["precision", "device", "mode"])
def test_the_model_digest_covers_how_it_runs(model_dir: Path, change: str) -> None:
    base = {"precision": "float32", "device": "cpu", "mode": "off"}
    other = base | {change: "x"}
    assert model_digest(model_dir, **other) != model_digest(model_dir, **base)


def test_the_model_digest_covers_the_files(model_dir: Path, tmp_path: Path) -> None:
    copy = tmp_path / "model"
    linked_copy(model_dir, copy)
    before = model_digest(copy, "float32", "cpu", "off")
    assert model_digest(copy, "float32", "cpu", "off") == before  # the same files: the same digest
    config = copy / "config.json"
    config.write_text(config.read_text().replace("}", ', "edited": 1}', 1))
    assert model_digest(copy, "float32", "cpu", "off") != before


@pytest.mark.parametrize(
    "value",
    [
        np.arange(384, dtype=np.float32),
        np.arange(12, dtype=np.float32).reshape(3, 4),
        np.arange(6, dtype=np.float16),
        {"dense": np.ones(4, np.float32), "sparse": np.zeros(3, np.float32), "multi_vector": np.ones((2, 4))},
    ],
)
def test_a_value_round_trips_bit_for_bit(value: np.ndarray | dict[str, np.ndarray]) -> None:
    back = decode(encode(value))
    pairs = [(value, back)] if isinstance(value, np.ndarray) else [(value[k], back[k]) for k in value]  # type: ignore[index]
    assert isinstance(back, type(value)) and all(
        a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes() for a, b in pairs
    )


def test_another_format_version_is_refused() -> None:
    data = bytearray(encode(np.ones(3, np.float32)))
    struct.pack_into("<B", data, 0, FORMAT_VERSION + 1)
    with pytest.raises(CacheFormatError):
        decode(bytes(data))


def test_a_value_cut_short_is_refused() -> None:
    with pytest.raises(CacheFormatError):
        decode(encode(np.ones(300, np.float32))[:-10])


def test_the_breaker_opens_after_failures_and_lets_one_try_after_the_cooldown() -> None:
    now = [0.0]
    breaker = Breaker(failures=3, cooldown_s=5.0, clock=lambda: now[0])
    for _ in range(3):
        assert breaker.allows()
        breaker.failed()
    assert not breaker.allows()
    now[0] = 5.1
    assert breaker.allows()  # the one try
    assert not breaker.allows()  # no second one meanwhile
    breaker.succeeded()
    assert breaker.state == "closed" and breaker.allows()


def test_cache_bytes_is_a_share_of_the_budget() -> None:
    assert cache_bound("10%", 1000) == 100
    assert cache_bound(None, 1000) == 50
    assert cache_bound("1Mi", None) == 2**20
    with pytest.raises(ValueError):
        cache_bound("10%", None)


def test_cache_bytes_zero_turns_the_cache_off(model_dir: Path) -> None:
    settings = Settings(_cli_parse_args=[], model=str(model_dir), cache_bytes="0")  # type: ignore[call-arg]
    with ThreadPoolExecutor(1) as executor:
        assert Services(settings=settings, startup=StartupState(), executor=executor).cache is None
