"""The tokenizer pool: the same tokens whichever call path a text takes."""

from __future__ import annotations

import os
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from common.wire import Tokens
from server.tokenizing.tokenizer import SHORT_TEXT_CHARS, TokenizerPool

QUERY = "where is the eiffel tower " * 30
DOCS = ["it is in paris", "bananas " * 300, "", "unicode ünïcödé 🚀"]


@pytest.fixture(scope="module")
def pool(model_dir: Path) -> TokenizerPool:
    return TokenizerPool(model_dir)


@pytest.mark.parametrize("truncate", [None, 128, 16, 4])
def test_pairs_tokenized_once_equal_pairs_encoded_whole(pool: TokenizerPool, truncate: int | None) -> None:
    """encode_pairs (each distinct text tokenized once, then joined) gives exactly what encoding
    each (query, document) pair whole gives, truncation included."""
    pairs = [(QUERY, doc) for doc in DOCS] + [(DOCS[0], QUERY)]
    expected = [pool.encode(a, b, truncate=truncate) for a, b in pairs]
    assert pool.encode_pairs(pairs, truncate) == expected


def test_a_long_lone_text_takes_the_batch_call_with_the_same_tokens(pool: TokenizerPool) -> None:
    """A lone text past SHORT_TEXT_CHARS goes through the GIL-releasing batch call; its tokens are
    those of the plain call."""
    long = "warm pools start fast. " * (SHORT_TEXT_CHARS // 10)
    assert len(long) > SHORT_TEXT_CHARS
    (via_batch,) = pool.encode_batch([long])
    assert via_batch.input_ids == pool.tokenize(long, add_special_tokens=True)


def test_truncation_is_off_again_after_a_truncated_call(pool: TokenizerPool) -> None:
    """A truncated call leaves the thread's tokenizer untruncated for the next request."""
    pool.encode_batch(["word " * 50], truncate=5)
    (again,) = pool.encode_batch(["word " * 50])
    assert len(again.input_ids) == 52


def test_threads_share_at_most_one_tokenizer_per_cpu(model_dir: Path) -> None:
    """Eight threads tokenizing at once, each with its own truncation: the pool makes no more tokenizers
    than the CPUs it may run on (a big vocabulary's is hundreds of MB), and each thread gets its own
    texts' tokens as if alone."""
    pool = TokenizerPool(model_dir)
    texts = [("word " * (10 + n), 4 + n) for n in range(8)]
    alone = [pool.encode_batch([text] * 50, truncate=cut) for text, cut in texts]
    start = threading.Barrier(len(texts))

    def tokenize(n: int) -> list[list[Tokens]]:
        start.wait(timeout=10)
        text, cut = texts[n]
        return [pool.encode_batch([text] * 50, truncate=cut) for _ in range(20)]

    with ThreadPoolExecutor(len(texts)) as threads:
        got = list(threads.map(tokenize, range(len(texts))))
    assert all(run == alone[n] for n, runs in enumerate(got) for run in runs)
    assert 1 <= pool.made <= len(os.sched_getaffinity(0))


def test_a_pool_of_one_serves_calls_that_nest(model_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A call made while its thread holds a tokenizer (a reranker's prompts go through encode_batch
    from encode_pairs) reuses it: with one tokenizer in the pool, nothing waits for itself."""
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0})  # one CPU: one tokenizer
    pool = TokenizerPool(model_dir)

    def nested() -> list[Tokens]:
        with pool.held():
            return pool.encode_batch(["a query"], truncate=3)

    with ThreadPoolExecutor(1) as thread:
        (tokens,) = thread.submit(nested).result(timeout=10)
    assert len(tokens.input_ids) == 3 and pool.made == 1
