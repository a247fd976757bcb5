"""A folder's tokenizer as transformers 5 builds it, which is not always its tokenizer.json as written.

A tokenizer class with an `__init__` of its own (XLMRobertaTokenizer, BertTokenizer, ...) takes only
the vocabulary (merges, the post-processor, sentencepiece's precompiled charsmap) from tokenizer.json
and builds its normalizer, pre-tokenizer and model settings itself; most then set their own
post-processor. Files written by older converters differ from those builds (XLM-R's keeps a
trailing "▁"), and sentence-transformers tokenizes as the class builds. Each such class's build is
replicated here with the `tokenizers` library (transformers is not imported), once per folder load.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tokenizers import Regex, Tokenizer, models, normalizers, pre_tokenizers, processors

from common.folderjson import ModelError, read_json

Settings = dict[str, Any]  # tokenizer_config.json over special_tokens_map.json: the class's arguments

# AutoTokenizer's class for a folder whose tokenizer_config.json names none, by config.json's model_type
# (only the model types of the classes rebuilt here)
CLASS_OF_MODEL_TYPE = {
    "xlm-roberta": "XLMRobertaTokenizer",
    "gte": "XLMRobertaTokenizer",
    "bert": "BertTokenizer",
    "nomic_bert": "BertTokenizer",
    "distilbert": "DistilBertTokenizer",
    "mpnet": "MPNetTokenizer",
    "qwen2": "Qwen2Tokenizer",
    "qwen3": "Qwen2Tokenizer",
    "gemma": "GemmaTokenizer",
    "gemma2": "GemmaTokenizer",
    "gemma3": "GemmaTokenizer",
    "gemma3_text": "GemmaTokenizer",
    "clip": "CLIPTokenizer",
}
# Model types whose class AutoTokenizer picks whatever tokenizer_config.json names (None: the file as
# written, TokenizersBackend), as its MODELS_WITH_INCORRECT_HUB_TOKENIZER_CLASS does
FORCED_CLASS = {"modernbert": None, "modernbert-decoder": None, "qwen2": "Qwen2Tokenizer"}

QWEN2_SPLIT = (
    r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"""
    r"""| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"""
)
CLIP_SPLIT = r"""<\|startoftext\|>|<\|endoftext\|>|'s|'t|'re|'ve|'m|'ll|'d|[\p{L}]+|[\p{N}]|[^\s\p{L}\p{N}]+"""


def tokenizer_class(folder: Path) -> str | None:
    """The tokenizer class AutoTokenizer instantiates for `folder` (without a "Fast" suffix); None
    where nothing names one."""
    config = read_json(folder / "config.json")
    model_type = config.get("model_type")
    if model_type in FORCED_CLASS:
        return FORCED_CLASS[model_type]
    named = read_json(folder / "tokenizer_config.json").get("tokenizer_class") or config.get("tokenizer_class")
    if isinstance(named, str):
        return named.removesuffix("Fast")
    return CLASS_OF_MODEL_TYPE.get(model_type) if isinstance(model_type, str) else None


def load_as_built(folder: Path, path: Path) -> Tokenizer:
    """`path` (the folder's tokenizer.json) as the folder's tokenizer class builds it; the file as
    written for a class that uses it so (or whose model is not the kind the class builds). Beside a
    tokenizer.json transformers ignores add_bos_token and add_eos_token, so the file's post-processor
    stands where the class sets none."""
    name = tokenizer_class(folder)
    build = BUILDS.get(name or "")
    try:
        if build is None:
            return Tokenizer.from_file(str(path))
        text = path.read_text(encoding="utf-8")
        spec = json.loads(text)
        if _model_kind(spec.get("model") or {}) != build.model:
            return Tokenizer.from_file(str(path))
        settings = {**read_json(folder / "special_tokens_map.json"), **read_json(folder / "tokenizer_config.json")}
        tokenizer = _with_model_settings(text, spec, build.model, build.model_settings(settings))
        build.pipeline(tokenizer, spec, settings)
        return tokenizer
    except ModelError:
        raise
    except Exception as exc:  # the tokenizers library raises bare Exceptions
        raise ModelError(f"cannot load tokenizer {path}: {exc}") from exc


