"""The server's tokenizer (TokenizerPool) gives transformers' AutoTokenizer's ids, id for id, on a
generated corpus of edge cases, for every tokenizer family the tests build, texts and cross-encoder
pairs: transformers 5's classes rebuild their pipelines from the vocabulary (class_pipeline), and a
tokenizer.json as the hub ships it (xlm-roberta-hub) is not what they build."""

from __future__ import annotations

import itertools
import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from server.tokenizing.tokenizer import TokenizerPool
from tests.hub_tokenizers import xlm_roberta_hub
from tests.tiny_models import gemma_tokenizer, mpnet_tokenizer, qwen3_tokenizer, xlm_roberta_tokenizer
from tests.tiny_vision import clip_tokenizer, siglip_spm_tokenizer

SPACES = [" ", "  ", "\n", "\t", "\r\n", " \n\t ", "\u00a0", "\u2003", "\u3000", "\u202f", "\u2028", "\x85", "\u200b"]
SPECIALS = ["<s>", "</s>", "<pad>", "<unk>", "<mask>", "[CLS]", "[SEP]", "[MASK]", "[UNK]", "<|endoftext|>",
            "<|startoftext|>", "<|im_start|>", "<bos>", "<eos>"]  # fmt: skip
ODD = [
    "",
    "Hello World",
    "e\u0301cole cafe\u0301 \u0301 n\u0303",  # combining marks, one alone
    "zero\u200bwidth join\u200dx \ufeffbom \u200fmark",
    "ctrl\x00nul\x07bell\x1bescape\x1cfs\x7fdel",
    "🙂 👍🏽 👨\u200d👩\u200d👧 🇫🇷 ❤\ufe0f",
    "日本語中文字 東京タワー 한국어",
    "مرحبا بالعالم שלום עולם",
    "ﬁne ｆｕｌｌ ① Ⅻ ²",  # noqa: RUF001  (compatibility forms)
    "a" * 300,
    "warmpool" * 40,
    "日" * 120,
    "hello" + "!" * 150,
    "the <mask> pool",
    "hello <s> world</s>",
    "[CLS] the [SEP]",
    " the<mask> ",
    "<|im_start|>user\nhello<|im_end|>",
]
# Where a special token's spelling stands in a text ({} is the token): first, last, alone, twice,
# beside whitespace and punctuation (which some tokenizers remove after splitting the token out)
SPECIAL_PLACES = [
    "{}warm pool",
    "{} Warm pool",
    "warm pool{}",
    "warm pool {}",
    "warm pool {}  ",
    "{}{}",
    "{} {}",
    "warm {}{} pool",
    "warm{}pool{}",
    "{}! warm, pool.",
    "{} !warm",
    "warm, {}. pool",
    "warm!{}",
    "\t{}\n",
    "  {}\u00a0warm",
    "{}\x1c warm",
    "{} \u00a8warm \u00b4pool",  # spacing accents: NFKC makes them a space and a mark
    "warm{}\u0301pool",
    "\u2581{}\u2581warm\u2581",
]


def corpus() -> list[str]:
    """Each kind of space around, between and after words, each special token's spelling alone
    and inside text, and ODD's cases."""
    texts = [*SPACES, *ODD]
    for space in SPACES:
        texts += [f"{space}warm pool", f"warm pool{space}", f"warm{space}pool", f"{space}warm{space * 2}pool{space}"]
    for special in SPECIALS:
        texts += [special, f"the {special} pool", f"the{special}pool", f" {special} "]
        texts += [place.replace("{}", special) for place in SPECIAL_PLACES]
    return texts


def pairs() -> list[tuple[str, str]]:
    texts = ["warm pool", "Hello world\n", " the  engine ", "", "日本語", "the <mask> model", "a" * 120, "\t", "a </s>"]
    return list(itertools.permutations(texts, 2))


def _saved(make: Callable[[], Any]) -> Callable[[Path, Path], object]:
    return lambda dest, _: make().save_pretrained(dest)


def _wordpiece(dest: Path, model_dir: Path) -> None:
    for name in ("tokenizer.json", "tokenizer_config.json", "vocab.txt", "special_tokens_map.json", "config.json"):
        shutil.copy(model_dir / name, dest / name)


