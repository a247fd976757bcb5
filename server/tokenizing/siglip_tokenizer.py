"""A SigLIP folder's tokenizer when it ships sentencepiece's model (spiece.model) and no tokenizer.json:
a `tokenizers` Tokenizer that encodes exactly as transformers' SiglipTokenizer does.

SiglipTokenizer (slow, sentencepiece) puts "▁" before the text (any "▁" in it made a space), splits
it on its special tokens ("</s>", "<unk>": matched as written, whitespace beside them stripped), then
canonicalises each part as big_vision does: lower-cased (do_lower_case), ASCII punctuation removed,
runs of whitespace made one space, the end stripped (and the start, but for the first part's "▁").
sentencepiece then encodes "<unk>" + that part, and the pieces of "<unk>" are dropped: only the
text's first part starts with "▁". Here the normalizer does it to each part: the canonicalisation,
then what sentencepiece's normalizer does after "<unk>" (its compiled rules, runs of spaces made one,
the trailing ones stripped), with a prefix that the pre-tokenizer keeps as the "▁" of the text's first
part only (Metaspace's "first" scheme: the part that starts where the text starts) and drops from
the others. A text that spells out no special token is one part: Spelled.plain, the same without
that pre-tokenizer, encodes it in less time. The eos token is appended to every text, except
(TokenizerPool, with Spelled) after a part that ends with a literal one; SigLIP's processor pads to
the full length (server/core/inputs.py).

Not reproduced: characters this Python's Unicode database does not know yet, which the tokenizers
library's newer one may lower-case; and a character the rules rewrite (①, ﬁ, full-width forms)
followed by a combining mark, which the tokenizers library's Precompiled rewrites as one grapheme,
the mark dropped (sentencepiece keeps the mark).
"""

from __future__ import annotations

import string
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any, TypeVar

from tokenizers import (
    AddedToken,
    Encoding,
    Regex,
    Tokenizer,
    decoders,
    models,
    normalizers,
    pre_tokenizers,
    processors,
)

from common.folderjson import ModelError, read_json
from server.tokenizing.spm_model import UNIGRAM, PieceType, SpmError, read_spm

SPIECE = "spiece.model"
SPACE = "▁"  # sentencepiece's escaped space, and SiglipTokenizer's prefix
# Each part's prefix in the normalizer: SiglipTokenizer's "▁", which holds the part's first offset (by
# which the pre-tokenizer tells the text's first part) and which sentencepiece reads as a space; then,
# where sentencepiece's rules remove it (nmt_nfkc's do), a control character: a combining mark the
# part starts with is then no grapheme with the "▁", which the rules map, and which the tokenizers
# library's Precompiled would replace whole (the mark dropped)
PREFIX = SPACE + "\x01"
T = TypeVar("T")
# SiglipTokenizer's defaults, for a tokenizer_config.json that names none
DEFAULTS = {"eos_token": "</s>", "unk_token": "<unk>", "pad_token": "</s>"}
# Python's str.lower() makes a capital sigma the final form after a cased letter and not before one
# (case-ignorable characters between); tokenizers' Lowercase maps each character alone, to the medial one
FINAL_SIGMA = r"\p{Cased}\p{Case_Ignorable}*\KΣ(?!\p{Case_Ignorable}*\p{Cased})"


def is_siglip(folder: Path) -> bool:
    """The folder's tokenizer is SiglipTokenizer: tokenizer_config.json names it, or names no class
    in a SigLIP model's folder (transformers' AutoTokenizer then picks it by model_type)."""
    named = read_json(folder / "tokenizer_config.json").get("tokenizer_class")
    if named is not None:
        return named == "SiglipTokenizer"
    return read_json(folder / "config.json").get("model_type") == "siglip"