def _with_model_settings(text: str, spec: dict[str, Any], kind: str, wanted: dict[str, Any]) -> Tokenizer:
    """The file's tokenizer with its `kind` of model's settings as the class passes them: set on the
    loaded model where tokenizers has setters (BPE, WordPiece); else the file written again with them
    (Unigram), which for a large vocabulary costs tens of milliseconds of JSON. Parsed once either way."""
    model = spec.get("model") or {}
    changed = {k: v for k, v in wanted.items() if k not in model or model[k] != v}
    if not all(hasattr(getattr(models, kind), k) for k in changed):
        return Tokenizer.from_str(json.dumps({**spec, "model": {**model, **wanted}}))
    tokenizer = Tokenizer.from_str(text)
    for key, value in changed.items():
        setattr(tokenizer.model, key, value)
    return tokenizer


@dataclass(frozen=True)
class Build:
    """What one class builds: the model kind it makes from the vocabulary, that model's settings, and
    the normalizer, pre-tokenizer and (some classes) post-processor it sets on the Tokenizer."""

    model: str
    model_settings: Callable[[Settings], dict[str, Any]]
    pipeline: Callable[[Tokenizer, dict[str, Any], Settings], None]


def _xlm_roberta(tok: Tokenizer, spec: dict[str, Any], settings: Settings) -> None:
    charsmap = _precompiled_charsmap(spec.get("normalizer"))
    tok.normalizer = None if charsmap is None else normalizers.Precompiled(charsmap)  # no " {2,}" Replace
    scheme = "always" if settings.get("add_prefix_space", True) else "never"
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.WhitespaceSplit(), pre_tokenizers.Metaspace(replacement="▁", prepend_scheme=scheme)]
    )
    bos, eos = _token(settings, "bos_token", "<s>"), _token(settings, "eos_token", "</s>")
    tok.post_processor = processors.TemplateProcessing(
        single=[bos, "$A", eos],
        pair=[bos, "$A", eos, eos, "$B", eos],
        special_tokens=[(bos, _id(tok, bos)), (eos, _id(tok, eos))],
    )


def _wordpiece_pipeline(tok: Tokenizer, settings: Settings) -> None:
    """BertTokenizer's and MPNetTokenizer's normalizer and pre-tokenizer, from their arguments."""
    tok.normalizer = normalizers.BertNormalizer(
        clean_text=True,
        handle_chinese_chars=bool(settings.get("tokenize_chinese_chars", True)),
        strip_accents=settings.get("strip_accents"),
        lowercase=bool(settings.get("do_lower_case", True)),
    )
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()


def _bert(tok: Tokenizer, spec: dict[str, Any], settings: Settings) -> None:
    _wordpiece_pipeline(tok, settings)
    cls, sep = _token(settings, "cls_token", "[CLS]"), _token(settings, "sep_token", "[SEP]")
    cls_id, sep_id = tok.token_to_id(cls), tok.token_to_id(sep)
    tok.post_processor = processors.TemplateProcessing(
        single=f"{cls}:0 $A:0 {sep}:0",
        pair=f"{cls}:0 $A:0 {sep}:0 $B:1 {sep}:1",
        special_tokens=[(cls, 2 if cls_id is None else cls_id), (sep, 3 if sep_id is None else sep_id)],
    )


def _mpnet(tok: Tokenizer, spec: dict[str, Any], settings: Settings) -> None:
    _wordpiece_pipeline(tok, settings)
    cls, sep = _token(settings, "cls_token", "<s>"), _token(settings, "sep_token", "</s>")
    cls_id, sep_id = tok.token_to_id(cls), tok.token_to_id(sep)
    tok.post_processor = processors.RobertaProcessing(
        (sep, 2 if sep_id is None else sep_id), (cls, 0 if cls_id is None else cls_id), True, False
    )


def _qwen2(tok: Tokenizer, spec: dict[str, Any], settings: Settings) -> None:
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(QWEN2_SPLIT), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=bool(settings.get("add_prefix_space") or False), use_regex=False),
        ]
    )