def _modernbert(dest: Path, model_dir: Path) -> None:
    """BERT's files under a ModernBERT config: AutoTokenizer takes the file as written (its
    tokenizer_config.json's BertTokenizer is overruled for that model type)."""
    _wordpiece(dest, model_dir)
    (dest / "config.json").write_text(json.dumps({"model_type": "modernbert"}))


def _stripped(fill: Callable[[Path, Path], object]) -> Callable[[Path, Path], object]:
    """A folder whose tokenizer.json has no normalizer, pre-tokenizer or post-processor: what the
    class builds is all there is to follow."""

    def write(dest: Path, model_dir: Path) -> None:
        fill(dest, model_dir)
        spec = json.loads((dest / "tokenizer.json").read_text())
        spec.update(normalizer=None, pre_tokenizer=None, post_processor=None)
        (dest / "tokenizer.json").write_text(json.dumps(spec, ensure_ascii=False))

    return write


def _gemma_ends(dest: Path, model_dir: Path) -> None:
    """Gemma without a post-processor in its tokenizer.json but with add_bos_token and add_eos_token
    in tokenizer_config.json: beside a tokenizer.json transformers ignores them (no <bos>, no <eos>)."""
    _stripped(_saved(gemma_tokenizer))(dest, model_dir)
    settings = json.loads((dest / "tokenizer_config.json").read_text())
    (dest / "tokenizer_config.json").write_text(json.dumps({**settings, "add_bos_token": True, "add_eos_token": True}))


FAMILIES: dict[str, Callable[[Path, Path], object]] = {
    "wordpiece": _wordpiece,
    "modernbert": _modernbert,
    "xlm-roberta-hub": lambda dest, _: xlm_roberta_hub(dest),
    "xlm-roberta": _saved(xlm_roberta_tokenizer),
    "mpnet": lambda dest, model_dir: mpnet_tokenizer(model_dir).save_pretrained(dest),
    "qwen3": _saved(qwen3_tokenizer),
    "gemma": _saved(gemma_tokenizer),
    "gemma-ends": _gemma_ends,
    "clip": _saved(lambda: clip_tokenizer(64)),
    "siglip-spm": lambda dest, _: siglip_spm_tokenizer(dest, 64),
}
FAMILIES.update(
    {
        f"{name}-stripped": _stripped(FAMILIES[name])
        for name in ("wordpiece", "modernbert", "mpnet", "qwen3", "gemma", "clip")
    }
)


@pytest.fixture(scope="module", params=sorted(FAMILIES))
def family(request: pytest.FixtureRequest, model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Any:
    from transformers import AutoTokenizer

    dest = tmp_path_factory.mktemp(request.param)
    FAMILIES[request.param](dest, model_dir)
    return request.param, TokenizerPool(dest), AutoTokenizer.from_pretrained(dest)


def _differences(family: str, cases: list[tuple[Any, list[int], list[int]]]) -> str:
    wrong = [(text, ours, theirs) for text, ours, theirs in cases if ours != theirs]
    lines = [f"{family}: {text!r}\n  warmpool     {ours}\n  transformers {theirs}" for text, ours, theirs in wrong]
    return f"{len(wrong)} of {len(cases)} differ:\n" + "\n".join(lines[:12])


def test_texts_have_the_reference_ids(family: Any) -> None:
    name, pool, reference = family
    texts = corpus()
    ours = [tokens.input_ids for tokens in pool.encode_batch(texts)]
    theirs = [reference(text)["input_ids"] for text in texts]
    assert ours == theirs, _differences(name, list(zip(texts, ours, theirs, strict=True)))


def test_pairs_have_the_reference_ids(family: Any) -> None:
    name, pool, reference = family
    both = pairs()
    ours = [tokens.input_ids for tokens in pool.encode_pairs(both)]
    # in lists, as a CrossEncoder passes them (a lone "" as the second text would be no pair at all)
    theirs = reference([a for a, _ in both], [b for _, b in both])["input_ids"]
    assert ours == theirs, _differences(name, list(zip(both, ours, theirs, strict=True)))
