"""A SigLIP folder with sentencepiece's spiece.model and no tokenizer.json: the server's tokenizer
(server/tokenizing/siglip_tokenizer.py, through TokenizerPool) gives transformers' SiglipTokenizer's ids; the
model file is read as sentencepiece reads it; a folder with neither file is refused by name."""

from __future__ import annotations

import os

os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["HF_HUB_DISABLE_TELEMETRY"] = "1"
os.environ["DO_NOT_TRACK"] = "1"

import json
import shutil
import sys
import unicodedata
from pathlib import Path
from typing import Any, Literal

import pytest
from tokenizers import Tokenizer, normalizers

from common.folderjson import ModelError
from server.tokenizing.siglip_tokenizer import canonicalize
from server.tokenizing.spm_model import read_spm
from server.tokenizing.tokenizer import TokenizerPool
from tests.tiny_vision import build_siglip, siglip_spm_tokenizer, train_spm

TEXTS = [
    "A photo of a cat.",
    "Hello, World!",  # punctuation and capitals
    "  extra   spaces\tand\ttabs\nand lines  ",
    "ΟΔΟΣ σας ΣΑΣ Σ.Σ ΑΣ'Α",  # noqa: RUF001  (capital sigma: the final form at a word's end, as str.lower())
    "Ünïcödé CAFÉ résumé naïve smörgåsbord",
    "東京 タワー 日本語中文字 Привет мир",
    "e-mail: someone@example.com (parens) [brackets] {braces} #tag 50% off",
    "“Quotes” and ‘single’ ones… ellipsis — dash – end",  # noqa: RUF001
    "3.14 + 2 = 5.14",
    "ﬁne ｆｕｌｌ ｗｉｄｔｈ ① Ⅻ x ¨ y",  # noqa: RUF001  (compatibility forms the nmt_nfkc rules rewrite)
    "zero\u200bwidth\u00a0nbsp\u3000ideographic\x1cseparator",
    "İstanbul ǅ ß ẞ",  # lower-casing that changes a character's length
    "▁leading and trailing▁ ▁",  # sentencepiece's own space symbol in the text
    "emoji 🙂 and unseen ✈ characters",
    "",
    " ",
    "!!!",
    "...?",
    "\t\n",
    "a",
    "A",
]
# Texts spelling out special tokens: SiglipTokenizer splits them out, encodes what follows one without
# the leading "▁" and adds no </s> after a final one
SPECIAL_TEXTS = [
    "</s>",
    "<unk>",
    "the </s> pool",
    "a cat </s>",
    "</s> a cat",
    "  </s>! ¨warm, \u0301pool",
    "warm!<unk><unk> pool </s></s>",
    "\t </s>\x1c  Warm \u00a0",
]


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("siglip-spm")
    siglip_spm_tokenizer(path, 64)
    return path


@pytest.fixture(scope="module")
def reference(folder: Path) -> Any:
    from transformers import SiglipTokenizer

    return SiglipTokenizer.from_pretrained(str(folder))


def test_folder_has_no_tokenizer_json(folder: Path) -> None:
    """The folder is what google/siglip-* ship: spiece.model and tokenizer_config.json, no tokenizer.json."""
    assert (folder / "spiece.model").is_file() and not (folder / "tokenizer.json").exists()
    assert json.loads((folder / "tokenizer_config.json").read_text())["tokenizer_class"] == "SiglipTokenizer"


@pytest.mark.parametrize("text", TEXTS + SPECIAL_TEXTS)
def test_ids_equal_siglip_tokenizers(folder: Path, reference: Any, text: str) -> None:
    """Each text's ids (canonicalised, sentencepiece-encoded, eos appended) equal SiglipTokenizer's,
    a lone text and the same text in a batch alike."""
    pool = TokenizerPool(folder)
    want = reference(text)["input_ids"]
    assert pool.encode(text).input_ids == want
    assert [t.input_ids for t in pool.encode_batch([text, "a"])] == [want, reference("a")["input_ids"]]


