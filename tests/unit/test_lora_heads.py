"""Adapters of classifiers and rerankers with their own head (PEFT's modules_to_save, engine/layers/lora_heads.py):
each adapter's logits are transformers + PEFT's on the same base, a group mixing the base and adapters gives
each input its own model's logits, and a head the engine cannot serve is refused at load, saying why."""

from __future__ import annotations

import os

os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["HF_HUB_DISABLE_TELEMETRY"] = "1"
os.environ["DO_NOT_TRACK"] = "1"

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from common.folderjson import ModelError
from common.modelfolder import read_model_folder
from common.wire import Tokens
from engine.runtime.model import PoolingModel
from server.core.outputs import activate
from tests.lora_adapters import build_head_adapter, head_reference
from tests.qwen3_reference import model_card_scores
from tests.tiny_models import TinyFolders
from tests.unit.pools import pool as pool_of

QUERY = "what is the warm pool"
DOCUMENTS = ["", "a", "the warm pool keeps engines ready", "naïve café 日本語 🙂", "the warm pool engine " * 20]


def pairs(folder: Path, adapter: str = "") -> list[Tokens]:
    info = read_model_folder(folder)
    encoded = pool_of(folder, info.pair_template).encode_pairs(
        [(QUERY, d) for d in DOCUMENTS], truncate=info.max_model_len
    )
    return [t._replace(adapter=adapter) for t in encoded]


def reference(base: Path, adapter: Path | None, items: list[Tokens]) -> Any:
    types = [list(t.token_type_ids) for t in items] if items[0].token_type_ids is not None else None
    return head_reference(base, adapter, [list(t.input_ids) for t in items], types)


@pytest.mark.parametrize(
    ("base", "options"),
    [
        ("classifier", {}),  # BERT, 3 labels (build_classifier): PEFT saves the classifier, the pooler is the base's
        ("reranker", {}),  # BERT, 1 label (a CrossEncoder's)
        ("reranker", {"modules_to_save": ["pooler"]}),  # the pooler trained too: BERT's dense before tanh
        ("xlm-roberta-reranker", {}),  # RoBERTa's classification head saved whole: dense and out_proj
        # ModernBERT's classifier after its own head (dense, activation, norm), mean-pooled; the head trained too
        ("modernbert-reranker", {"target_modules": ["Wqkv", "Wo"], "modules_to_save": ["head"]}),
    ],
)
def test_an_adapter_with_its_own_head_answers_peft_s_logits(
    classifier_dir: Path, cross_encoder_dir: Path, tiny: TinyFolders, tmp_path: Path, base: str, options: dict[str, Any]
) -> None:
    """LoRA on the encoder of a task model (`bert.`, `roberta.` names) and the head it trained: logits
    within 1e-5 of transformers + PEFT's, and not the base's."""
    folder = {"classifier": classifier_dir, "reranker": cross_encoder_dir}.get(base) or tiny[base]
    adapter = build_head_adapter(tmp_path / "adapter", folder, seed=1, **options)
    model = PoolingModel(read_model_folder(folder), threads=1, adapters=[("tuned", adapter)])
    got = model.forward(pairs(folder, "tuned"))
    expected = reference(folder, adapter, pairs(folder))
    np.testing.assert_allclose(got, expected, atol=1e-5, rtol=0)
    assert np.abs(model.forward(pairs(folder)) - expected).max() > 1e-2  # the adapter matters


def test_a_group_mixing_the_base_and_two_head_adapters_gives_each_input_its_own_logits(
    classifier_dir: Path, tmp_path: Path
) -> None:
    """One forward over inputs of the base and of two adapters, interleaved: each input's logits are
    those it gets alone, the base's inputs through the base's head."""
    first = build_head_adapter(tmp_path / "first", classifier_dir, seed=1)
    second = build_head_adapter(tmp_path / "second", classifier_dir, seed=2, r=2)
    model = PoolingModel(read_model_folder(classifier_dir), threads=1, adapters=[("first", first), ("second", second)])
    names = ["", "first", "second", "first", ""]
    mixed = [t._replace(adapter=name) for t, name in zip(pairs(classifier_dir), names, strict=True)]
    got = model.forward(mixed)
    for row, item in enumerate(mixed):
        np.testing.assert_allclose(got[row], model.forward([item])[0], atol=1e-5, rtol=0)
    np.testing.assert_allclose(got[[0, 4]], reference(classifier_dir, None, [mixed[0], mixed[4]]), atol=1e-5, rtol=0)
    assert np.abs(got[1] - model.forward([mixed[1]._replace(adapter="second")])[0]).max() > 1e-3


