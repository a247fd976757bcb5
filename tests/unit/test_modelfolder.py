"""Reading a model folder from its config files: kind, pooling, lengths, labels (what it refuses:
tests/unit/test_modelfolder_errors.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from common.folderjson import ModelError
from common.modelfiles import files_to_load
from common.modelfolder import read_model_folder
from common.st_modules import DenseLayer
from tests.model_folders import (
    BERT_CONFIG,
    DENSE,
    MEAN_POOLING,
    NORMALIZE,
    POOLING,
    TRANSFORMER,
    classifier_config,
    make_folder,
    write_json,
)

# The real model, read in place (config files only; the weights are not opened).


def test_minilm_is_a_normalized_mean_pooling_embedding_model(model_dir: Path) -> None:
    """all-MiniLM-L6-v2's modules say mean pooling then Normalize; it embeds into 384 dimensions."""
    folder = read_model_folder(model_dir)
    assert (folder.kind, folder.pooling, folder.normalize) == ("embedding", "mean", True)
    assert (folder.hidden_size, folder.vocab_size, folder.dimensions) == (384, 30522, 384)


def test_minilm_max_model_len_comes_from_its_sentence_bert_config(model_dir: Path) -> None:
    """Its sentence_bert_config.json says 256, below the 512 of its position embeddings."""
    assert read_model_folder(model_dir).max_model_len == 256


def test_minilm_is_served_natively(model_dir: Path) -> None:
    """A plain BertModel with model.safetensors runs on engine.families.bert, without transformers."""
    assert read_model_folder(model_dir).native is True


# Embedding folders


def test_mean_pooling_and_normalize_modules_are_read(tmp_path: Path) -> None:
    """Pooling's mean flag and a Normalize module give mean pooling with normalized vectors."""
    folder = make_folder(tmp_path, modules=[TRANSFORMER, POOLING, NORMALIZE], pooling=MEAN_POOLING)
    info = read_model_folder(folder)
    assert (info.kind, info.pooling, info.normalize) == ("embedding", "mean", True)


def test_without_a_normalize_module_vectors_are_not_normalized(tmp_path: Path) -> None:
    """Normalization comes only from a Normalize module."""
    folder = make_folder(tmp_path, modules=[TRANSFORMER, POOLING], pooling=MEAN_POOLING)
    assert read_model_folder(folder).normalize is False


def test_cls_pooling_is_read_from_pooling_mode_cls_token(tmp_path: Path) -> None:
    """pooling_mode_cls_token set (and mean unset) is CLS pooling."""
    pooling = {**MEAN_POOLING, "pooling_mode_mean_tokens": False, "pooling_mode_cls_token": True}
    folder = make_folder(tmp_path, modules=[TRANSFORMER, POOLING], pooling=pooling)
    assert read_model_folder(folder).pooling == "cls"


@pytest.mark.parametrize("mode", ["cls", "max", "lasttoken", "mean"])
def test_pooling_is_read_from_the_pooling_mode_string(tmp_path: Path, mode: str) -> None:
    """The string form {"pooling_mode": "cls"} names the pooling as well as the boolean flags do."""
    folder = make_folder(tmp_path, modules=[TRANSFORMER, POOLING], pooling={"pooling_mode": mode})
    assert read_model_folder(folder).pooling == mode


def test_a_plain_encoder_without_modules_gets_mean_pooling(tmp_path: Path) -> None:
    """No modules.json: mean pooling without normalization, as sentence-transformers would give it."""
    info = read_model_folder(make_folder(tmp_path))
    assert (info.kind, info.pooling, info.normalize) == ("embedding", "mean", False)


def test_an_embedding_model_has_hidden_size_dimensions(tmp_path: Path) -> None:
    """An embedding model's vectors are hidden_size long."""
    assert read_model_folder(make_folder(tmp_path, {**BERT_CONFIG, "hidden_size": 48})).dimensions == 48


# Lengths


def test_max_model_len_is_sentence_bert_config_max_seq_length_when_present(tmp_path: Path) -> None:
    """max_seq_length wins over both the position embeddings and the tokenizer's limit."""
    folder = make_folder(tmp_path, st_config={"max_seq_length": 128}, tokenizer={"model_max_length": 256})
    assert read_model_folder(folder).max_model_len == 128


@pytest.mark.parametrize(("positions", "tokenizer_max", "expected"), [(512, 256, 256), (512, 1024, 512)])
def test_max_model_len_is_the_smaller_of_positions_and_tokenizer_limit(
    tmp_path: Path, positions: int, tokenizer_max: int, expected: int
) -> None:
    """Without max_seq_length: min(max_position_embeddings, tokenizer model_max_length)."""
    config = {**BERT_CONFIG, "max_position_embeddings": positions}
    folder = make_folder(tmp_path, config, tokenizer={"model_max_length": tokenizer_max})
    assert read_model_folder(folder).max_model_len == expected


def test_max_model_len_ignores_the_tokenizers_no_limit_sentinel(tmp_path: Path) -> None:
    """transformers writes int(1e30) for "no limit"; the position embeddings then decide."""
    folder = make_folder(tmp_path, tokenizer={"model_max_length": int(1e30)})
    assert read_model_folder(folder).max_model_len == 512