@pytest.mark.parametrize("rules", ["nfkc", "identity"])
def test_other_normalization_rules_have_the_reference_ids(tmp_path: Path, rules: str) -> None:
    """A sentencepiece model with other normalization rules than nmt_nfkc's (which keep "▁" as it is,
    or none at all) is tokenized as SiglipTokenizer does, spelled-out special tokens included."""
    from transformers import SiglipTokenizer

    model = train_spm(model_type="unigram", pad_id=0, eos_id=1, unk_id=2, bos_id=-1, normalization_rule_name=rules)
    (tmp_path / "spiece.model").write_bytes(model)
    reference = SiglipTokenizer(vocab_file=str(tmp_path / "spiece.model"))
    reference.save_pretrained(tmp_path)
    texts = [*TEXTS, *SPECIAL_TEXTS]
    assert [t.input_ids for t in TokenizerPool(tmp_path).encode_batch(texts)] == reference(texts)["input_ids"]


@pytest.mark.parametrize("lower", [True, False])
def test_canonical_text_equals_siglip_tokenizers_for_every_character(reference: Any, lower: bool) -> None:
    """The normalizer's canonical text equals SiglipTokenizer.canonicalize_text of "▁" + the text (its
    "▁" made spaces) for every code point this Python's Unicode database assigns (lower-casing,
    punctuation, whitespace; one text, the characters separated by NUL, whitespace at both ends).
    Code points it leaves unassigned are left out: the tokenizers library's newer Unicode lower-cases
    some of them, which this Python cannot."""
    chars = [chr(c) for c in range(1, sys.maxunicode + 1) if unicodedata.category(chr(c)) not in ("Cn", "Cs")]
    text = " \t" + "\0".join(chars) + "\u3000 "
    reference.do_lower_case = lower
    try:
        want = reference.canonicalize_text("▁" + text.replace("▁", " "))
    finally:
        reference.do_lower_case = True
    got = normalizers.Sequence(canonicalize(lower)).normalize_str(text)
    first = next((i for i, (a, b) in enumerate(zip(got, want, strict=False)) if a != b), min(len(got), len(want)))
    assert got == want, f"differs at {first}: {got[first - 20 : first + 20]!r} != {want[first - 20 : first + 20]!r}"


@pytest.mark.parametrize("direction", ["right", "left"])
def test_cut_texts_keep_their_eos(folder: Path, reference: Any, direction: Literal["right", "left"]) -> None:
    """A text cut to n tokens keeps its eos last, as SiglipTokenizer(truncation=True, max_length=n)
    does, from either end; one whose cut ends at a literal </s> gets no second one, as there."""
    texts = [
        "A photo of a cat, a dog and two birds!",
        "Hello world: the engine encodes text quickly",
        "a cat</s> and a dog and two birds",  # the cut from the end ends at the </s>
        "A photo of a cat, a dog and two birds </s>",  # so does the one from the start
        "</s></s> a cat",
    ]
    got = [t.input_ids for t in TokenizerPool(folder).encode_batch(texts, truncate=8, direction=direction)]
    reference.truncation_side = direction
    try:
        want = reference(texts, truncation=True, max_length=8)["input_ids"]
    finally:
        reference.truncation_side = "right"
    assert got == want


@pytest.mark.parametrize("special", [True, False])
def test_tokenize_and_spans_have_the_reference_ids(folder: Path, reference: Any, special: bool) -> None:
    """/tokenize's ids and TEI's token spans, with special tokens or without, are SiglipTokenizer's
    for texts spelling out its special tokens: no </s> appended after a literal one."""
    pool = TokenizerPool(folder)
    texts = ["a cat </s>", "</s>", "<unk> a cat", "a </s> cat </s> ", "a cat"]
    want = [reference(text, add_special_tokens=special)["input_ids"] for text in texts]
    assert [pool.tokenize(text, special) for text in texts] == want
    spans = pool.spans(texts, special, 100, lambda size, what: None)
    assert [[span["id"] for span in text] for text in spans] == want


def test_decoded_ids_equal_siglip_tokenizers(folder: Path, reference: Any) -> None:
    """Ids decode to SiglipTokenizer.decode's text (special tokens skipped): the canonical text."""
    pool = TokenizerPool(folder)
    for text in TEXTS[:9]:
        ids = reference(text)["input_ids"]
        assert pool.decode(ids, skip_special_tokens=True) == reference.decode(ids, skip_special_tokens=True)