def test_a_head_with_another_label_count_is_refused_naming_it(
    classifier_dir: Path, cross_encoder_dir: Path, tmp_path: Path
) -> None:
    """An adapter of a 3-label classifier on a 1-label reranker of the same shapes: its labels are not
    the base's, which the server answers with."""
    adapter = build_head_adapter(tmp_path / "adapter", classifier_dir, seed=1)
    refusal = r"adapter 'tuned'.*its classifier.weight is \[3, 32\], this model's \[1, 32\].*another label count"
    with pytest.raises(ModelError, match=refusal):
        PoolingModel(read_model_folder(cross_encoder_dir), threads=1, adapters=[("tuned", adapter)])


def test_a_trained_head_on_an_embedder_is_refused(classifier_dir: Path, tiny: TinyFolders, tmp_path: Path) -> None:
    adapter = build_head_adapter(tmp_path / "adapter", classifier_dir, seed=1)
    with pytest.raises(ModelError, match=r"adapter 'tuned'.*saves modules whole \(classifier: .*no classifier head"):
        PoolingModel(read_model_folder(tiny["bert"]), threads=1, adapters=[("tuned", adapter)])


def test_saved_modules_outside_the_head_are_refused_by_name(classifier_dir: Path, tmp_path: Path) -> None:
    """A module of the encoder saved whole (one row per token, not per input) is not served per input."""
    adapter = build_head_adapter(tmp_path / "adapter", classifier_dir, seed=1, modules_to_save=["word_embeddings"])
    with pytest.raises(ModelError, match=r"outside the model's head \(bert\.embeddings\.word_embeddings\)"):
        PoolingModel(read_model_folder(classifier_dir), threads=1, adapters=[("tuned", adapter)])


def test_a_yes_no_reranker_s_adapter_scores_as_peft(tiny: TinyFolders, tmp_path: Path) -> None:
    """Qwen3-Reranker's (a causal LM, PEFT's CAUSAL_LM task: `model.layers…` names): its score, the
    sigmoid of l_yes - l_no, is PEFT's P(yes) within 1e-5."""
    folder = tiny["qwen3-reranker"]
    targets = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
    adapter = build_head_adapter(tmp_path / "adapter", folder, seed=1, task_type="CAUSAL_LM", target_modules=targets)
    info = read_model_folder(folder)
    items = pool_of(folder, info.pair_template).encode_pairs([(QUERY, d) for d in DOCUMENTS], info.max_model_len)
    model = PoolingModel(info, threads=1, adapters=[("tuned", adapter)])
    got = activate(model.forward([t._replace(adapter="tuned") for t in items]))[:, 0]
    expected = model_card_scores(folder, [list(t.input_ids) for t in items], adapter)
    np.testing.assert_allclose(got, expected, atol=1e-5, rtol=0)
    assert np.abs(activate(model.forward(items))[:, 0] - expected).max() > 1e-3  # the adapter matters


def test_lora_on_the_head_is_refused_by_name(classifier_dir: Path, tmp_path: Path) -> None:
    """The head sees a row per input, not per token: LoRA there (BERT's pooler) is not served."""
    adapter = build_head_adapter(tmp_path / "adapter", classifier_dir, seed=1, target_modules=["query", "pooler.dense"])
    with pytest.raises(ModelError, match=r"LoRA on the head \(bert\.pooler\.dense\)"):
        PoolingModel(read_model_folder(classifier_dir), threads=1, adapters=[("tuned", adapter)])