def test_max_model_len_is_max_position_embeddings_without_tokenizer_config(tmp_path: Path) -> None:
    """With neither sentence_bert_config nor tokenizer_config, max_position_embeddings decides."""
    folder = make_folder(tmp_path, {**BERT_CONFIG, "max_position_embeddings": 128})
    assert read_model_folder(folder).max_model_len == 128


# Classifiers


def test_a_sequence_classifier_with_one_label_is_a_cross_encoder(tmp_path: Path) -> None:
    """One output label: a cross-encoder, scoring with one number."""
    info = read_model_folder(make_folder(tmp_path, classifier_config(["relevance"])))
    assert info.kind == "cross-encoder"
    assert (info.id2label, info.dimensions) == ({0: "relevance"}, 1)


def test_a_sequence_classifier_with_three_labels_is_a_classifier_with_its_labels(tmp_path: Path) -> None:
    """Several labels: classification, with id2label keyed by int in label order."""
    info = read_model_folder(make_folder(tmp_path, classifier_config(["negative", "neutral", "positive"])))
    assert info.kind == "classification"
    assert info.id2label == {0: "negative", 1: "neutral", 2: "positive"}
    assert info.dimensions == 3


def test_num_labels_one_without_id2label_is_a_cross_encoder_scoring_as_score(tmp_path: Path) -> None:
    """num_labels=1 alone makes a cross-encoder; its single output is named "score"."""
    config = {**BERT_CONFIG, "architectures": ["BertForSequenceClassification"], "num_labels": 1}
    info = read_model_folder(make_folder(tmp_path, config))
    assert (info.kind, info.id2label) == ("cross-encoder", {0: "score"})


# Native (engine.families.bert) or transformers


def test_a_plain_bert_with_safetensors_weights_is_native(tmp_path: Path) -> None:
    """BertModel, absolute positions, exact GELU and a model.safetensors: served without transformers."""
    assert read_model_folder(make_folder(tmp_path, weights=True)).native is True


def test_a_plain_bert_without_safetensors_weights_is_not_native(tmp_path: Path) -> None:
    """Without model.safetensors (say, only pytorch_model.bin) transformers has to load it."""
    assert read_model_folder(make_folder(tmp_path, weights=False)).native is False


def test_a_model_of_no_native_family_with_safetensors_weights_is_not_native(tmp_path: Path) -> None:
    """A model_type no native family covers needs transformers whatever its weights' format."""
    config = {**BERT_CONFIG, "model_type": "distilbert", "architectures": ["DistilBertModel"]}
    assert read_model_folder(make_folder(tmp_path, config, weights=True)).native is False


# Dense modules, pooling mode names, and the native families


DENSE_CONFIG = {
    "in_features": 32,
    "out_features": 16,
    "bias": False,
    "activation_function": "torch.nn.modules.activation.Tanh",
    "module_input_name": "sentence_embedding",
    "module_output_name": "sentence_embedding",
}


def dense_folder(tmp_path: Path, modules: list[Any], **changes: Any) -> Path:
    """A folder whose modules include a Dense module configured by DENSE_CONFIG plus `changes`."""
    folder = make_folder(tmp_path, modules=modules, pooling=MEAN_POOLING)
    write_json(folder / "2_Dense" / "config.json", {**DENSE_CONFIG, **changes})
    return folder


def test_a_dense_module_after_pooling_is_read_and_sets_the_dimensions(tmp_path: Path) -> None:
    """Dense's features, bias and activation are read; the vectors are its out_features long."""
    folder = dense_folder(tmp_path, [TRANSFORMER, POOLING, DENSE, {**NORMALIZE, "idx": 3}])
    info = read_model_folder(folder)
    assert info.dense == (DenseLayer(folder / "2_Dense", 32, 16, bias=False, activation="Tanh"),)
    assert (info.dimensions, info.normalize) == (16, True)


def test_a_dense_module_without_an_activation_gets_tanh_as_sentence_transformers_does(tmp_path: Path) -> None:
    """Dense's default activation_function is Tanh; use_residual is read too."""
    config = {k: v for k, v in DENSE_CONFIG.items() if k != "activation_function"}
    folder = make_folder(tmp_path, modules=[TRANSFORMER, POOLING, DENSE], pooling=MEAN_POOLING)
    write_json(folder / "2_Dense" / "config.json", {**config, "use_residual": True})
    (layer,) = read_model_folder(folder).dense
    assert (layer.activation, layer.residual) == ("Tanh", True)


