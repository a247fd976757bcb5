"""Per-thread HF fast tokenizers: they are not thread-safe, so each executor thread gets its own copy."""

from __future__ import annotations

import threading
from pathlib import Path

from tokenizers import Encoding, Tokenizer

from common.modelfolder import ModelError
from common.wire import Tokens


class TokenizerPool:
    def __init__(self, folder: Path) -> None:
        path = folder / "tokenizer.json"
        try:
            prototype = Tokenizer.from_file(str(path))
        except Exception as exc:  # the tokenizers library raises bare Exceptions
            raise ModelError(f"cannot load tokenizer {path}: {exc}") from exc
        prototype.no_padding()
        prototype.no_truncation()
        self._json = prototype.to_str()
        self._local = threading.local()
        self.vocab_size = prototype.get_vocab_size(with_added_tokens=True)

    def get(self) -> Tokenizer:
        tok = getattr(self._local, "tok", None)
        if tok is None:
            tok = self._local.tok = Tokenizer.from_str(self._json)
        return tok

    def encode(self, text: str, pair: str | None = None, truncate: int | None = None) -> Tokens:
        """Truncation keeps the special tokens, as sentence-transformers' tokenizer call does."""
        tok = self.get()
        if truncate is None:
            return _tokens(tok.encode(text, pair, add_special_tokens=True))
        tok.enable_truncation(max_length=truncate)
        try:
            return _tokens(tok.encode(text, pair, add_special_tokens=True))
        finally:
            tok.no_truncation()

    def encode_batch(self, texts: list[str]) -> list[Tokens]:
        tok = self.get()
        if len(texts) == 1:  # the batch call's thread-pool hand-off costs more than one encode
            return [_tokens(tok.encode(texts[0], add_special_tokens=True))]
        return [_tokens(e) for e in tok.encode_batch_fast(texts, add_special_tokens=True)]

    def tokenize(self, text: str, add_special_tokens: bool) -> list[int]:
        return list(self.get().encode(text, add_special_tokens=add_special_tokens).ids)

    def decode(self, ids: list[int]) -> str:
        return self.get().decode(ids, skip_special_tokens=False)


def _tokens(encoding: Encoding) -> Tokens:
    type_ids = encoding.type_ids
    return Tokens(list(encoding.ids), list(type_ids) if any(type_ids) else None)