def test_spiece_model_reads_as_sentencepiece_reads_it(folder: Path) -> None:
    """Every piece, score and type, and the normalizer settings, as sentencepiece's own parser gives them."""
    import sentencepiece as spm
    from sentencepiece import sentencepiece_model_pb2

    model = read_spm(folder / "spiece.model")
    processor = spm.SentencePieceProcessor(model_file=str(folder / "spiece.model"))
    proto = sentencepiece_model_pb2.ModelProto.FromString((folder / "spiece.model").read_bytes())
    assert [p for p, _, _ in model.pieces] == [processor.id_to_piece(i) for i in range(len(proto.pieces))]
    assert [(s, int(t)) for _, s, t in model.pieces] == [(p.score, p.type) for p in proto.pieces]
    spec = proto.normalizer_spec
    assert (model.precompiled_charsmap, model.add_dummy_prefix, model.remove_extra_whitespaces) == (
        spec.precompiled_charsmap,
        spec.add_dummy_prefix,
        spec.remove_extra_whitespaces,
    )
    assert (model.unk_id, model.byte_fallback, model.model_type) == (2, False, 1)


def test_tokenizer_json_wins_where_both_are_present(tmp_path: Path, folder: Path) -> None:
    """A folder with tokenizer.json and spiece.model is tokenized by its tokenizer.json."""
    both = build_siglip(tmp_path / "siglip")
    shutil.copy(folder / "spiece.model", both / "spiece.model")
    want = Tokenizer.from_file(str(both / "tokenizer.json")).encode("Hello, World!").ids
    assert TokenizerPool(both).encode("Hello, World!").input_ids == want


def test_spiece_model_wins_for_siglip_tokenizer_beside_a_tokenizer_json(tmp_path: Path, folder: Path) -> None:
    """A folder naming SiglipTokenizer with both files is tokenized by its spiece.model, as
    AutoTokenizer's SiglipTokenizer (sentencepiece) reads it whatever tokenizer.json holds."""
    from transformers import AutoTokenizer

    both = shutil.copytree(folder, tmp_path / "siglip")
    shutil.copy(build_siglip(tmp_path / "other") / "tokenizer.json", both / "tokenizer.json")
    text = "Hello, World! the warm pool"
    assert TokenizerPool(both).encode(text).input_ids == AutoTokenizer.from_pretrained(both)(text)["input_ids"]


def test_a_folder_with_neither_file_is_a_model_error(tmp_path: Path) -> None:
    """No tokenizer.json and no spiece.model: a ModelError naming both."""
    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(ModelError, match=r"no tokenizer in .*tokenizer\.json.*spiece\.model"):
        TokenizerPool(tmp_path)


def test_spiece_model_keeping_extra_whitespace_is_a_model_error(tmp_path: Path, folder: Path) -> None:
    """A sentencepiece model that keeps runs of whitespace (remove_extra_whitespaces off) is refused
    by name: the parts after special tokens are told apart by how sentencepiece merges spaces."""
    (tmp_path / "spiece.model").write_bytes(
        train_spm(model_type="unigram", pad_id=0, eos_id=1, unk_id=2, bos_id=-1, remove_extra_whitespaces=False)
    )
    shutil.copy(folder / "tokenizer_config.json", tmp_path / "tokenizer_config.json")
    with pytest.raises(ModelError, match="remove extra whitespace"):
        TokenizerPool(tmp_path)


def test_spiece_model_of_another_tokenizer_is_a_model_error(tmp_path: Path, folder: Path) -> None:
    """spiece.model under another tokenizer class (T5's) is refused: only SigLIP's is built from it."""
    shutil.copy(folder / "spiece.model", tmp_path / "spiece.model")
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"tokenizer_class": "T5Tokenizer"}))
    with pytest.raises(ModelError, match="only SigLIP's"):
        TokenizerPool(tmp_path)


def test_a_corrupt_spiece_model_is_a_model_error(tmp_path: Path, folder: Path) -> None:
    """A spiece.model that is not a sentencepiece model is a ModelError naming the file, not a crash."""
    (tmp_path / "spiece.model").write_text("not a sentencepiece model")
    shutil.copy(folder / "tokenizer_config.json", tmp_path / "tokenizer_config.json")
    with pytest.raises(ModelError, match=r"spiece\.model"):
        TokenizerPool(tmp_path)
