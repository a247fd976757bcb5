"""A SigLIP folder's tokenizer when it ships sentencepiece's model (spiece.model) and no tokenizer.json:
a `tokenizers` Tokenizer that encodes exactly as transformers' SiglipTokenizer does.

SiglipTokenizer (slow, sentencepiece) puts "▁" before the text (any "▁" in it made a space), then
canonicalises it as big_vision does: lower-cased (do_lower_case), ASCII punctuation removed, runs of
whitespace made one space, stripped. sentencepiece then encodes "<unk>" + that text, and the pieces
of "<unk>" are dropped: the leading "▁" stands for the dummy prefix. Here the normalizer does all of
it on the text itself: the canonicalisation, then what sentencepiece's normalizer does to what
follows "<unk>" (its compiled rules, extra spaces removed, spaces escaped, no prefix of its own). The
eos token is appended to every text; SigLIP's processor pads to the full length (server/core/inputs.py).

Not reproduced: a text that spells out a special token ("</s>", "<unk>"). Both split it out as that
token, but SiglipTokenizer encodes the text after it without the leading "▁", and adds no second eos
after a final "</s>". And characters this Python's Unicode database does not know yet, which the
tokenizers library's newer one may lower-case.
"""

from __future__ import annotations

import string
from functools import cache
from pathlib import Path
from typing import Any

from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, processors

from common.folderjson import ModelError, read_json
from server.tokenizing.spm_model import UNIGRAM, PieceType, SpmError, read_spm

SPIECE = "spiece.model"
SPACE = "▁"  # sentencepiece's escaped space, and SiglipTokenizer's prefix
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


def siglip_tokenizer(folder: Path) -> Tokenizer:
    """The tokenizer of a folder with spiece.model; ModelError where the model cannot be read or
    is not one this encodes exactly (sentencepiece's Unigram, no user-defined pieces)."""
    path = folder / SPIECE
    try:
        spm = read_spm(path)
    except (OSError, SpmError) as exc:
        raise ModelError(f"cannot load tokenizer {path}: {exc}") from exc
    if spm.model_type != UNIGRAM or spm.treat_whitespace_as_suffix:
        raise ModelError(f"{path}: only sentencepiece Unigram models (whitespace as a prefix) are supported")
    if any(kind == PieceType.USER_DEFINED for _, _, kind in spm.pieces):
        raise ModelError(f"{path}: sentencepiece user-defined pieces are not supported")
    settings = read_json(folder / "tokenizer_config.json")
    vocab = [(piece, score) for piece, score, _ in spm.pieces]
    ids = {piece: i for i, (piece, _) in enumerate(vocab)}
    tokenizer = Tokenizer(models.Unigram(vocab, spm.unk_id, spm.byte_fallback))
    steps = [*canonicalize(bool(settings.get("do_lower_case", True)))]
    if spm.precompiled_charsmap:
        steps.append(normalizers.Precompiled(spm.precompiled_charsmap))
    space = SPACE if spm.escape_whitespaces else " "
    if spm.remove_extra_whitespaces:
        steps.append(normalizers.Replace(Regex(" {2,}"), " "))
    if spm.escape_whitespaces:
        steps.append(normalizers.Replace(" ", SPACE))
    if spm.remove_extra_whitespaces:  # sentencepiece strips the trailing spaces once escaped: "▁" too
        steps.append(normalizers.Replace(Regex(f"{space}+\\z"), ""))
    tokenizer.normalizer = normalizers.Sequence(steps)
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
    return tokenizer


def canonicalize(lower: bool) -> list[normalizers.Normalizer]:
    """SiglipTokenizer's text before sentencepiece sees it: "▁" + the text with its own "▁" made
    spaces, lower-cased as str.lower() does, ASCII punctuation (string.punctuation) removed, each run
    of what Python's re calls whitespace made one space, the end stripped (the start is the "▁")."""
    steps = [normalizers.Replace(SPACE, " "), normalizers.Prepend(SPACE)]
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