def siglip_tokenizer(folder: Path) -> tuple[Tokenizer, Spelled]:
    """The tokenizer of a folder with spiece.model, and what texts spelling out special tokens need
    besides (Spelled); ModelError where the model cannot be read or is not one this encodes exactly
    (sentencepiece's Unigram, whitespace escaped and its runs removed, no user-defined pieces)."""
    path = folder / SPIECE
    try:
        spm = read_spm(path)
    except (OSError, SpmError) as exc:
        raise ModelError(f"cannot load tokenizer {path}: {exc}") from exc
    if spm.model_type != UNIGRAM or spm.treat_whitespace_as_suffix:
        raise ModelError(f"{path}: only sentencepiece Unigram models (whitespace as a prefix) are supported")
    if not (spm.escape_whitespaces and spm.remove_extra_whitespaces):
        raise ModelError(f"{path}: only sentencepiece models that escape and remove extra whitespace are supported")
    if any(kind == PieceType.USER_DEFINED for _, _, kind in spm.pieces):
        raise ModelError(f"{path}: sentencepiece user-defined pieces are not supported")
    settings = read_json(folder / "tokenizer_config.json")
    vocab = [(piece, score) for piece, score, _ in spm.pieces]
    ids = {piece: i for i, (piece, _) in enumerate(vocab)}
    tokenizer = Tokenizer(models.Unigram(vocab, spm.unk_id, spm.byte_fallback))
    rules = [normalizers.Precompiled(spm.precompiled_charsmap)] if spm.precompiled_charsmap else []
    spaced = bool(rules) and rules[0].normalize_str(PREFIX) == " "  # nmt_nfkc's: "▁" a space, "\x01" gone
    prefix = PREFIX if spaced else SPACE
    # Each part: a prefix + its text as sentencepiece normalises it after "<unk>". The prefix is "▁"
    # (holding the part's first offset); "▁▁" where the rules keep "▁" and the part began with a space
    # (sentencepiece then starts SiglipTokenizer's first part with two); a space where the rules put
    # one first ("¨" is " ̈"), which sentencepiece merges with the "▁". The pre-tokenizer keeps the
    # prefix at the start of the text's first part and drops it from the others.
    steps = [
        *canonicalize(bool(settings.get("do_lower_case", True)), prefix)[:-1],  # its end: stripped below
        normalizers.Replace(Regex(f"(?<=\\A{prefix}) "), "" if spaced else SPACE),  # the part's leading space
        *rules,
    ]
    if spaced:
        steps += [normalizers.Replace(Regex("\\A (?=[^ ])"), SPACE), normalizers.Replace(Regex("(?<!\\A) {2,}"), " ")]
    else:
        steps += [
            normalizers.Replace(Regex(f"(?<=\\A{SPACE}){SPACE}(?= )"), ""),
            normalizers.Replace(Regex(" {2,}"), " "),
        ]
    steps.append(normalizers.Replace(Regex(f"[ {SPACE}]+\\z"), ""))  # sentencepiece strips the trailing spaces
    tokenizer.normalizer = normalizers.Sequence(steps)
    # SiglipTokenizer's "▁" before the text: the first part (the one that starts the text, its offset
    # held by the prefix) keeps its "▁"s, the others drop them; a leading space stays in both
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Metaspace(replacement=" ", prepend_scheme="first", split=False),  # " " + the first
            pre_tokenizers.Split(Regex(f"\\A(?: |{SPACE}{SPACE}?)"), behavior="removed"),
            pre_tokenizers.Metaspace(replacement=SPACE, prepend_scheme="never", split=False),
        ]
    )
    special = _special_tokens(settings)
    tokenizer.add_special_tokens(special)
    eos = _content(settings.get("eos_token", DEFAULTS["eos_token"]))
    if eos not in ids:
        raise ModelError(f"{path}: its eos token {eos!r} is not one of its pieces")
    tokenizer.post_processor = processors.TemplateProcessing(
        single=f"$A {eos}", pair=f"$A {eos} $B {eos}", special_tokens=[(eos, ids[eos])]
    )
    fallback = [decoders.ByteFallback()] if spm.byte_fallback else []
    tokenizer.decoder = decoders.Sequence(
        [decoders.Replace(SPACE, " "), *fallback, decoders.Fuse(), decoders.Strip(" ", 1, 0)]
    )
    plain = Tokenizer.from_str(tokenizer.to_str())
    plain.pre_tokenizer = None
    plain.normalizer = normalizers.Sequence(
        [
            *canonicalize(bool(settings.get("do_lower_case", True)), prefix),
            *rules,
            normalizers.Replace(Regex(" {2,}"), " "),
            normalizers.Replace(" ", SPACE),
            normalizers.Replace(Regex(f"{SPACE}+\\z"), ""),  # sentencepiece strips the trailing spaces: "▁" too
        ]
    )
    return tokenizer, Spelled(plain, tuple(token.content for token in special), ids[eos])