@pytest.mark.parametrize(
    ("modules", "changes", "message"),
    [
        ([TRANSFORMER, POOLING, DENSE], {"activation_function": "my_package.Swoosh"}, "my_package.Swoosh"),
        ([TRANSFORMER, POOLING, DENSE], {"module_input_name": "token_embeddings"}, "token_embeddings"),
        ([TRANSFORMER, POOLING, DENSE], {"in_features": 48}, "48"),
        ([TRANSFORMER, DENSE, POOLING], {}, "between Pooling and Normalize"),
        ([TRANSFORMER, POOLING, NORMALIZE, DENSE], {}, "between Pooling and Normalize"),
    ],
    ids=["unknown-activation", "on-token-embeddings", "wrong-in-features", "before-pooling", "after-normalize"],
)
def test_a_dense_module_that_cannot_be_served_is_a_model_error_naming_why(
    tmp_path: Path, modules: list[Any], changes: dict[str, Any], message: str
) -> None:
    """Dense modules the engine would compute wrongly are refused, the message naming the cause."""
    with pytest.raises(ModelError, match=message):
        read_model_folder(dense_folder(tmp_path, modules, **changes))


def test_dense_weights_are_read_after_the_models_weights(tmp_path: Path) -> None:
    """files_to_load lists a module's weights (safetensors or pytorch_model.bin) after the model's."""
    folder = dense_folder(tmp_path, [TRANSFORMER, POOLING, DENSE])
    (folder / "model.safetensors").write_bytes(b"")
    (folder / "2_Dense" / "pytorch_model.bin").write_bytes(b"")
    files = [p.relative_to(folder).as_posix() for p in files_to_load(folder)]
    assert files[-2:] == ["model.safetensors", "2_Dense/pytorch_model.bin"]


@pytest.mark.parametrize(
    ("pooling", "expected"),
    [({"pooling_mode": ["cls"]}, "cls"), ({"pooling_mode_weightedmean_tokens": True}, "weightedmean")],
    ids=["list-of-one", "weightedmean-flag"],
)
def test_pooling_modes_in_newer_and_older_spellings(tmp_path: Path, pooling: dict[str, Any], expected: str) -> None:
    """A one-element pooling_mode list names that mode; the weightedmean flag names weightedmean."""
    folder = make_folder(tmp_path, modules=[TRANSFORMER, POOLING], pooling=pooling)
    assert read_model_folder(folder).pooling == expected


@pytest.mark.parametrize(
    "pooling", [{"pooling_mode": ["cls", "mean"]}, {"pooling_mode": "median"}], ids=["two", "unknown"]
)
def test_a_pooling_mode_list_of_two_or_an_unknown_mode_is_a_model_error(
    tmp_path: Path, pooling: dict[str, Any]
) -> None:
    """Concatenated or unknown pooling modes are refused rather than served as mean pooling."""
    with pytest.raises(ModelError, match="pooling mode"):
        read_model_folder(make_folder(tmp_path, modules=[TRANSFORMER, POOLING], pooling=pooling))


@pytest.mark.parametrize(
    ("model_type", "architecture"),
    [
        ("xlm-roberta", "XLMRobertaModel"),
        ("xlm-roberta", "XLMRobertaForSequenceClassification"),
        ("roberta", "RobertaForMaskedLM"),
        ("mpnet", "MPNetModel"),
        ("mpnet", "MPNetForSequenceClassification"),
        ("modernbert", "ModernBertModel"),
        ("modernbert", "ModernBertForSequenceClassification"),
    ],
)
def test_models_of_the_native_families_are_native(tmp_path: Path, model_type: str, architecture: str) -> None:
    """RoBERTa, XLM-RoBERTa, MPNet and ModernBERT encoders and sequence classifiers are served without
    transformers."""
    config = {**BERT_CONFIG, "model_type": model_type, "architectures": [architecture], "num_labels": 1}
    assert read_model_folder(make_folder(tmp_path, config, weights=True)).native is True


MODERNBERT = {"model_type": "modernbert", "architectures": ["ModernBertModel"]}


@pytest.mark.parametrize(
    "changes",
    [
        {"hidden_act": "quick_gelu"},
        {"position_embedding_type": "relative_key"},
        {"architectures": ["BertLMHeadModel"]},
        {**MODERNBERT, "hidden_activation": "quick_gelu"},
        {**MODERNBERT, "rope_parameters": {"full_attention": {"rope_type": "yarn", "factor": 2.0}}},
        {**MODERNBERT, "rope_scaling": {"rope_type": "linear", "factor": 2.0}},
    ],
    ids=["activation", "relative-positions", "architecture", "modernbert-activation", "yarn", "rope-scaling"],
)
def test_a_native_family_model_the_engine_does_not_compute_is_not_native(
    tmp_path: Path, changes: dict[str, Any]
) -> None:
    """An activation, a position scheme, a rotary scaling or a task model the native code lacks goes to
    transformers."""
    assert read_model_folder(make_folder(tmp_path, {**BERT_CONFIG, **changes}, weights=True)).native is False


@pytest.mark.parametrize("model_type", ["xlm-roberta", "roberta", "mpnet"])
def test_positions_after_the_padding_index_leave_two_rows_unused(tmp_path: Path, model_type: str) -> None:
    """RoBERTa-style positions start at padding index + 1: 514 position rows take 512 tokens."""
    config = {**BERT_CONFIG, "model_type": model_type, "max_position_embeddings": 514, "pad_token_id": 1}
    assert read_model_folder(make_folder(tmp_path, config)).max_model_len == 512
