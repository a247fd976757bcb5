"""Per-thread HF fast tokenizers: they are not thread-safe, so each executor thread gets its own copy.

`Tokenizer.encode` holds the GIL for as long as it runs (a 480 KB text stopped every other thread,
the event loop included, for 0.43 s); `encode_batch_fast` releases it. Short single texts still
use `encode`, whose cost is below the batch call's thread hand-off.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable, Iterator, Sequence
from functools import cached_property
from pathlib import Path
from typing import Any, Literal

from tokenizers import Encoding, Tokenizer

from common.causal_reranker import PairTemplate
from common.folderjson import ModelError
from common.late_interaction import LateInteraction
from common.wire import Tokens
from server.tokenizing.class_pipeline import load_as_built
from server.tokenizing.instances import Instances, holding
from server.tokenizing.markers import markers_of
from server.tokenizing.siglip_tokenizer import SPIECE, Spelled, is_siglip, siglip_tokenizer, without

# The most a TEI token span takes less the text it covers: {"id":..,"text":"","special":false,
# "start":..,"stop":..}, with 7-digit offsets, or a special token's text and nulls.
SPAN_BYTES = 80

# Characters tokenized in one call where a text may be refused: 2 MB of texts at once held ~180 MB in
# the tokenizer before the first too-long one was found; in runs of this size a few MB, and a refusal
# stops at its run.
RUN_CHARS = 64 * 1024

# A long text's tokens are first counted piece by piece (surely_longer): pieces of this many characters,
# each counted PIECE_SLACK tokens short, for texts longer than SURE_FROM_CHARS.
PIECE_CHARS = 16 * 1024
PIECE_SLACK = 32
SURE_FROM_CHARS = 4 * PIECE_CHARS

# Up to this many characters a lone text is encoded holding the GIL: well under a millisecond.
SHORT_TEXT_CHARS = 1024

TextOrPair = str | tuple[str, str]
Direction = Literal["right", "left"]


class TokenizerPool:
    """A folder's tokenizer for many threads: each method runs with one of its Instances held."""

    def __init__(
        self, folder: Path, pair_template: PairTemplate | None = None, late: LateInteraction | None = None
    ) -> None:
        prototype, self._spelled = _load(folder)
        prototype.no_padding()
        prototype.no_truncation()
        self.folder = folder
        self._json = prototype.to_str()
        variants = []  # SigLIP's plain tokenizer, for texts that spell out no special token
        if self._spelled is not None:
            self._spelled.plain.no_padding()
            self._spelled.plain.no_truncation()
            variants.append(self._spelled.plain.to_str())
        self.instances = Instances(self._json, *variants)
        self.vocab_size = prototype.get_vocab_size(with_added_tokens=True)
        processor = prototype.post_processor
        self.special_tokens = processor.num_special_tokens_to_add(False) if processor else 0
        self.special_tokens_pair = processor.num_special_tokens_to_add(True) if processor else 0
        self._joins_pairs = processor is not None  # else join pairs by encoding them whole
        self.pair_template = pair_template  # a causal-LM reranker's: pairs become its prompt
        if pair_template is not None:
            self._prefix = prototype.encode(pair_template.prefix, add_special_tokens=False).ids
            self._suffix = prototype.encode(pair_template.suffix, add_special_tokens=False).ids
            self.special_tokens_pair = len(self._prefix) + len(self._suffix) + self.special_tokens
        self.markers = None if late is None else markers_of(prototype, folder, late)

    @cached_property
    def special_ids(self) -> frozenset[int]:
        """The ids of the tokenizer's cls, eos, pad and unk tokens (the ones bge-m3's lexical
        weights leave out), as its tokenizer_config.json and special_tokens_map.json name them."""
        named: dict[str, Any] = {}
        for name in ("tokenizer_config.json", "special_tokens_map.json"):
            try:
                named.update(json.loads((self.folder / name).read_text()))
            except (OSError, ValueError):
                continue
        ids = set()
        for role in ("cls_token", "eos_token", "pad_token", "unk_token"):
            token = named.get(role)
            token = token.get("content") if isinstance(token, dict) else token
            with self.held() as tok:
                found = tok.token_to_id(token) if isinstance(token, str) else None
            if found is not None:
                ids.add(found)
        return frozenset(ids)

    def held(self) -> contextlib.AbstractContextManager[Tokenizer]:
        """One of the pool's tokenizers for this thread until the block ends (Instances.held)."""
        return self.instances.held()

    @property
    def made(self) -> int:
        return self.instances.made

    def get(self, text: str = "") -> Tokenizer:
        """The tokenizer this thread holds (within held(), or a method of the pool); for SigLIP, its
        plain variant where `text` (the call's texts, joined by NUL) spells out no special token."""
        if self._spelled is not None and not self._spelled.spells(text):
            return self.instances.get(1)
        return self.instances.get()

    @holding
    def encode_batch(
        self, inputs: Sequence[TextOrPair], truncate: int | None = None, direction: Direction = "right"
    ) -> list[Tokens]:
        """Texts or (text, text) pairs with special tokens, each cut to `truncate` tokens if given
        (the special tokens kept, as sentence-transformers' tokenizer call does), from the end or,
        with `direction="left"`, from the start."""
        tok = self.get(_joined(inputs) if self._spelled is not None else "")
        if truncate is not None:
            tok.enable_truncation(max_length=truncate, direction=direction)
        try:
            if len(inputs) == 1 and _chars(inputs[0]) <= SHORT_TEXT_CHARS:
                text, pair = inputs[0] if isinstance(inputs[0], tuple) else (inputs[0], None)
                return [self._tokens(tok.encode(text, pair, add_special_tokens=True))]
            return [self._tokens(e) for e in tok.encode_batch_fast(list(inputs), add_special_tokens=True)]
        finally:
            if truncate is not None:
                tok.no_truncation()

    @holding
    def encode_pairs(
        self, pairs: list[tuple[str, str]], truncate: int | None = None, direction: Direction = "right"
    ) -> list[Tokens]:
        """(text, text) pairs as a cross-encoder reads them, each distinct text tokenized once (one
        query against 2000 documents is tokenized once, not 2000 times), then joined with the
        special tokens and cut to `truncate` exactly as encoding the pair whole would."""
        if self.pair_template is not None:
            return self._prompts(self.pair_template, pairs, truncate, direction)
        if not self._joins_pairs:  # no post-processor: only the whole-pair call sets the type ids
            return self.encode_batch(list(pairs), truncate, direction)
        texts = list(dict.fromkeys(text for pair in pairs for text in pair))
        tok = self.get("\0".join(texts) if self._spelled is not None else "")
        parts = dict(zip(texts, tok.encode_batch_fast(texts, add_special_tokens=False), strict=True))
        if truncate is not None:
            tok.enable_truncation(max_length=truncate, direction=direction)
        try:
            return [self._tokens(tok.post_process(parts[a], parts[b], add_special_tokens=True)) for a, b in pairs]
        finally:
            if truncate is not None:
                tok.no_truncation()

    def _prompts(
        self, template: PairTemplate, pairs: list[tuple[str, str]], truncate: int | None, direction: Direction
    ) -> list[Tokens]:
        """Pairs as a causal-LM reranker's prompts, built as its model card builds them: the body
        (instruction, query, document) encoded with the tokenizer's special tokens and cut to what
        `truncate` leaves beside the fixed prefix and suffix, which are never cut."""
        room = None if truncate is None else truncate - len(self._prefix) - len(self._suffix)
        bodies = self.encode_batch([template.format(query, doc) for query, doc in pairs], room, direction)
        return [Tokens(self._prefix + body.input_ids + self._suffix) for body in bodies]

    @holding
    def encode_raw(self, text: str) -> Encoding:
        """A text's tokens without special tokens, truncation or Python lists (window_count() and
        windows() take it from here): what a long text costs before any bound is its Rust encoding."""
        return self.get(text).encode_batch_fast([text], add_special_tokens=False)[0]

    @holding
    def offsets(self, text: str) -> list[tuple[int, int]]:
        """Each of a text's tokens' character span (special tokens aside): where passages are cut."""
        return self.get(text).encode_batch([text], add_special_tokens=False)[0].offsets  # type: ignore[no-any-return]

    def pair_overhead(self, query: str) -> int:
        """The tokens a cross-encoder's pair takes beside its document: the query and the special
        tokens, or a causal-LM reranker's whole prompt around an empty document."""
        if self.pair_template is not None:
            fixed = len(self._prefix) + len(self._suffix) + self.special_tokens
            return fixed + len(self.encode_raw(self.pair_template.format(query, "")))
        return self.special_tokens_pair + len(self.encode_raw(query))

    @holding
    def surely_longer(self, text: str, tokens: int) -> bool:
        """Whether `text` has surely more than `tokens` tokens (special tokens aside), found by encoding
        it a piece at a time and stopping once past: a text far too long costs a piece's encoding,
        not its whole (~200 bytes a token). A text of a few pieces is left to the exact count (False).
        Pieces end at whitespace where there is some, and each counts PIECE_SLACK tokens fewer than
        it has: a boundary changes the tokens of the words about it only."""
        if len(text) <= SURE_FROM_CHARS:
            return False
        tok, counted = self.get(text), 0
        for piece in _pieces(text):
            counted += max(0, len(tok.encode_batch_fast([piece], add_special_tokens=False)[0]) - PIECE_SLACK)
            if counted > tokens:
                return True
        return False

    def window_count(self, raw: Encoding, max_tokens: int, overlap: int) -> int:
        """How many windows windows() makes of `raw`, counted without making them: the tokenizer's
        overflow steps by (room - overlap) until a window reaches the end."""
        room = max_tokens - self.special_tokens
        if len(raw) <= room:
            return 1
        return 1 + -(-(len(raw) - room) // (room - overlap))

    @holding
    def windows(self, raw: Encoding, max_tokens: int, overlap: int) -> list[Tokens]:
        """`raw` as windows of at most `max_tokens` tokens with the special tokens, each repeating the
        last `overlap` of the one before: what encoding the text with the tokenizer's truncation
        and stride makes (its post-processing step, applied to the encoding already made)."""
        tok = self.get()
        tok.enable_truncation(max_length=max_tokens, stride=overlap, direction="right")
        try:
            encoding = tok.post_process(raw, None, add_special_tokens=True)
        finally:
            tok.no_truncation()
        return [self._tokens(e) for e in (encoding, *encoding.overflowing)]

    @holding
    def encode_windows_with_offsets(
        self, text: str, max_tokens: int, overlap: int
    ) -> list[tuple[Tokens, list[int | None]]]:
        """windows() of one text, each window with its tokens' start offsets in the text
        (None for special tokens)."""
        tok = self.get(text)
        tok.enable_truncation(max_length=max_tokens, stride=overlap, direction="right")
        try:
            (encoding,) = tok.encode_batch([text], add_special_tokens=True)  # with offsets, off the GIL
        finally:
            tok.no_truncation()
        return [
            (self._tokens(e), without(_starts(e), self._extra_eos(e, e.ids))) for e in (encoding, *encoding.overflowing)
        ]

    def encode(self, text: str, pair: str | None = None, truncate: int | None = None) -> Tokens:
        return self.encode_batch([text if pair is None else (text, pair)], truncate)[0]

    @holding
    def tokenize(self, text: str, add_special_tokens: bool) -> list[int]:
        tok = self.get(text)
        if len(text) <= SHORT_TEXT_CHARS:
            encoding = tok.encode(text, add_special_tokens=add_special_tokens)
        else:
            encoding = tok.encode_batch_fast([text], add_special_tokens=add_special_tokens)[0]
        ids: list[int] = encoding.ids
        return without(ids, self._extra_eos(encoding, ids)) if add_special_tokens else ids

    @holding
    def decode(self, ids: list[int], skip_special_tokens: bool = False) -> str:
        return self.get().decode(ids, skip_special_tokens=skip_special_tokens)

    @holding
    def decode_batch(self, ids: list[list[int]], skip_special_tokens: bool) -> list[str]:
        return list(self.get().decode_batch(ids, skip_special_tokens=skip_special_tokens))

    @holding
    def spans(
        self, texts: list[str], add_special_tokens: bool, max_tokens: int, budget: Callable[[int, str], None]
    ) -> list[list[dict[str, Any]]]:
        """TEI's token list per text: id, text, special and the character span it covers in the
        text (null for special tokens, which cover none). A text of more than `max_tokens` tokens
        raises TooManyTokens, and `budget` is given the answer's size in bytes (it raises to
        refuse it), before any token's answer is built: what a text may cost in Python objects is
        what the model would take of it."""
        encodings: list[tuple[Encoding, list[int]]] = []
        for run in runs(texts):  # a text too long ends it before the texts after it are tokenized
            tok = self.get("\0".join(run) if self._spelled is not None else "")
            for encoding in tok.encode_batch(run, add_special_tokens=add_special_tokens):  # with offsets
                ids = encoding.ids
                extra = self._extra_eos(encoding, ids) if add_special_tokens else []
                if len(ids) - len(extra) > max_tokens:
                    raise TooManyTokens(len(encodings), len(ids) - len(extra))
                encodings.append((encoding, extra))
        budget(
            sum(SPAN_BYTES * len(e.ids) + len(t.encode()) for t, (e, _) in zip(texts, encodings, strict=True)), "inputs"
        )
        return [without(_spans(text, e), extra) for text, (e, extra) in zip(texts, encodings, strict=True)]

    def _tokens(self, encoding: Encoding) -> Tokens:
        """An encoding with special tokens as the engine takes it (type ids only where some are not 0)."""
        ids, type_ids = encoding.ids, encoding.type_ids
        if self._spelled is not None and ids.count(self._spelled.eos) > 1:  # SigLIP's, a literal eos in it
            extra = self._spelled.positions(encoding, ids)
            ids, type_ids = without(ids, extra), without(type_ids, extra)
        return Tokens(ids, type_ids if any(type_ids) else None)

    def _extra_eos(self, encoding: Encoding, ids: list[int]) -> list[int]:
        """The positions of the eos tokens the post-processor added that the tokenizer's class does
        not add (SigLIP's, after a literal eos: Spelled); none for every other tokenizer."""
        return [] if self._spelled is None else self._spelled.positions(encoding, ids)


def runs(texts: list[str]) -> Iterator[list[str]]:
    """`texts` in order, in runs of about RUN_CHARS characters: what the tokenizer holds at once."""
    start, chars = 0, 0
    for i, text in enumerate(texts):
        chars += len(text)
        if chars >= RUN_CHARS:
            yield texts[start : i + 1]
            start, chars = i + 1, 0
    if start < len(texts):
        yield texts[start:]


def _pieces(text: str) -> Iterator[str]:
    """`text` in pieces of at most PIECE_CHARS characters, each ending at whitespace where the last
    tenth of it has some."""
    start = 0
    while start < len(text):
        end = min(start + PIECE_CHARS, len(text))
        if end < len(text):
            space = max(text.rfind(" ", end - PIECE_CHARS // 10, end), text.rfind("\n", end - PIECE_CHARS // 10, end))
            end = space + 1 if space > start else end
        yield text[start:end]
        start = end


def _load(folder: Path) -> tuple[Tokenizer, Spelled | None]:
    """The folder's tokenizer.json as its tokenizer class builds it (class_pipeline); a SigLIP folder's
    sentencepiece model (spiece.model), which SiglipTokenizer reads even beside a tokenizer.json, with
    what its texts that spell out special tokens need besides."""
    path = folder / "tokenizer.json"
    if (folder / SPIECE).is_file() and (not path.is_file() or is_siglip(folder)):
        if not is_siglip(folder):
            raise ModelError(
                f"{folder} has {SPIECE} but no tokenizer.json: only SigLIP's sentencepiece tokenizer is built "
                "from it; save the tokenizer with transformers to write its tokenizer.json"
            )
        return siglip_tokenizer(folder)
    if not path.is_file():
        raise ModelError(f"no tokenizer in {folder}: it needs tokenizer.json (or, for a SigLIP model, {SPIECE})")
    return load_as_built(folder, path), None


class TooManyTokens(ValueError):
    def __init__(self, index: int, count: int) -> None:
        super().__init__(f"text {index} has {count} tokens")
        self.index, self.count = index, count


def _joined(inputs: Sequence[TextOrPair]) -> str:
    """The texts of `inputs`, joined by NUL (what Spelled looks for special tokens in)."""
    return "\0".join(item if isinstance(item, str) else "\0".join(item) for item in inputs)


def _chars(item: TextOrPair) -> int:
    return len(item) if isinstance(item, str) else len(item[0]) + len(item[1])


def _starts(encoding: Encoding) -> list[int | None]:
    """Each token's start offset in the text; None for special tokens."""
    return [
        None if special else start
        for (start, _), special in zip(encoding.offsets, encoding.special_tokens_mask, strict=True)
    ]


def _spans(text: str, encoding: Encoding) -> list[dict[str, Any]]:
    spans = []
    for token_id, token, special, (start, stop) in zip(
        encoding.ids, encoding.tokens, encoding.special_tokens_mask, encoding.offsets, strict=True
    ):
        if special:
            spans.append({"id": token_id, "text": token, "special": True, "start": None, "stop": None})
        else:
            spans.append({"id": token_id, "text": text[start:stop], "special": False, "start": start, "stop": stop})
    return spans
