"""A model folder that cannot be served is always a ModelError whose message names the problem (and
the folder), never a crash of another type."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest

from common.folderjson import ModelError
from common.modelfolder import read_model_folder
from tests.model_folders import BERT_CONFIG, DENSE, MEAN_POOLING, POOLING, TRANSFORMER, make_folder


def test_a_missing_folder_is_a_model_error_naming_it(tmp_path: Path) -> None:
    """A path with no folder behind it is reported as not found."""
    missing = tmp_path / "nope"
    with pytest.raises(ModelError, match="not found") as caught:
        read_model_folder(missing)
    assert str(missing) in str(caught.value)


def test_a_folder_without_config_json_is_a_model_error(tmp_path: Path) -> None:
    """A folder with no config.json is not a model."""
    with pytest.raises(ModelError, match=r"no config\.json"):
        read_model_folder(tmp_path)


def test_a_config_json_that_is_not_json_is_a_model_error_naming_the_file(tmp_path: Path) -> None:
    """Unparseable config.json: the message says which file could not be read."""
    folder = make_folder(tmp_path)
    (folder / "config.json").write_text('{"architectures": ["BertModel"')
    with pytest.raises(ModelError, match=r"cannot read .*config\.json"):
        read_model_folder(folder)


def test_a_config_json_that_is_a_json_string_is_a_model_error(tmp_path: Path) -> None:
    """config.json must hold a JSON object; a string is refused as such."""
    with pytest.raises(ModelError, match=r"config\.json is not a JSON object"):
        read_model_folder(make_folder(tmp_path, "BertModel"))


def test_a_config_json_that_is_a_json_list_is_a_model_error(tmp_path: Path) -> None:
    """config.json must hold a JSON object; a list is refused too (modules.json may be one, config.json not)."""
    with pytest.raises(ModelError, match=r"config\.json"):
        read_model_folder(make_folder(tmp_path, [BERT_CONFIG]))


def test_a_config_json_nested_too_deep_to_parse_is_a_model_error(tmp_path: Path) -> None:
    """JSON nested past the parser's recursion limit is unreadable, not a crash of another type."""
    folder = make_folder(tmp_path)
    (folder / "config.json").write_text("[" * 100_000 + "]" * 100_000)
    with pytest.raises(ModelError, match=r"config\.json"):
        read_model_folder(folder)


@pytest.mark.parametrize(
    "changes",
    [
        {"max_position_embeddings": "lots"},
        {"hidden_size": [384]},
        {"hidden_size": math.inf},
        {"architectures": 5},
        {"architectures": [5]},
        {"architectures": "BertModel"},
        {"architectures": ["BertForSequenceClassification"], "id2label": [1, 2]},
        {"architectures": ["BertForSequenceClassification"], "id2label": {"first": "a"}},
    ],
    ids=[
        "positions-is-a-word",
        "hidden-size-is-a-list",
        "hidden-size-is-infinite",
        "architectures-is-a-number",
        "architecture-is-a-number",
        "architectures-is-a-string",
        "id2label-is-a-list",
        "id2label-key-is-not-a-number",
    ],
)
def test_config_values_of_the_wrong_type_are_a_model_error(tmp_path: Path, changes: dict[str, Any]) -> None:
    """A config.json of the wrong shape is refused as a ModelError naming the folder, never a crash."""
    folder = make_folder(tmp_path, {**BERT_CONFIG, **changes})
    with pytest.raises(ModelError) as caught:
        read_model_folder(folder)
    assert str(folder) in str(caught.value)


@pytest.mark.parametrize(
    "files",
    [
        {"modules": ["sentence_transformers.models.Transformer"]},
        {"modules": [{**POOLING, "path": 5}]},
        {"st_config": {"max_seq_length": "long"}},
    ],
    ids=["module-entry-is-a-string", "module-path-is-a-number", "max-seq-length-is-not-a-number"],
)
def test_other_config_files_of_the_wrong_shape_are_a_model_error(tmp_path: Path, files: dict[str, Any]) -> None:
    """The sentence-transformers files are checked as strictly as config.json."""
    folder = make_folder(tmp_path, **files)
    with pytest.raises(ModelError) as caught:
        read_model_folder(folder)
    assert str(folder) in str(caught.value)


def test_combined_pooling_modes_are_a_model_error_naming_them(tmp_path: Path) -> None:
    """Mean and CLS pooling at once cannot be served; the message lists the modes."""
    pooling = {**MEAN_POOLING, "pooling_mode_cls_token": True}
    folder = make_folder(tmp_path, modules=[TRANSFORMER, POOLING], pooling=pooling)
    with pytest.raises(ModelError, match="combined pooling modes") as caught:
        read_model_folder(folder)
    assert "mean" in str(caught.value) and "cls" in str(caught.value)


def test_an_unsupported_sentence_transformers_module_is_a_model_error_naming_it(tmp_path: Path) -> None:
    """A LayerNorm module after pooling changes the vectors; refusing beats serving wrong ones."""
    layer_norm = {**DENSE, "path": "2_LayerNorm", "type": "sentence_transformers.models.LayerNorm"}
    folder = make_folder(tmp_path, modules=[TRANSFORMER, POOLING, layer_norm], pooling=MEAN_POOLING)
    with pytest.raises(ModelError, match=r"sentence_transformers\.models\.LayerNorm is not supported"):
        read_model_folder(folder)
