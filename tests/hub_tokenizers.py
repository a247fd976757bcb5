"""Tokenizer folders whose tokenizer.json is written as the hub ships it (older converters wrote
them), where that differs from what transformers 5 saves: its classes rebuild their pipeline from
the vocabulary, so a folder they saved themselves cannot show the difference."""

from __future__ import annotations

import base64
import json
import tempfile
from functools import cache
from pathlib import Path

from tests.tiny_models import xlm_roberta_tokenizer
from tests.tiny_vision import train_spm


@cache
def nmt_nfkc_charsmap() -> bytes:
    """sentencepiece's nmt_nfkc rules compiled (the normalizer XLM-R's sentencepiece model carries),
    taken from a tiny model trained here."""
    from server.tokenizing.spm_model import read_spm

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "spm.model"
        path.write_bytes(train_spm())
        return read_spm(path).precompiled_charsmap


def xlm_roberta_hub(dest: Path) -> Path:
    """xlm_roberta_tokenizer() in a folder whose tokenizer.json is laid out as xlm-roberta-base's,
    bge-m3's and multilingual-e5's are: sentencepiece's rules then runs of spaces made one as the
    normalizer, Metaspace alone (no WhitespaceSplit) as the pre-tokenizer, <mask> taking the space
    before it."""
    xlm_roberta_tokenizer().save_pretrained(dest)
    path = dest / "tokenizer.json"
    spec = json.loads(path.read_text())
    charsmap = base64.b64encode(nmt_nfkc_charsmap()).decode()
    spec["normalizer"] = {
        "type": "Sequence",
        "normalizers": [
            {"type": "Precompiled", "precompiled_charsmap": charsmap},
            {"type": "Replace", "pattern": {"Regex": " {2,}"}, "content": " "},
        ],
    }
    spec["pre_tokenizer"] = {"type": "Metaspace", "replacement": "▁", "add_prefix_space": True}
    spec["post_processor"] = {
        "type": "TemplateProcessing",
        "single": [_special("<s>"), _sequence("A"), _special("</s>")],
        "pair": [_special("<s>"), _sequence("A"), _special("</s>"), _special("</s>"), _sequence("B"), _special("</s>")],
        "special_tokens": {
            token: {"id": token, "ids": [spec["model"]["vocab"].index([token, 0.0])], "tokens": [token]}
            for token in ("<s>", "</s>")
        },
    }
    path.write_text(json.dumps(spec, ensure_ascii=False))
    return dest


def _special(token: str) -> dict[str, object]:
    return {"SpecialToken": {"id": token, "type_id": 0}}


def _sequence(name: str) -> dict[str, object]:
    return {"Sequence": {"id": name, "type_id": 0}}