def _gemma(tok: Tokenizer, spec: dict[str, Any], settings: Settings) -> None:
    tok.normalizer = normalizers.Replace(" ", "▁")
    tok.pre_tokenizer = pre_tokenizers.Split(" ", behavior="merged_with_previous", invert=False)


def _clip(tok: Tokenizer, spec: dict[str, Any], settings: Settings) -> None:
    tok.normalizer = normalizers.Sequence(
        [normalizers.NFC(), normalizers.Replace(Regex(r"\s+"), " "), normalizers.Lowercase()]
    )
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(CLIP_SPLIT), behavior="removed", invert=True),
            pre_tokenizers.ByteLevel(add_prefix_space=False),
        ]
    )
    bos, eos = _token(settings, "bos_token", "<|startoftext|>"), _token(settings, "eos_token", "<|endoftext|>")
    tok.post_processor = processors.RobertaProcessing((eos, _id(tok, eos)), (bos, _id(tok, bos)), False, False)


def _wordpiece_model(settings: Settings) -> dict[str, Any]:
    return {
        "unk_token": _token(settings, "unk_token", "[UNK]"),
        "continuing_subword_prefix": "##",
        "max_input_chars_per_word": 100,
    }


def _bpe_model(**fields: Any) -> Callable[[Settings], dict[str, Any]]:
    """The BPE settings a class passes, over the defaults of tokenizers' BPE()."""
    base = {
        "dropout": None,
        "continuing_subword_prefix": None,
        "end_of_word_suffix": None,
        "fuse_unk": False,
        "byte_fallback": False,
        "ignore_merges": False,
    }
    return lambda settings: {**base, **{k: v(settings) if callable(v) else v for k, v in fields.items()}}


BUILDS: dict[str, Build] = {
    "XLMRobertaTokenizer": Build("Unigram", lambda _: {"unk_id": 3, "byte_fallback": False}, _xlm_roberta),
    "BertTokenizer": Build("WordPiece", _wordpiece_model, _bert),
    "DistilBertTokenizer": Build("WordPiece", _wordpiece_model, _bert),
    "MPNetTokenizer": Build("WordPiece", _wordpiece_model, _mpnet),
    "Qwen2Tokenizer": Build(
        "BPE", _bpe_model(unk_token=None, continuing_subword_prefix="", end_of_word_suffix=""), _qwen2
    ),
    "GemmaTokenizer": Build(
        "BPE",
        _bpe_model(unk_token=lambda s: _token(s, "unk_token", "<unk>"), fuse_unk=True, byte_fallback=True),
        _gemma,
    ),
    "CLIPTokenizer": Build(
        "BPE",
        _bpe_model(
            unk_token=lambda s: _token(s, "unk_token", "<|endoftext|>"),
            continuing_subword_prefix="",
            end_of_word_suffix="</w>",
        ),
        _clip,
    ),
}


def _model_kind(model: dict[str, Any]) -> str:
    """The model's type; older files leave it out (told apart by their fields)."""
    if "type" in model:
        return str(model["type"])
    if "merges" in model:
        return "BPE"
    return "Unigram" if "unk_id" in model else "WordPiece"


def _precompiled_charsmap(normalizer: Any) -> bytes | None:
    """sentencepiece's compiled rules in the file's normalizer, alone or in a Sequence."""
    steps = (
        normalizer.get("normalizers", [])
        if isinstance(normalizer, dict) and normalizer.get("type") == "Sequence"
        else [normalizer]
    )
    for step in steps:
        if isinstance(step, dict) and step.get("type") == "Precompiled" and step.get("precompiled_charsmap"):
            return base64.b64decode(step["precompiled_charsmap"])
    return None


def _token(settings: Settings, role: str, default: str) -> str:
    token = settings.get(role, default)
    return str(token.get("content")) if isinstance(token, dict) else str(token if token is not None else default)


def _id(tok: Tokenizer, token: str) -> int:
    found = tok.token_to_id(token)
    if found is None:
        raise ModelError(f"the tokenizer's special token {token!r} is not in its vocabulary")
    return found
