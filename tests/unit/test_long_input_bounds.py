"""What a request of long texts may cost before it is refused: a chunked text's windows are the
tokenizer's own overflow and are counted before any is built, and a text is found too long from its
pieces without being encoded whole (the peak memory of a refusal, in a fresh process:
tests/test_long_input_peaks.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
from tokenizers import Tokenizer

from server.tokenizing.tokenizer import TokenizerPool


@pytest.mark.parametrize(("max_tokens", "overlap"), [(256, 32), (16, 7), (10, 4)])
def test_windows_are_the_tokenizers_own_overflow(model_dir: Path, max_tokens: int, overlap: int) -> None:
    """window_count() and windows() of a text give what the tokenizer's truncation with a stride
    gives, at every length about a window's edges, for text of several scripts."""
    pool = TokenizerPool(model_dir)
    reference = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
    reference.no_padding()
    reference.enable_truncation(max_length=max_tokens, stride=overlap)
    texts = ["", "word"] + ["word " * n for n in range(max_tokens - 4, max_tokens + 1)] + ["é😀 漢字 γάμμα! " * 90]
    for text in texts:
        encoding = reference.encode(text)
        expected = [encoding.ids, *(o.ids for o in encoding.overflowing)]
        raw = pool.encode_raw(text)
        assert [w.input_ids for w in pool.windows(raw, max_tokens, overlap)] == expected, text[:20]
        assert pool.window_count(raw, max_tokens, overlap) == len(expected), text[:20]


@pytest.mark.parametrize(
    ("text", "long"),
    [
        ("word " * 20_000, True),  # whitespace between every word
        ("warm pools, engines & tokens! " * 4_000, True),  # punctuation
        ("漢字仮名交じり文" * 12_000, True),  # no whitespace at all: pieces cut mid-run
        ("x" * 90_000, False),  # one word of 90,000 characters: one [UNK] whole, one a piece
    ],
    ids=["words", "punctuation", "cjk", "one-word"],
)
def test_a_text_is_surely_longer_only_past_its_true_count(model_dir: Path, text: str, long: bool) -> None:
    """surely_longer(text, n) never says so for n at or above the text's true token count (whatever
    its pieces' boundaries do), and says so for n well below a long text's: the early refusal is never
    wrong, and a text far too long is found."""
    pool = TokenizerPool(model_dir)
    true = len(pool.encode_raw(text))
    assert not pool.surely_longer(text, true)
    assert pool.surely_longer(text, true // 2) is long