@dataclass(frozen=True)
class Spelled:
    """What a SigLIP tokenizer needs besides itself for texts that spell out its special tokens.

    A text that spells out none is one part: `plain` (the same tokenizer, its normalizer giving the
    text its "▁", no pre-tokenizer to tell parts apart) gives the same ids, in less time (most texts).
    SiglipTokenizer appends its eos to a part (the text, or each text of a pair) only where the part,
    once cut to length, does not end with one already; the template appends it always: positions()
    are those of the eos tokens it appended right after a literal one."""

    plain: Tokenizer
    spellings: tuple[str, ...]
    eos: int

    def spells(self, text: str) -> bool:
        """Whether `text` spells out a special token (texts joined by NUL: one found across two has a
        NUL in its spelling, and such a false alarm costs time only)."""
        return any(spelling in text for spelling in self.spellings)

    def positions(self, encoding: Encoding, ids: list[int]) -> list[int]:
        """In `encoding` (with special tokens; `ids` its ids), the eos tokens to take out."""
        if ids.count(self.eos) < 2:  # the template's own only: nearly every text
            return []
        added = encoding.special_tokens_mask  # 1 where the template put the token, 0 for the text's
        return [i for i in range(1, len(ids)) if added[i] > added[i - 1] and ids[i] == ids[i - 1] == self.eos]


def without(values: list[T], positions: list[int]) -> list[T]:
    """`values` less those at `positions` (Spelled's)."""
    if not positions:
        return values
    dropped = set(positions)
    return [value for i, value in enumerate(values) if i not in dropped]


def canonicalize(lower: bool, prefix: str = SPACE) -> list[normalizers.Normalizer]:
    """SiglipTokenizer's text before sentencepiece sees it: "▁" (`prefix`) + the text with its own
    "▁" made spaces, lower-cased as str.lower() does, ASCII punctuation (string.punctuation) removed,
    each run of what Python's re calls whitespace made one space, the end stripped (the start is the
    prefix)."""
    steps = [normalizers.Replace(SPACE, " "), normalizers.Prepend(prefix)]
    if lower:
        steps += [normalizers.Replace(Regex(FINAL_SIGMA), "ς"), normalizers.Lowercase()]
    return [
        *steps,
        normalizers.Replace(Regex(_class(string.punctuation)), ""),
        normalizers.Replace(Regex(_class(_whitespace()) + "+"), " "),
        normalizers.Replace(Regex(" \\z"), ""),
    ]


@cache
def _whitespace() -> str:
    """The characters re's \\s matches in a str (str.isspace(): Unicode's, and \\x1c-\\x1f), all of
    them in the Basic Multilingual Plane."""
    return "".join(c for c in map(chr, range(0x10000)) if c.isspace())


def _class(chars: str) -> str:
    """A regex character class of exactly these characters (each escaped by its code point)."""
    return "[" + "".join(f"\\x{{{ord(c):x}}}" for c in chars) + "]"


def _content(token: Any) -> str:
    return str(token.get("content")) if isinstance(token, dict) else str(token)


def _special_tokens(settings: dict[str, Any]) -> list[AddedToken]:
    """The special tokens SiglipTokenizer splits the text on before encoding (matched as written,
    never normalised): tokenizer_config.json's added tokens, else its eos, unk and pad tokens."""
    added = settings.get("added_tokens_decoder") or {}
    entries: list[Any] = [t for t in added.values() if isinstance(t, dict) and t.get("special", True)]
    entries += [settings.get(role, default) for role, default in DEFAULTS.items()]
    entries += settings.get("additional_special_tokens") or []
    tokens: dict[str, AddedToken] = {}
    for entry in entries:
        content = _content(entry)
        if content and content not in tokens:
            flags = entry if isinstance(entry, dict) else {}
            tokens[content] = AddedToken(
                content,
                lstrip=bool(flags.get("lstrip", False)),
                rstrip=bool(flags.get("rstrip", False)),
                single_word=bool(flags.get("single_word", False)),
                normalized=False,
                special=True,
            )
    return list(tokens.values())
