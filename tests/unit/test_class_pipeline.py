"""A tokenizer class's model settings over its tokenizer.json's (server/tokenizing/class_pipeline.py):
set on the loaded model where the tokenizers library lets (WordPiece, BPE), the file written again
where it does not (Unigram). That the ids then equal transformers' own: test_tokenizer_corpus.py."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from server.tokenizing.class_pipeline import load_as_built
from tests.tiny_models import xlm_roberta_tokenizer


def edited(folder: Path, **model: object) -> Path:
    """`folder`'s tokenizer.json with these model fields."""
    path = folder / "tokenizer.json"
    spec = json.loads(path.read_text())
    spec["model"].update(model)
    path.write_text(json.dumps(spec))
    return path


def model_of(folder: Path) -> dict[str, object]:
    built: dict[str, object] = json.loads(load_as_built(folder, folder / "tokenizer.json").to_str())["model"]
    return built


def test_bert_s_wordpiece_settings_replace_the_file_s(model_dir: Path, tmp_path: Path) -> None:
    """BertTokenizer passes unk_token, "##" and 100 characters a word, whatever the file says."""
    for name in ("config.json", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        shutil.copy(model_dir / name, tmp_path / name)
    edited(tmp_path, max_input_chars_per_word=7, continuing_subword_prefix="@@")
    model = model_of(tmp_path)
    assert (model["max_input_chars_per_word"], model["continuing_subword_prefix"]) == (100, "##")
    assert model["unk_token"] == "[UNK]"


def test_xlm_roberta_s_unigram_settings_replace_the_file_s(tmp_path: Path) -> None:
    """XLMRobertaTokenizer's Unigram has <unk> at 3 and no byte fallback (no setters: the file is
    rewritten); a file already so is loaded as written."""
    xlm_roberta_tokenizer().save_pretrained(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "xlm-roberta"}))
    written = json.loads((tmp_path / "tokenizer.json").read_text())["model"]
    assert (written["unk_id"], written.get("byte_fallback", False)) == (3, False)
    assert {k: model_of(tmp_path)[k] for k in ("unk_id", "byte_fallback")} == {"unk_id": 3, "byte_fallback": False}
    edited(tmp_path, unk_id=0, byte_fallback=True)
    assert {k: model_of(tmp_path)[k] for k in ("unk_id", "byte_fallback")} == {"unk_id": 3, "byte_fallback": False}
