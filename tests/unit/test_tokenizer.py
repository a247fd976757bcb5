"""The tokenizer pool: the same tokens whichever call path a text takes."""

from __future__ import annotations

from pathlib import Path

import pytest

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
